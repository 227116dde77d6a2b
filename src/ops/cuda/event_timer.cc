// The CUDA event timer behind LaunchScope (contract: launch_scope.h). Pooled events, one pair per timed
// launch, resolved at flush (after the step synchronised): each pair's start is placed on the profile
// timeline relative to the first start of the flush (full float precision within a step), and that
// start relative to the window's anchor event, which begin() paired with the host clock.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch_scope.h"

namespace moefold::cuda {
namespace {

struct Pending {
  int kernel = -1;
  cudaEvent_t start = nullptr, end = nullptr;
  prof::Work work;
  std::function<prof::Work()> deferred;
  bool ended = false;
};

constexpr size_t kArenaChunk = size_t(1) << 20;  // pinned bytes per arena chunk
constexpr size_t kInitialEvents = 8192;          // two per launch

class EventTimer : public prof::DeviceTimer {
 public:
  std::string name() const override { return "cuda_events"; }

  int64_t begin() override {
    std::lock_guard<std::mutex> lock(mu_);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    if (!anchor_) MOEFOLD_CUDA_CHECK(cudaEventCreate(&anchor_));
    if (chunks_.empty()) add_chunk(kArenaChunk);
    // Events for a step of ~4,000 launches made before the window starts, so that a window's first
    // steps do not pay for cudaEventCreate (the pool grows further on demand).
    while (pool_.size() < kInitialEvents) {
      cudaEvent_t e;
      MOEFOLD_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    clear_locked();
    // The device is idle: the anchor event completes right after it is recorded. Its host time is taken
    // as the middle of [record, completion] (a few microseconds wide).
    const int64_t h0 = prof::host_now_ns();
    MOEFOLD_CUDA_CHECK(cudaEventRecord(anchor_, nullptr));
    MOEFOLD_CUDA_CHECK(cudaEventSynchronize(anchor_));
    const int64_t h1 = prof::host_now_ns();
    anchor_host_ns_ = h0 + (h1 - h0) / 2;
    running_ = true;
    return anchor_host_ns_;
  }

  void sync() override { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

  void resolve() override {
    std::vector<prof::TimedCall> calls;
    std::vector<std::function<prof::Work()>> deferred;  // evaluated outside the lock (they read pinned memory)
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!pending_.empty()) resolve_locked(calls, deferred);
      clear_locked();
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      if (deferred[i]) calls[i].work = deferred[i]();
      prof::record(calls[i]);
    }
  }

  void end() override {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }

  int64_t begin_launch(int kernel, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return -1;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      return -1;  // events inside a graph capture are graph nodes, not timestamps: count only
    }
    Pending p;
    p.kernel = kernel;
    p.start = event_locked();
    p.end = event_locked();
    MOEFOLD_CUDA_CHECK(cudaEventRecord(p.start, stream));
    pending_.push_back(std::move(p));
    return int64_t(pending_.size()) - 1;
  }

  void end_launch(int64_t handle, cudaStream_t stream, const prof::Work& work,
                  std::function<prof::Work()> deferred) {
    std::lock_guard<std::mutex> lock(mu_);
    if (handle < 0 || size_t(handle) >= pending_.size()) return;
    Pending& p = pending_[size_t(handle)];
    p.work = work;
    p.deferred = std::move(deferred);
    p.ended = cudaEventRecord(p.end, stream) == cudaSuccess;
    if (!p.ended) cudaGetLastError();
  }

  /// Pinned host bytes valid until the next flush (nullptr when not running).
  void* scratch(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return nullptr;
    bytes = (bytes + 63) & ~size_t(63);
    if (chunk_ < chunks_.size() && used_ + bytes > chunks_[chunk_].second) {
      ++chunk_;
      used_ = 0;
    }
    if (chunk_ >= chunks_.size()) add_chunk(std::max(bytes, kArenaChunk));
    void* p = static_cast<char*>(chunks_[chunk_].first) + used_;
    used_ += bytes;
    return p;
  }

  void remember_snapshot(const int32_t* src, const int32_t* host) {
    std::lock_guard<std::mutex> lock(mu_);
    snapshots_[src] = host;
  }

  const int32_t* latest_snapshot(const int32_t* src) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = snapshots_.find(src);
    return it == snapshots_.end() ? nullptr : it->second;
  }

 private:
  cudaEvent_t event_locked() {
    if (next_event_ == pool_.size()) {
      cudaEvent_t e;
      MOEFOLD_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    return pool_[next_event_++];
  }

  void add_chunk(size_t bytes) {
    void* p = nullptr;
    MOEFOLD_CUDA_CHECK(cudaMallocHost(&p, bytes));
    chunks_.push_back({p, bytes});
  }

  static double elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return double(ms);
  }

  void resolve_locked(std::vector<prof::TimedCall>& calls, std::vector<std::function<prof::Work()>>& deferred) {
    for (const Pending& p : pending_)  // complete after sync(); this only guards a resolve without one
      if (p.ended) MOEFOLD_CUDA_CHECK(cudaEventSynchronize(p.end));
    const Pending* first = nullptr;
    for (const Pending& p : pending_)
      if (p.ended) {
        first = &p;
        break;
      }
    const double base_ns = first ? double(anchor_host_ns_) + elapsed_ms(anchor_, first->start) * 1e6 : 0.0;
    calls.reserve(pending_.size());
    deferred.reserve(pending_.size());
    for (Pending& p : pending_) {
      deferred.push_back(std::move(p.deferred));
      if (!p.ended) {
        calls.push_back({p.kernel, 0, 0, p.work, false});
        continue;
      }
      const double s = base_ns + elapsed_ms(first->start, p.start) * 1e6;
      const double d = elapsed_ms(p.start, p.end) * 1e6;
      calls.push_back({p.kernel, int64_t(s), int64_t(s + d), p.work, true});
    }
  }

  void clear_locked() {
    pending_.clear();
    next_event_ = 0;
    chunk_ = 0;
    used_ = 0;
    snapshots_.clear();
  }

  std::mutex mu_;
  bool running_ = false;
  cudaEvent_t anchor_ = nullptr;
  int64_t anchor_host_ns_ = 0;
  std::vector<cudaEvent_t> pool_;
  size_t next_event_ = 0;
  std::vector<Pending> pending_;
  std::vector<std::pair<void*, size_t>> chunks_;
  size_t chunk_ = 0, used_ = 0;
  std::map<const int32_t*, const int32_t*> snapshots_;
};

EventTimer& timer() {
  static EventTimer* t = new EventTimer;  // never destroyed: CUDA may be torn down first
  return *t;
}

}  // namespace

prof::DeviceTimer* cuda_event_timer() { return &timer(); }

namespace detail {
int64_t begin_launch(int kernel, cudaStream_t stream) { return timer().begin_launch(kernel, stream); }
void end_launch(int64_t handle, cudaStream_t stream, const prof::Work& work, std::function<prof::Work()> deferred) {
  timer().end_launch(handle, stream, work, std::move(deferred));
}
}  // namespace detail

void snapshot_device_ints(const prof::Kernel& k, const int32_t* src, int n, cudaStream_t stream) {
  if (!prof::timing_active() || n <= 0) return;
  auto* host = static_cast<int32_t*>(timer().scratch(size_t(n) * sizeof(int32_t)));
  if (!host) return;
  {
    LaunchScope launch(k, stream, prof::Work{double(n) * 4, 0});
    MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(host, src, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  }
  timer().remember_snapshot(src, host);
}

const int32_t* latest_snapshot(const int32_t* src) { return timer().latest_snapshot(src); }

}  // namespace moefold::cuda
