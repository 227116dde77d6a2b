// The CPU backend of Communicator: the ranks are threads of one process and the collectives work in
// shared memory. Each collective publishes the ranks' pointers, then every rank computes its own
// result from all of them in a fixed order (sums in rank order 0, 1, ..., N-1, each element summed by
// exactly one rank and copied to the others), so results are bitwise the same whatever the thread
// timing and equal on every rank. Waiting is on a condition variable (no spinning: the CI machine has
// two cores for up to eight ranks).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace moefold {

/// The shared state of one group of `world_size` CPU ranks; make its communicators with comm(rank).
/// The group must outlive them. abort() makes every rank's current or next collective throw (a rank
/// that failed between collectives would otherwise leave the others waiting forever); reset() clears
/// that once no rank is inside a collective.
class CpuCommGroup {
 public:
  /// Throws Error unless 1 <= world_size <= 1024.
  explicit CpuCommGroup(int world_size);
  ~CpuCommGroup();
  CpuCommGroup(const CpuCommGroup&) = delete;
  CpuCommGroup& operator=(const CpuCommGroup&) = delete;

  int world_size() const { return world_; }
  /// The communicator of `rank` (owned by the group; the same object on every call).
  Communicator& comm(int rank);
  /// Fails every pending and later collective with Error naming `reason`, until reset().
  void abort(const std::string& reason);
  /// Clears an abort. Precondition: no rank is inside a collective.
  void reset();

  // Used by the ranks' communicators (parallel/cpu_communicator.cc).
  struct Slot {
    const float* in = nullptr;
    float* out = nullptr;
    const int64_t* counts = nullptr;
    const int64_t* offsets = nullptr;
  };
  /// Waits until all ranks reached this barrier; throws Error when the group is aborted.
  void arrive_and_wait();
  std::vector<Slot> slots;     ///< one per rank, published before a collective's first barrier
  std::vector<float> scratch;  ///< all_reduce's reduced values (resized by rank 0 before publishing)

 private:
  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace moefold
