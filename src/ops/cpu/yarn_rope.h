// YaRN rotary embedding (DeepSeek-V3 / V3.2 rope_scaling {"type": "yarn"}) and the interleaved-pair
// rotation DeepSeek's MLA uses. Sources: the YaRN paper (arXiv 2309.00071) and transformers'
// _compute_yarn_parameters / yarn_get_mscale / apply_rotary_pos_emb_interleave.
#pragma once
#include <cstdint>
#include <vector>

namespace moefold::cpu {

/// YaRN settings as config.json's rope_scaling writes them.
struct YarnParams {
  double factor = 1;              ///< context extension factor s
  int64_t original_max = 4096;    ///< original_max_position_embeddings L
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0;  ///< 0 = absent
  bool truncate = true;           ///< floor/ceil the correction range (transformers' default)
};

/// m(s, k) = 0.1 k ln(s) + 1 for s > 1, else 1 (YaRN's attention temperature).
double yarn_mscale(double scale, double k);

/// inv_freq[j], j < rotary_dim / 2: blends theta^(-2j/d) (extrapolation, high frequencies) with
/// theta^(-2j/d) / s (interpolation, low frequencies) through a linear ramp between the dims where a
/// wavelength makes beta_fast and beta_slow turns over L positions. Computed in double.
std::vector<double> yarn_inv_freq(int64_t rotary_dim, double theta, const YarnParams& p);

/// The factor YaRN multiplies cos and sin by: mscale(s, mscale) / mscale(s, mscale_all_dim) when both
/// are given, else mscale(s, 1).
double yarn_attention_factor(const YarnParams& p);

/// The extra softmax scale of DeepSeek's MLA: mscale(s, mscale_all_dim)^2 when mscale_all_dim is set,
/// else 1 (multiplies 1 / sqrt(qk_head_dim)).
double yarn_softmax_scale_factor(const YarnParams& p);

/// In place on x[T, heads, head_dim]: the rotary_dim dims starting at `offset` rotate in interleaved
/// pairs (x[2j], x[2j+1]) by angle positions[t] * inv_freq[j]; cos and sin are scaled by
/// `attention_factor`: a' = (a cos - b sin) f, b' = (b cos + a sin) f. Other dims pass through.
void apply_rope_interleaved(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim,
                            int64_t offset, int64_t rotary_dim, const double* inv_freq, double attention_factor);

/// The half-split (NeoX) rotation of the first rotary_dim dims, (x[j], x[j + rotary_dim/2]), with cos
/// and sin scaled by `attention_factor` (DeepSeek-V3.2's lightning indexer). Shapes as above.
void apply_rope_half_scaled(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim,
                            int64_t rotary_dim, const double* inv_freq, double attention_factor);

}  // namespace moefold::cpu
