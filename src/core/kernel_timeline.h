// Where a step's GPU time goes, from the true start and end of every kernel it ran (records from a
// kernel tracer such as src/ops/cuda/kernel_trace.h), including the kernels inside CUDA graph replays.
//
// Exposed time. Kernels of one step are taken in order of their start. A frontier walks from the
// first kernel's start to the last kernel's end: a kernel that starts past the frontier leaves an idle
// gap; a kernel's exposed time is how far its end moves the frontier (0 when it ends under an earlier
// kernel). On one stream with Programmatic Dependent Launch a kernel starts early and waits for its
// predecessor, so its duration overstates its cost; its exposed time is what the step waited for it.
// Exposed times plus gaps equal the step's GPU span (first start to last end) exactly; the host's part
// of a step (before the first kernel and after the last: synchronisation, copies, host work) is the
// step's wall time minus its span.
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moefold::prof {

/// One kernel execution. Times in nanoseconds on the tracer's clock.
struct KernelRecord {
  std::string name;  ///< shortened by shorten_kernel_name
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  std::array<int32_t, 3> grid{1, 1, 1};
  std::array<int32_t, 3> block{1, 1, 1};
  int32_t registers = 0;     ///< per thread
  int32_t shared_bytes = 0;  ///< static + dynamic, per block
  bool in_graph = false;     ///< launched as a CUDA graph node
};

/// One CUDA runtime call on the host (cudaMemcpyAsync, cudaGraphLaunch, ...). Times as KernelRecord's.
struct HostCall {
  std::string name;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

/// A step's bracket on the tracer's clock: a kernel belongs to the step whose [begin, end) holds its start.
struct StepWindow {
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};

/// One kernel (name, grid and block) summed over the steps.
struct TimelineRow {
  std::string name;
  std::array<int32_t, 3> grid{1, 1, 1};
  std::array<int32_t, 3> block{1, 1, 1};
  int32_t registers = 0;
  int64_t calls = 0;
  double calls_per_step = 0;
  double mean_duration_us = 0;  ///< end - start, per call
  double exposed_us_per_step = 0;
  double exposed_share = 0;  ///< of the mean step wall time
};

/// One CUDA runtime function summed over the steps.
struct HostCallRow {
  std::string name;
  double calls_per_step = 0;
  double mean_us = 0;
  double us_per_step = 0;
};

/// Mean per step over the windows that held at least one kernel.
struct TimelineSummary {
  int steps = 0;
  double wall_us = 0;     ///< window end - begin
  double span_us = 0;     ///< first kernel start to last kernel end
  double gap_us = 0;      ///< idle time inside the span
  double host_us = 0;     ///< wall - span
  double kernels = 0;     ///< kernels per step
  double graph_kernels = 0;  ///< of them launched as graph nodes
  std::vector<TimelineRow> rows;  ///< by exposed time, largest first
  double host_call_us = 0;        ///< time inside CUDA runtime calls (when host calls were traced)
  std::vector<HostCallRow> host_calls;  ///< by time per step, largest first
};

/// Attributes each step's time to its kernels (header comment). Records outside every window are
/// ignored; windows must not overlap (moefold::Error otherwise) and may come in any order.
/// Host calls (may be empty) are attributed to the window holding their start, over the same steps.
/// Memory copies and sets traced on the GPU come as KernelRecords named "[memcpy HtoD]" and the like.
TimelineSummary summarize_timeline(std::span<const KernelRecord> records, std::span<const StepWindow> steps,
                                   std::span<const HostCall> host_calls = {});

/// A demangled kernel name made readable: no return type, no parameter list, no moefold / cuda /
/// anonymous namespace qualifiers; template arguments past `max_len` characters are cut ("..."). A name
/// that is not a demangled C++ signature (extern "C", a library's mangled name) is only cut to max_len.
std::string shorten_kernel_name(std::string_view demangled, size_t max_len = 72);

/// The summary as a table: the header lines, then the top `rows` kernels and one line for the rest.
std::string format_timeline(const TimelineSummary& s, int rows = 30);

/// The summary as JSON (every row).
nlohmann::json timeline_to_json(const TimelineSummary& s);

/// Every kernel of the first `max_steps` steps (by window order) as CSV, one line a kernel in order of
/// its start: step, index in the step, name, grid, start and end in us from the step's first kernel
/// start, the idle gap before it and its exposed time (the frontier walk of summarize_timeline). The
/// header line first. Names are quoted (they hold commas).
std::string timeline_csv(std::span<const KernelRecord> records, std::span<const StepWindow> steps, int max_steps);

}  // namespace moefold::prof
