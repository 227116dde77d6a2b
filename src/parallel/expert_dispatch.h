// Expert parallelism on the CPU: the routed experts of one rank, and how tokens reach them.
// Every rank holds the step's rows (they are replicated after the attention all-reduce) and the same
// routing decisions (the router is replicated). Two ways to run the experts (EpDispatch):
//  - AllToAll: rank r owns the rows of its even share [lo, hi) of the step; it sends each routed
//    (row, slot) pair to the ranks holding that expert (one per expert-TP split), they compute it and
//    send the outputs back, and r combines them in slot order. With one rank per expert the outputs
//    and the combine are bitwise those of the unsharded moe_experts.
//  - AllGather: every rank runs its experts on every row routed to them (the rows are already
//    gathered) and the block's all-reduce is the reduce step. No extra messages: cheaper for steps
//    of fewer rows than ranks, where an all-to-all would move mostly empty blocks.
// Either way out holds this rank's part; the caller's all-reduce over the ranks completes the sum.
#pragma once
#include <cstdint>

#include "parallel/communicator.h"
#include "parallel/shard_plan.h"

namespace moefold {

/// A rank's routed experts: `count` experts starting at global id `first`, fused gate|up
/// [count, 2I, H] and down [count, H, I] (I: this rank's intermediate columns of each).
struct LocalExperts {
  const float* gate_up = nullptr;
  const float* down = nullptr;
  int64_t first = 0, count = 0, hidden = 0, inter = 0;
  bool round_bf16 = false;  ///< the ideal bf16 chain (as cpu::moe_experts)
};

/// out[t, :] += this rank's share of sum_slots wts[t, s] * E_{ids[t, s]}(x[t, :]) for the step's T rows
/// (x, out [T, H]; ids, wts [T, k], the same on every rank), per s.dispatch (Auto: AllToAll when
/// T >= world, else AllGather). Collective over `comm`. Returns the (row, slot) pairs this rank's
/// experts computed (its expert load). Throws Error for an expert id outside [0, experts * ep_size).
int64_t expert_parallel_moe(Communicator& comm, const RankShard& s, const LocalExperts& ex, const float* x,
                            const int32_t* ids, const float* wts, int64_t T, int64_t k, float* out);

}  // namespace moefold
