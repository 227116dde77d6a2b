// Grouped sigmoid routing with a correction bias (DeepSeek-V3 / V3.2 "noaux_tc"). Source: the
// DeepSeek-V3 report (auxiliary-loss-free load balancing) and transformers DeepseekV32TopkRouter.
//   s = sigmoid(logits)                      unbiased scores, fp32
//   c = s + bias                             scores for choice only
//   group score g = sum of the top two c in the group; keep the topk_group best groups
//   experts = top-k of c over the kept groups' experts
//   weights = s[experts] (/ (sum + 1e-20) when renormalised) * routed_scaling_factor
// The bias decides which experts are chosen, never how much they weigh.
#pragma once
#include <cstdint>

namespace moefold::cpu {

struct GroupedRouting {
  int64_t num_experts = 0, n_group = 1, topk_group = 1, top_k = 1;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
};

/// logits: [T, E] router logits (fp32); bias: [E] e_score_correction_bias (null = zeros).
/// ids: [T, k] chosen experts (distinct, in descending order of c, ties to the lower index); weights: [T, k].
/// Groups are ranked by the sum of their top two c (ties to the lower group index); NaN scores rank
/// below every number. replay ([T, k] or null): use these experts instead (weights from their s,
/// renormalised and scaled the same way); throws Error if a replayed id is outside [0, E) or the
/// settings are inconsistent (E % n_group, topk_group > n_group, k > kept experts, group size < 2).
void grouped_topk(const float* logits, const float* bias, int64_t T, const GroupedRouting& r, int32_t* ids,
                  float* weights, const int32_t* replay = nullptr);

}  // namespace moefold::cpu
