// The CPU executor of a tensor / expert parallel group: one rank per thread over the CPU communicator,
// each rank a Model over its shard (parallel/shard_weights.h) with its own KV cache and DeltaNet
// state pool (sharded with their heads), stepping together on every ForwardBatch. What the runner,
// the scheduler and the CLI see is one Executor, as with one device. The ranks share the machine's
// cores: while the executor lives, OpenBLAS runs max(1, its threads / ranks) threads per call (its
// threads: the cores or OPENBLAS_NUM_THREADS), so N ranks doing their own products never start N
// full pools.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "models/model.h"
#include "parallel/shard_plan.h"
#include "runtime/executor.h"

namespace moefold {

/// Shards `model` (the whole model, as load_model returns it; it may be freed once this returns) over
/// p.tensor_parallel_size ranks and returns their executor with `num_blocks` pages of `block_size`
/// tokens and `num_slots` state slots per rank. Throws Error (parallel/shard_plan.h) when the sizes do
/// not divide the model's heads, intermediate sizes or experts, or the KV cache and state do not fit
/// in memory.
/// `kv_dtype`: every rank's KV pages (--kv-cache-dtype; FP8 scales: the rank's KV heads' own).
std::unique_ptr<Executor> make_cpu_parallel_executor(const Model& model, const ParallelConfig& p, int32_t num_blocks,
                                                     int32_t block_size, int32_t num_slots,
                                                     KvCacheDtype kv_dtype = KvCacheDtype::Auto);

/// The (row, slot) pairs each rank's routed experts computed so far (expert load; empty when the
/// executor is not a CPU parallel one).
std::vector<int64_t> expert_load_per_rank(const Executor& e);

}  // namespace moefold
