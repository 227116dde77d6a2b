#include "parallel/cpu_communicator.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace moefold {

namespace {

/// [lo, hi) of rank r's share when n elements are split into world nearly equal contiguous parts.
std::pair<int64_t, int64_t> share(int64_t n, int world, int r) {
  const int64_t base = n / world, extra = n % world;
  const int64_t lo = r * base + std::min<int64_t>(r, extra);
  return {lo, lo + base + (r < extra ? 1 : 0)};
}

class CpuCommunicator : public Communicator {
 public:
  CpuCommunicator(CpuCommGroup& g, int rank) : g_(g), rank_(rank) {}

  /// Element i of every rank's posted input summed in rank order 0, 1, .., N-1: the one reduction
  /// order of the sums, so every collective gives the same bits whatever the thread timing.
  float sum_in_rank_order(int64_t i) const {
    float s = g_.slots[0].in[i];
    for (int r = 1; r < world_size(); ++r) s += g_.slots[size_t(r)].in[i];
    return s;
  }
  int rank() const override { return rank_; }
  int world_size() const override { return g_.world_size(); }
  std::string backend() const override { return "cpu"; }

  // Reduce-scatter into the group's scratch (each element summed by one rank, in rank order), then
  // every rank copies the whole result: the same bits everywhere, independent of timing.
  void all_reduce_sum(float* buf, int64_t n) override {
    const int N = world_size();
    if (N == 1 || n == 0) return barrier_if(N > 1);
    if (rank_ == 0) g_.scratch.resize(size_t(n));
    g_.slots[size_t(rank_)] = {buf, buf, nullptr, nullptr};
    g_.arrive_and_wait();
    const auto [lo, hi] = share(n, N, rank_);
    for (int64_t i = lo; i < hi; ++i) g_.scratch[size_t(i)] = sum_in_rank_order(i);
    g_.arrive_and_wait();  // every share reduced; nobody reads the inputs any more
    std::memcpy(buf, g_.scratch.data(), size_t(n) * sizeof(float));
    g_.arrive_and_wait();  // scratch free for the next collective
  }

  void all_gather(const float* in, float* out, int64_t n) override {
    const int N = world_size();
    if (N == 1) {
      if (n > 0 && in != out) std::memmove(out, in, size_t(n) * sizeof(float));
      return;
    }
    g_.slots[size_t(rank_)] = {in, out, nullptr, nullptr};
    g_.arrive_and_wait();
    for (int r = 0; r < N; ++r)
      if (n > 0) std::memcpy(out + int64_t(r) * n, g_.slots[size_t(r)].in, size_t(n) * sizeof(float));
    g_.arrive_and_wait();
  }

  void reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    const int N = world_size();
    if (N == 1) {
      if (n > 0 && in != out) std::memmove(out, in, size_t(n) * sizeof(float));
      return;
    }
    g_.slots[size_t(rank_)] = {in, out, nullptr, nullptr};
    g_.arrive_and_wait();
    const int64_t base = int64_t(rank_) * n;
    for (int64_t i = 0; i < n; ++i) out[i] = sum_in_rank_order(base + i);
    g_.arrive_and_wait();
  }

  void all_to_all_v(const float* send, std::span<const int64_t> send_counts, std::span<const int64_t> send_offsets,
                    float* recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_offsets) override {
    const int N = world_size();
    MOEFOLD_CHECK(send_counts.size() == size_t(N) && send_offsets.size() == size_t(N) &&
                      recv_counts.size() == size_t(N) && recv_offsets.size() == size_t(N),
                  "all_to_all_v: counts and offsets need {} entries (one per rank)", N);
    g_.slots[size_t(rank_)] = {send, recv, send_counts.data(), send_offsets.data()};
    g_.arrive_and_wait();
    std::string mismatch;
    for (int r = 0; r < N; ++r) {
      const CpuCommGroup::Slot& s = g_.slots[size_t(r)];
      const int64_t n = s.counts[rank_];
      if (n != recv_counts[size_t(r)]) {
        mismatch = fmt::format("all_to_all_v: rank {} sends {} elements to rank {}, which expects {}", r, n, rank_,
                               recv_counts[size_t(r)]);
        continue;
      }
      if (n > 0) std::memcpy(recv + recv_offsets[size_t(r)], s.in + s.offsets[rank_], size_t(n) * sizeof(float));
    }
    g_.arrive_and_wait();  // every rank has read what it needed from the send buffers
    if (!mismatch.empty()) fail("{}", mismatch);
  }

  void barrier() override { barrier_if(world_size() > 1); }

 private:
  void barrier_if(bool needed) {
    if (needed) g_.arrive_and_wait();
  }
  CpuCommGroup& g_;
  int rank_;
};

}  // namespace

CpuCommGroup::CpuCommGroup(int world_size) : world_(world_size) {
  MOEFOLD_CHECK(world_size >= 1 && world_size <= 1024, "CPU communicator: world size {} is outside [1, 1024]",
                world_size);
  slots.resize(size_t(world_size));
  for (int r = 0; r < world_size; ++r) comms_.push_back(std::make_unique<CpuCommunicator>(*this, r));
}

CpuCommGroup::~CpuCommGroup() = default;

Communicator& CpuCommGroup::comm(int rank) {
  MOEFOLD_CHECK(rank >= 0 && rank < world_, "CPU communicator: rank {} is outside [0, {})", rank, world_);
  return *comms_[size_t(rank)];
}

void CpuCommGroup::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) fail("communicator aborted: {}", abort_reason_);
  const uint64_t gen = generation_;
  if (++arrived_ == world_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) fail("communicator aborted: {}", abort_reason_);
}

void CpuCommGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) abort_reason_ = reason;
  aborted_ = true;
  cv_.notify_all();
}

void CpuCommGroup::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  abort_reason_.clear();
  arrived_ = 0;
  ++generation_;
}

}  // namespace moefold
