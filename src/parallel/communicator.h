// Communicator: the collectives that tensor and expert parallelism need, one object per rank of a
// group. Two backends implement it: the CPU one (parallel/cpu_communicator.h: one thread per rank in
// one process, shared-memory collectives, what CI tests sharding with) and NCCL
// (parallel/nccl_communicator.h: one GPU per rank, CUDA builds only); a third, for tests, runs several
// ranks on one GPU (parallel/device_communicator.h). Every call is collective: all
// ranks of the group make the same calls in the same order with the same counts (except where a
// count is per rank, as in all_to_all_v). Buffers are fp32 (host memory for the CPU backend, device
// memory for NCCL and the device backend, whose calls are enqueued on the rank's stream); an input
// may not overlap another rank's buffers.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace moefold {

class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This rank's index in [0, world_size()).
  virtual int rank() const = 0;
  /// Ranks in the group (>= 1).
  virtual int world_size() const = 0;
  /// "cpu", "nccl" or "device" (several ranks on one GPU: parallel/device_communicator.h).
  virtual std::string backend() const = 0;
  /// Device backends: the CUDA stream (a cudaStream_t) this rank's collectives are enqueued on and
  /// ordered with (nullptr: the legacy default stream). The CPU backend ignores it.
  virtual void set_stream(void* stream) { (void)stream; }

  /// In place: buf[i] = sum over ranks of buf[i] (fp32), n elements on every rank; every rank ends
  /// with the same bits (the CPU backend sums in rank order 0, 1, ..., N-1).
  virtual void all_reduce_sum(float* buf, int64_t n) = 0;
  /// out[r * n .. (r + 1) * n) = rank r's in[0 .. n): out holds world_size() * n elements.
  virtual void all_gather(const float* in, float* out, int64_t n) = 0;
  /// out[0 .. n) = sum over ranks of their in[rank() * n .. (rank() + 1) * n): in holds
  /// world_size() * n elements (the CPU backend sums in rank order).
  virtual void reduce_scatter_sum(const float* in, float* out, int64_t n) = 0;
  /// Variable all-to-all: this rank sends send[send_offsets[r] .. + send_counts[r]) to rank r and
  /// receives rank r's block for it at recv[recv_offsets[r] .. + recv_counts[r]). The spans have
  /// world_size() entries; recv_counts[r] must equal rank r's send_counts[rank()] (the CPU backend
  /// throws Error otherwise). Counts and offsets are in elements.
  virtual void all_to_all_v(const float* send, std::span<const int64_t> send_counts,
                            std::span<const int64_t> send_offsets, float* recv, std::span<const int64_t> recv_counts,
                            std::span<const int64_t> recv_offsets) = 0;
  /// Returns once every rank has called it.
  virtual void barrier() = 0;
};

}  // namespace moefold
