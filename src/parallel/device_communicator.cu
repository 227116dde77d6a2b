#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <condition_variable>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "ops/cuda/tp_ops.h"
#include "parallel/device_communicator.h"

namespace moefold {

namespace {

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  MOEFOLD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

}  // namespace

/// One rank's published pointers and events.
struct DeviceSlot {
  const float* in = nullptr;
  float* out = nullptr;
  const int64_t* counts = nullptr;
  const int64_t* offsets = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;
};

struct DeviceCommGroup::State {
  int world = 1, device = 0;
  std::vector<DeviceSlot> slots;
  cudaEvent_t summed = nullptr;
  float* scratch = nullptr;  // all_reduce's sum (rank 0 grows it between barriers)
  int64_t scratch_n = 0;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string abort_reason;
  std::vector<std::unique_ptr<Communicator>> comms;

  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu);
    if (aborted) fail("communicator aborted: {}", abort_reason);
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (generation == gen) fail("communicator aborted: {}", abort_reason);
  }
};

namespace {

class DeviceCommunicator : public Communicator {
 public:
  DeviceCommunicator(DeviceCommGroup::State& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return g_.world; }
  std::string backend() const override { return "device"; }
  void set_stream(void* s) override { me().stream = static_cast<cudaStream_t>(s); }

  void all_reduce_sum(float* buf, int64_t n) override {
    const int N = g_.world;
    if (N == 1 || n == 0) return;
    publish(buf, buf);
    g_.arrive_and_wait();  // every rank's buffer and ready event published
    if (rank_ == 0) {
      if (g_.scratch_n < n) {  // grown once to the largest block (a device-wide sync, outside steady state)
        MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
        if (g_.scratch) MOEFOLD_CUDA_CHECK(cudaFree(g_.scratch));
        g_.scratch = nullptr;
        MOEFOLD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g_.scratch), size_t(n) * sizeof(float)));
        g_.scratch_n = n;
      }
      cuda::RankInputs in;
      for (int r = 0; r < N; ++r) {
        MOEFOLD_CUDA_CHECK(cudaStreamWaitEvent(me().stream, g_.slots[size_t(r)].ready, 0));
        in.p[r] = g_.slots[size_t(r)].in;
      }
      cuda::rank_order_sum(in, N, g_.scratch, n, me().stream);
      MOEFOLD_CUDA_CHECK(cudaEventRecord(g_.summed, me().stream));
    }
    g_.arrive_and_wait();  // the sum is enqueued and its event recorded
    // Every rank copies the sum back. Rank 0 writes the scratch again only in the next all-reduce,
    // after every rank's next ready event, which its stream records after this copy.
    MOEFOLD_CUDA_CHECK(cudaStreamWaitEvent(me().stream, g_.summed, 0));
    MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(buf, g_.scratch, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, me().stream));
  }

  void all_gather(const float* in, float* out, int64_t n) override {
    const int N = g_.world;
    if (N == 1) {
      if (n > 0 && in != out)
        MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(out, in, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, me().stream));
      return;
    }
    publish(in, out);
    g_.arrive_and_wait();
    for (int r = 0; r < N; ++r) {
      wait_ready(r);
      if (n > 0)
        MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(out + int64_t(r) * n, g_.slots[size_t(r)].in, size_t(n) * sizeof(float),
                                           cudaMemcpyDeviceToDevice, me().stream));
    }
    finish();
  }

  void reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    const int N = g_.world;
    if (N == 1) {
      if (n > 0 && in != out)
        MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(out, in, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, me().stream));
      return;
    }
    publish(in, out);
    g_.arrive_and_wait();
    cuda::RankInputs ins;
    for (int r = 0; r < N; ++r) {
      wait_ready(r);
      ins.p[r] = g_.slots[size_t(r)].in + int64_t(rank_) * n;
    }
    cuda::rank_order_sum(ins, N, out, n, me().stream);
    finish();
  }

  void all_to_all_v(const float* send, std::span<const int64_t> send_counts, std::span<const int64_t> send_offsets,
                    float* recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_offsets) override {
    const int N = g_.world;
    MOEFOLD_CHECK(send_counts.size() == size_t(N) && send_offsets.size() == size_t(N) &&
                      recv_counts.size() == size_t(N) && recv_offsets.size() == size_t(N),
                  "all_to_all_v: counts and offsets need {} entries (one per rank)", N);
    publish(send, recv);
    me().counts = send_counts.data();
    me().offsets = send_offsets.data();
    g_.arrive_and_wait();
    std::string mismatch;
    for (int r = 0; r < N; ++r) {
      const DeviceSlot& s = g_.slots[size_t(r)];
      const int64_t n = s.counts[rank_];
      if (n != recv_counts[size_t(r)]) {
        mismatch = fmt::format("all_to_all_v: rank {} sends {} elements to rank {}, which expects {}", r, n, rank_,
                               recv_counts[size_t(r)]);
        continue;
      }
      wait_ready(r);
      if (n > 0)
        MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(recv + recv_offsets[size_t(r)], s.in + s.offsets[rank_],
                                           size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, me().stream));
    }
    finish();
    if (!mismatch.empty()) fail("{}", mismatch);
  }

  // The stream's work done, then every rank arrived (as the NCCL backend: a host-visible barrier).
  void barrier() override {
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(me().stream));
    if (g_.world > 1) g_.arrive_and_wait();
  }

 private:
  DeviceSlot& me() { return g_.slots[size_t(rank_)]; }
  void publish(const float* in, float* out) {
    me().in = in;
    me().out = out;
    MOEFOLD_CUDA_CHECK(cudaEventRecord(me().ready, me().stream));
  }
  void wait_ready(int r) { MOEFOLD_CUDA_CHECK(cudaStreamWaitEvent(me().stream, g_.slots[size_t(r)].ready, 0)); }
  // This rank's reads are enqueued: record them, and let no rank's stream reuse its input before every
  // reader's reads ran.
  void finish() {
    MOEFOLD_CUDA_CHECK(cudaEventRecord(me().done, me().stream));
    g_.arrive_and_wait();
    for (int r = 0; r < g_.world; ++r)
      if (r != rank_) MOEFOLD_CUDA_CHECK(cudaStreamWaitEvent(me().stream, g_.slots[size_t(r)].done, 0));
    g_.arrive_and_wait();  // nobody records its next done event before every rank waited on this one
  }

  DeviceCommGroup::State& g_;
  int rank_;
};

}  // namespace

DeviceCommGroup::DeviceCommGroup(int world_size, int device) : s_(std::make_unique<State>()) {
  MOEFOLD_CHECK(world_size >= 1 && world_size <= cuda::kTpMaxRanks,
                "single-device communicator: world size {} is outside [1, {}]", world_size, cuda::kTpMaxRanks);
  s_->world = world_size;
  s_->device = device;
  MOEFOLD_CUDA_CHECK(cudaSetDevice(device));
  s_->slots.resize(size_t(world_size));
  for (DeviceSlot& sl : s_->slots) {
    sl.ready = new_event();
    sl.done = new_event();
  }
  s_->summed = new_event();
  for (int r = 0; r < world_size; ++r) s_->comms.push_back(std::make_unique<DeviceCommunicator>(*s_, r));
}

DeviceCommGroup::~DeviceCommGroup() {
  cudaDeviceSynchronize();  // no enqueued copy may still read the scratch
  for (DeviceSlot& sl : s_->slots) {
    if (sl.ready) cudaEventDestroy(sl.ready);
    if (sl.done) cudaEventDestroy(sl.done);
  }
  if (s_->summed) cudaEventDestroy(s_->summed);
  if (s_->scratch) cudaFree(s_->scratch);
}

int DeviceCommGroup::world_size() const { return s_->world; }

Communicator& DeviceCommGroup::comm(int rank) {
  MOEFOLD_CHECK(rank >= 0 && rank < s_->world, "single-device communicator: rank {} is outside [0, {})", rank, s_->world);
  return *s_->comms[size_t(rank)];
}

void DeviceCommGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->aborted) s_->abort_reason = reason;
  s_->aborted = true;
  s_->cv.notify_all();
}

void DeviceCommGroup::reset() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->aborted = false;
  s_->abort_reason.clear();
  s_->arrived = 0;
  ++s_->generation;
}

}  // namespace moefold
