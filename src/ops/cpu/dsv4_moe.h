// DeepSeek-V4 MoE pieces (fp32 reference). Source: transformers 5.17 DeepseekV4TopKRouter,
// DeepseekV4HashRouter, DeepseekV4Experts._apply_gate, DeepseekV4MLP.
#pragma once
#include <cstdint>
#include <string>

namespace moefold::cpu {

/// Router for T tokens from logits [T, E]: scores = sqrt(softplus(logits)) ("sqrtsoftplus") or
/// sigmoid(logits) ("sigmoid"). Experts: the k largest of scores + bias (bias [E], may be null) or,
/// for a hash layer, hash_ids [T, k] (tid2eid[token]); weights = scores[chosen] /
/// (sum of them + 1e-20) * scale: the correction bias chooses, the unbiased scores weigh.
/// Writes idx [T, k] and weight [T, k]. Throws Error for a hash expert id outside [0, E).
void dsv4_route(const float* logits, const float* bias, const int32_t* hash_ids, int64_t T, int64_t E, int64_t k,
                float scale, const std::string& scoring, int32_t* idx, float* weight);

/// Clamped SwiGLU on [T, 2I] rows of [gate | up]: y = silu(min(gate, limit)) * clamp(up, -limit, limit)
/// (limit <= 0: no clamp).
void clamped_swiglu(const float* gate_up, float* y, int64_t T, int64_t I, float limit);

}  // namespace moefold::cpu
