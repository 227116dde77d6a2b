// Cuts one rank's weights out of the whole model's (parallel/shard_plan.h says which parts): the
// column-parallel projections (q/k/v, DeltaNet qkv/z/b/a and conv channels, gate|up of the MLP, the
// experts and the shared expert) keep their rank's rows, the row-parallel ones (o_proj, out_proj,
// down projections) their rank's columns, with a row-parallel bias on rank 0 only; the embedding and
// lm_head keep their rank's vocabulary rows; norms, the router and MLA attention are replicated.
// FP8 weights are sliced in their FP8 form too (core/fp8_block.h: a shard inside a shared 128-wide
// scale block takes that block's scale); the fp32 copy the CPU computes with is sliced exactly.
#pragma once
#include "models/weights.h"
#include "parallel/shard_plan.h"

namespace moefold {

/// Rank s.rank's part of `w`, the weights of `cfg` (the global config) as load_weights returns them
/// with host copies. Throws Error if a weight has no host copy (an unmaterialised dummy tensor).
ModelWeights shard_weights(const ModelConfig& cfg, const ModelWeights& w, const RankShard& s);

/// Pads every routed expert's intermediate (cfg.moe_intermediate_size, I) up to a multiple of
/// `multiple` with zero columns: gate and up rows [E, 2I, H] -> [E, 2Ip, H] (each half padded), down
/// [E, H, I] -> [E, H, Ip], and cfg.moe_intermediate_size = Ip. The padded columns' activations are
/// silu(0) * 0 = 0 and add exact zeros, so the function is unchanged (what the GPU's expert kernels,
/// which take multiples of 64, run a shard narrower than that with). Does nothing when I is 0 or
/// already a multiple. Throws Error if an expert weight has no host copy or is FP8 (not padded).
void pad_expert_columns(ModelConfig& cfg, ModelWeights& w, int64_t multiple);

}  // namespace moefold
