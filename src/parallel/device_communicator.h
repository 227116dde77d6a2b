// The single-device test backend of Communicator (CUDA builds only): the ranks of one group are threads
// of one process on ONE GPU, each with its own CUDA stream (set_stream), so that the sharded CUDA path
// is testable where one GPU is lent (MOEFOLD_TP_SINGLE_DEVICE=1, parallel/tp_backend.h). Every
// collective is enqueued on the rank's stream without synchronising the host with the device: the
// ranks meet at a host barrier only to publish their buffers and CUDA events, and the streams are
// ordered by those events.
//  - all_reduce_sum: rank 0's stream waits for every rank's "ready" event, sums the ranks' buffers in
//    rank order 0, 1, ..., N-1 into a shared device buffer (cuda::rank_order_sum: the CPU backend's
//    bits), and every rank's stream copies the sum back after rank 0's "summed" event.
//  - all_gather, reduce_scatter_sum, all_to_all_v: each rank's stream reads the others' inputs after
//    their "ready" events; the inputs are reused only after every reader's "done" event.
// Not capturable in a CUDA graph (a graph per rank cannot wait on another rank's capture): an executor
// over this backend runs eagerly. abort() fails the pending and later collectives of every rank.
#pragma once
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace moefold {

/// The shared state of one group of `world_size` ranks on CUDA device `device`; make its
/// communicators with comm(rank). The group must outlive them, and each rank's thread must have
/// `device` current (cudaSetDevice) when it calls a collective.
class DeviceCommGroup {
 public:
  /// Throws Error unless 1 <= world_size <= 16 (cuda::kTpMaxRanks) or when CUDA fails.
  DeviceCommGroup(int world_size, int device);
  ~DeviceCommGroup();
  DeviceCommGroup(const DeviceCommGroup&) = delete;
  DeviceCommGroup& operator=(const DeviceCommGroup&) = delete;

  int world_size() const;
  /// The communicator of `rank` (owned by the group; the same object on every call).
  Communicator& comm(int rank);
  /// Fails every pending and later collective with Error naming `reason`, until reset().
  void abort(const std::string& reason);
  /// Clears an abort. Precondition: no rank is inside a collective.
  void reset();

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace moefold
