// How a model is split over the ranks of a tensor-parallel group (vLLM's --tensor-parallel-size,
// --enable-expert-parallel, --expert-parallel-size): which heads, channels, intermediate columns,
// experts and vocabulary rows each rank holds. The sharded forward is the same Model::forward over
// a rank's local config (heads / N, ...) and its weight slices, with the collectives of
// parallel/communicator.h at the block boundaries (docs/architecture.md, "Tensor and expert
// parallelism").
#pragma once
#include <cstdint>
#include <string>

#include "io/model_config.h"

namespace moefold {

class Communicator;

/// How routed tokens reach the ranks that hold their experts under expert parallelism.
enum class EpDispatch {
  Auto,       ///< AllToAll when the step has at least as many rows as ranks, else AllGather
  AllToAll,   ///< each rank sends its share of the rows to the experts' ranks and gets the outputs back
  AllGather,  ///< every rank runs its experts on all rows (already replicated); the block's all-reduce sums
};

/// The parallel layout the user asked for.
struct ParallelConfig {
  int tensor_parallel_size = 1;         ///< ranks of the group (-tp)
  bool enable_expert_parallel = false;  ///< routed experts sharded over the ranks instead of split
  /// Ranks the experts are spread over when expert parallel is on (0: all tensor_parallel_size); the
  /// tensor_parallel_size / expert_parallel_size ranks that share an expert split its intermediate.
  int expert_parallel_size = 0;
  EpDispatch dispatch = EpDispatch::Auto;
  /// The effective expert-parallel size: 1 when off.
  int ep_size() const;
};

/// Throws Error (naming the flag) for sizes < 1, an expert-parallel size that does not divide the
/// tensor-parallel size, or --expert-parallel-size without --enable-expert-parallel.
void validate(const ParallelConfig& p);

/// A contiguous range [begin, begin + count) of heads, channels, columns, experts or rows.
struct Range {
  int64_t begin = 0, count = 0;
};

/// What rank `rank` of a group holds. MLA (DeepSeek-V3.2) splits its query heads (q_b_proj, kv_b_proj
/// and o_proj per head) and replicates the low-rank projections, the latent cache and the lightning
/// indexer (every rank keeps the same keys). Grouped heads (query heads over KV heads, DeltaNet value heads
/// over key heads) split so that a rank's query heads read only its KV heads: KV (key) heads split
/// when the group size divides them and are replicated (one per rank) when the group size is a
/// multiple of them.
struct RankShard {
  int rank = 0, world = 1;
  Range q_heads, kv_heads;            ///< full attention (MLA: query heads; its latent cache is per token)
  Range k_heads, v_heads;             ///< Gated DeltaNet
  Range mlp_cols;                     ///< dense MLP intermediate columns
  Range shared_cols;                  ///< shared expert intermediate columns
  Range experts;                      ///< routed experts held (all of them without expert parallel)
  Range expert_cols;                  ///< intermediate columns of each held expert
  int ep_size = 1, ep_rank = 0;       ///< expert-parallel group of the rank
  int expert_tp_size = 1;             ///< ranks that split one expert (world / ep_size)
  Range vocab;                        ///< embedding / lm_head rows held
  int64_t vocab_shard = 0;            ///< rows per rank, padded (ceil(V / world)): the all-gather unit
  EpDispatch dispatch = EpDispatch::Auto;
};

/// The shard of `rank` for `cfg` under `p`. Throws Error naming the sizes when the tensor-parallel
/// size does not divide (or is not a multiple of) the heads, or does not divide the intermediate
/// sizes, or the expert-parallel size does not divide the routed experts; also for DeepSeek-V4 (its
/// own forward has no sharding).
RankShard plan_shard(const ModelConfig& cfg, const ParallelConfig& p, int rank);

/// cfg with the per-rank sizes of `s` (heads, intermediate sizes): what the rank's Model, KV cache
/// and state pool are built from. vocab_size and num_experts stay global (the router sees every
/// expert; the vocabulary split lives in the forward).
ModelConfig local_config(const ModelConfig& cfg, const RankShard& s);

/// The context a rank's Model::forward runs with (null comm: the unsharded forward, bit for bit).
struct ShardContext {
  Communicator* comm = nullptr;
  RankShard shard;
};

}  // namespace moefold
