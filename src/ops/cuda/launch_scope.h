// Every GPU launch of the CUDA backend goes through a LaunchScope: it counts the launch in the kernel
// registry (always) and, while a profile window is open and the CUDA event timer runs, records a CUDA
// event pair around it on its stream. The timer (cuda_event_timer(), a prof::DeviceTimer) resolves the
// pairs after the step synchronises and places them on the profile timeline (core/profiler.h).
//
//   const prof::Kernel kRmsNorm{"rms_norm_kernel", prof::Category::NormRope};   // namespace scope
//   ...
//   LaunchScope launch(kRmsNorm, stream, [&] { return prof::Work{bytes, 0}; });  // work: only when timing
//   rms_norm_kernel<<<grid, block, 0, stream>>>(...);
//
// Why CUDA events rather than CUPTI activity records: events need nothing beyond the CUDA runtime the
// backend links already (CUPTI is one more shared library to carry to the GPU machine), map one to one
// to registry entries, and on one stream add no serialisation that the stream does not already have.
// Their costs: a few hundred nanoseconds of host time per record, an event node between kernels on the
// device, and ~0.5 us timestamp resolution. CUPTI would give the true kernel start and end and would
// see the library kernels inside one cuBLASLt or CUB call separately; with events such a call is one
// interval under its registry entry. docs/profiling.md has the details.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <type_traits>

#include "core/profiler.h"

namespace moefold::cuda {

/// The CUDA event timer (one per process, for the current device). Install it with
/// prof::set_device_timer(cuda_event_timer()) before opening a window in which GPU launches should
/// be timed; without it they are counted as untimed calls.
prof::DeviceTimer* cuda_event_timer();

namespace detail {
/// Starts timing a launch on `stream` if the event timer runs (not during stream capture). Returns a
/// handle for end_launch, or -1 when the launch is not timed.
int64_t begin_launch(int kernel, cudaStream_t stream);
/// Ends the launch begun with `handle` (records its end event) with its work.
void end_launch(int64_t handle, cudaStream_t stream, const prof::Work& work, std::function<prof::Work()> deferred);
}  // namespace detail

/// Counts one launch of `k` and, while timing, brackets it with a CUDA event pair on `stream`.
/// `work`: a prof::Work or a callable returning one, evaluated only while a window is open.
class LaunchScope {
 public:
  LaunchScope(const prof::Kernel& k, cudaStream_t stream) : LaunchScope(k, stream, prof::Work{}) {}
  template <class W>
  LaunchScope(const prof::Kernel& k, cudaStream_t stream, W&& work) : stream_(stream) {
    prof::count(k);
    if (prof::timing_active()) {
      if constexpr (std::is_invocable_v<W>) work_ = work();
      else work_ = prof::Work(work);
      handle_ = detail::begin_launch(k.id(), stream);
      if (handle_ < 0) prof::record({k.id(), 0, 0, work_, false});
    }
  }
  ~LaunchScope() {
    if (handle_ >= 0) detail::end_launch(handle_, stream_, work_, std::move(deferred_));
  }
  /// Replaces the launch's work by f(), evaluated when the timer resolves the launch (after the device
  /// ran it): for work known only on the device, read through snapshot_device_ints.
  void defer_work(std::function<prof::Work()> f) {
    if (handle_ >= 0) deferred_ = std::move(f);
  }
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

 private:
  cudaStream_t stream_;
  int64_t handle_ = -1;
  prof::Work work_;
  std::function<prof::Work()> deferred_;
};

/// Rows whose work a launch does, for its prof::Work: all `max_rows` when `live_rows` (the device count)
/// is null; else the running step's live rows (prof::step_facts) capped at max_rows; else max_rows (an
/// upper bound: an op called outside a ModelRunner step with a device count below its capacity).
inline int64_t work_rows(int64_t max_rows, const void* live_rows) {
  if (!live_rows) return max_rows;
  const prof::StepFacts* f = prof::step_facts();
  return f && f->rows < max_rows ? f->rows : max_rows;
}

/// Sequences whose work a launch does: the running step's sequence count capped at max_seqs, else
/// max_seqs (an upper bound, as work_rows).
inline int64_t work_seqs(int64_t max_seqs) {
  const prof::StepFacts* f = prof::step_facts();
  return f && int64_t(f->context_lens.size()) < max_seqs ? int64_t(f->context_lens.size()) : max_seqs;
}

/// While the event timer runs: copies n int32 from device `src` to pinned host memory on `stream`
/// (a launch of registry entry `k`, so its cost shows in the table) and remembers it as the latest
/// snapshot of `src`. Returns nothing; latest_snapshot(src) returns the host copy, readable from a
/// deferred-work callable (valid until the timer's next flush). No-op when not timing.
void snapshot_device_ints(const prof::Kernel& k, const int32_t* src, int n, cudaStream_t stream);
/// The host copy of the latest snapshot of `src` taken since the last flush, or nullptr.
const int32_t* latest_snapshot(const int32_t* src);

}  // namespace moefold::cuda
