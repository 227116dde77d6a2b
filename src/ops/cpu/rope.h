// Rotary position embedding, half-split (NeoX) pairing, partial or full. Source: transformers
// rotate_half / apply_rotary_pos_emb; Qwen3.5 partial_rotary_factor (only the first rotary_dim dims rotate).
#pragma once
#include <cstdint>
#include <vector>

namespace moefold::cpu {

/// inv_freq[j] = theta^(-2j / rotary_dim), j < rotary_dim / 2, computed in double. With
/// llama3_factor > 0 applies Llama-3 frequency scaling (low/high freq factors, original max positions).
std::vector<double> rope_inv_freq(int64_t rotary_dim, double theta, double llama3_factor = 0,
                                  double low_freq_factor = 1, double high_freq_factor = 4,
                                  int64_t original_max_positions = 8192);

/// In place on x[T, heads, head_dim]: for each row t at position positions[t] and each head, the pair
/// (x[j], x[j + rotary_dim/2]), j < rotary_dim/2, rotates by angle positions[t] * inv_freq[j]:
/// lo' = lo cos - hi sin, hi' = hi cos + lo sin. Dims >= rotary_dim pass through.
void apply_rope(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                const double* inv_freq);

}  // namespace moefold::cpu
