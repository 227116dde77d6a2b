// The profiler: while a profile window is open, every registered op or kernel (core/kernel_registry.h)
// records its start and end on one timeline, with the bytes it moved and the FLOPs it did, and the
// window's summary says where the wall time went: per kernel the time it alone covered, and the idle
// time no kernel covered, measured as the window's wall time minus the union of all intervals.
//
// Timers. CPU ops time themselves with steady_clock (HostScope). GPU launches record a CUDA event pair
// on their stream (src/ops/cuda/launch_scope.h); a DeviceTimer (installed with set_device_timer)
// resolves them after the step synchronises and places them on the same timeline: at begin_window()
// it records an anchor event on an idle device and pairs it with the host clock, so device and host
// intervals (the CPU sampler between GPU steps) share one time axis. Outside a window only the launch
// counts move (one relaxed atomic increment); the scopes read one relaxed atomic flag.
//
// Shares. Intervals can overlap (two streams, a host op beside a running kernel); each stretch of time
// is then split evenly among the intervals covering it ("exclusive" time), so the exclusive times of
// all kernels plus idle equal the wall time exactly and the shares sum to 100%. On one stream the
// kernel intervals do not overlap and exclusive time equals the kernel's own duration.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/kernel_registry.h"

namespace moefold::prof {

/// Work of one call: bytes read + written (compulsory traffic, counted once) and floating-point
/// operations (a multiply-add is 2). Zero where not meaningful (FLOPs of a copy).
struct Work {
  double bytes = 0;
  double flops = 0;
};

/// One call recorded in a window. Times are steady_clock nanoseconds (absolute, host clock).
struct TimedCall {
  int kernel = -1;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  Work work;
  bool timed = true;  ///< false: counted while a window was open but had no timer (never dropped)
};

namespace detail {
extern std::atomic<bool> g_timing;
}  // namespace detail

/// True while a profile window is open (relaxed read; the hot path's only cost besides the count).
inline bool timing_active() { return detail::g_timing.load(std::memory_order_relaxed); }

/// steady_clock now, in nanoseconds.
int64_t host_now_ns();

/// Records one call of `kernel` (thread-safe). Ignored when no window is open.
void record(const TimedCall& call);

/// A device's timer (the CUDA event timer is one). Its intervals are pending until flush().
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  /// Short name for reports, e.g. "cuda_events".
  virtual std::string name() const = 0;
  /// A window opens: waits for the device to be idle, then anchors device time to the host clock.
  /// Returns the steady_clock ns of the anchor (the window's start).
  virtual int64_t begin() = 0;
  /// Waits until every pending launch has completed (workload time: counted in the window).
  virtual void sync() = 0;
  /// Reads the completed launches' timestamps and records them with record() (the profiler's own
  /// time: flush() takes it out of the window's wall time). Called after sync().
  virtual void resolve() = 0;
  /// The window closes (after a resolve): stops timing launches.
  virtual void end() = 0;
};

/// Installs the device timer used by later windows (nullptr: host timing only). Not while a window is open.
void set_device_timer(DeviceTimer* timer);
DeviceTimer* device_timer();

/// Per-kernel result of one window.
struct KernelTime {
  int id = -1;
  std::string name;
  Category category = Category::Other;
  int64_t calls = 0;          ///< calls in the window (timed and untimed)
  int64_t untimed_calls = 0;  ///< of which had no timer (no time, but still counted)
  double time_s = 0;          ///< sum of the calls' own durations
  double exclusive_s = 0;     ///< the share of the wall time attributed to this kernel (see file comment)
  Work work;                  ///< summed over the timed calls
};

/// Summary of one window.
struct WindowProfile {
  std::string timer;  ///< "steady_clock" or "steady_clock+<device timer>"
  double wall_s = 0;  ///< window length, without the profiler's own flushes (excluded_s)
  double excluded_s = 0;  ///< time the profiler spent resolving timestamps inside the window
  double busy_s = 0;  ///< union of all intervals
  double idle_s = 0;  ///< wall_s - busy_s: time no kernel or op covered
  std::vector<KernelTime> kernels;  ///< kernels called in the window, by exclusive time, largest first
  /// Share of the wall time of kernel i / of idle; all shares sum to 1.
  double share(const KernelTime& k) const { return wall_s > 0 ? k.exclusive_s / wall_s : 0; }
  double idle_share() const { return wall_s > 0 ? idle_s / wall_s : 0; }
};

/// Opens a window (Error if one is open): clears the recording, anchors the timeline (device timer
/// first, if any) and starts timing every scope.
void begin_window();
/// Waits for the pending device launches and resolves their intervals. Call after each step to bound
/// memory. The resolving (not the waiting) is the profiler's own work: its time is taken out of the
/// window's wall time, so it never shows as idle.
void flush();
/// Flushes, closes the window and returns its summary. Error if no window is open.
WindowProfile end_window();
/// Closes an open window without a summary (after an error). No-op when none is open.
void abort_window();

/// Pure summary of calls over the window [window_start_ns, window_start_ns + span_ns] (intervals are
/// clipped to it), of which excluded_ns were the profiler's own flushes (no call runs then): exclusive
/// time per kernel, busy = union, wall = span - excluded, idle = wall - busy. Kernel names and
/// categories come from the registry. Exposed for tests.
WindowProfile summarise(int64_t window_start_ns, int64_t span_ns, const std::vector<TimedCall>& calls,
                        int64_t excluded_ns = 0);

/// Times one CPU op with steady_clock while a window is open, and always counts it. `work` is a Work or
/// a callable returning one (evaluated only when timing).
class HostScope {
 public:
  explicit HostScope(const Kernel& k) : HostScope(k, Work{}) {}
  template <class W>
  HostScope(const Kernel& k, W&& work) : id_(k.id()) {
    count(k);
    if (timing_active()) {
      if constexpr (std::is_invocable_v<W>) work_ = work();
      else work_ = Work(work);
      start_ = host_now_ns();
    }
  }
  ~HostScope() {
    if (start_ >= 0) record({id_, start_, host_now_ns(), work_, true});
  }
  HostScope(const HostScope&) = delete;
  HostScope& operator=(const HostScope&) = delete;

 private:
  int id_;
  int64_t start_ = -1;
  Work work_;
};

/// Host facts of the forward step being run, for GPU wrappers that see only device-side counts (the
/// live rows of a bucket, the per-sequence lengths) and need them to compute a call's Work. Set by
/// ModelRunner::step around Executor::forward; nullptr outside a step.
struct StepFacts {
  int64_t rows = 0;                          ///< live token rows of the step
  std::span<const int32_t> cu_seqlens;       ///< [S + 1] query-row offsets
  std::span<const int32_t> context_lens;     ///< [S] tokens cached before the step
};
const StepFacts* step_facts();

/// Makes `facts` the current step's facts on this thread for the scope's lifetime.
class StepFactsScope {
 public:
  explicit StepFactsScope(const StepFacts& facts);
  ~StepFactsScope();
  StepFactsScope(const StepFactsScope&) = delete;
  StepFactsScope& operator=(const StepFactsScope&) = delete;

 private:
  const StepFacts* prev_;
};

}  // namespace moefold::prof
