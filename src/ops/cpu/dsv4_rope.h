// DeepSeek-V4 RoPE (fp32/fp64 reference): interleaved pairs on the trailing rope_dim channels of each
// head ([nope | rope] layout), plain RoPE on sliding-window layers (rope_theta) and YaRN-scaled RoPE
// on compressed layers (compress_rope_theta, attention factor 1). Source: transformers 5.17
// modeling_deepseek_v4 (DeepseekV4RotaryEmbedding, apply_rotary_pos_emb) and _compute_yarn_parameters.
#pragma once
#include <cstdint>
#include <vector>

namespace moefold::cpu {

/// inv_freq[i] for i < rope_dim / 2: base^(-2i / rope_dim), blended with base^(-2i / rope_dim) / factor by
/// YaRN's linear ramp between the correction dims of beta_fast and beta_slow (truncated to integers)
/// when yarn_factor > 0. original_max: YaRN's original_max_position_embeddings.
std::vector<double> dsv4_inv_freq(double base, int64_t rope_dim, double yarn_factor, double beta_fast,
                                  double beta_slow, int64_t original_max);

/// Rotates the last rope_dim channels of each of `heads` rows of x [heads, dim] in place at position
/// `pos`: for pair i, (a, b) = (x[2i], x[2i+1]) -> (a c - b s, b c + a s), c = cos(pos inv_freq[i]),
/// s = sin(...) times `sign` (sign -1: the inverse rotation V4 applies to the attention output).
void dsv4_rope_inplace(float* x, int64_t heads, int64_t dim, int64_t rope_dim, const std::vector<double>& inv_freq,
                       int64_t pos, int sign = 1);

}  // namespace moefold::cpu
