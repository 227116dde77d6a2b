// Loading the DeepSeek-V3.2 attention weights (MLA projections and the lightning indexer) as released:
// model.layers.N.self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm,
// kv_b_proj, o_proj} and self_attn.indexer.{wq_b, wk, k_norm (weight, bias), weights_proj}.
#pragma once
#include <functional>
#include <string>

#include "io/model_config.h"
#include "models/weight_loader.h"
#include "models/weights.h"

namespace moefold {

/// Loads one layer's MLA + indexer weights from `src`; `prefix` is "model.layers.N.self_attn.".
/// Shapes come from cfg.mla; a missing or mis-shaped tensor throws (the source names it).
void load_mla_weights(const ModelConfig& cfg, WeightSource& src, const std::string& prefix, MlaWeights& m);

/// Calls fn on every non-empty Param of `m`.
void for_each_param(MlaWeights& m, const std::function<void(Param&)>& fn);

}  // namespace moefold
