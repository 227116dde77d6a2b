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

}  // namespace moefold
