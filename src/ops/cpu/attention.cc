#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace moefold::cpu {

void kv_cache_write(const float* k, const float* v, float* k_cache, float* v_cache, const int32_t* block_table,
                    int64_t start, int64_t n, int64_t block_size, int64_t kv_dim) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t p = start + i;
    int64_t slot = int64_t(block_table[p / block_size]) * block_size + p % block_size;
    std::memcpy(k_cache + slot * kv_dim, k + i * kv_dim, size_t(kv_dim) * 4);
    std::memcpy(v_cache + slot * kv_dim, v + i * kv_dim, size_t(kv_dim) * 4);
  }
}

// Per KV head: gather the sequence's keys (transposed, [D, ctx]) and values ([ctx, D]) from its pages,
// then for each query row of each head of the group: scores s_j = scale * (q . k_j) for the causal keys,
// row softmax (fp32, max subtracted), o = sum_j p_j v_j. Every sum runs in a fixed order (over d for a
// score, over j for an output), so a row's bits do not depend on the chunk it is computed in (batch
// invariance: a prompt resumed from cached pages gives the bits of a cold prefill).
void paged_attention(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
                     int64_t start, int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t block_size, float scale, float* out, bool round_p_bf16) {
  const int64_t group = num_heads / num_kv_heads, kv_dim = num_kv_heads * head_dim, D = head_dim;
  const int64_t ctx = start + n;
  std::vector<float> Kt(static_cast<size_t>(ctx * D)), V(static_cast<size_t>(ctx * D)), S(static_cast<size_t>(ctx)),
      O(static_cast<size_t>(D));
  for (int64_t g = 0; g < num_kv_heads; ++g) {
    for (int64_t p = 0; p < ctx; ++p) {
      const int64_t slot = int64_t(block_table[p / block_size]) * block_size + p % block_size;
      const float* kp = k_cache + slot * kv_dim + g * D;
      for (int64_t d = 0; d < D; ++d) Kt[size_t(d * ctx + p)] = kp[d];
      std::memcpy(&V[size_t(p * D)], v_cache + slot * kv_dim + g * D, size_t(D) * 4);
    }
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const float* qi = q + (i * num_heads + h) * D;
        const int64_t len = start + i + 1;  // causal: keys 0 .. start + i
        float* row = S.data();
        std::fill(row, row + len, 0.0f);
        for (int64_t d = 0; d < D; ++d) {
          const float qd = qi[d];
          const float* kd = &Kt[size_t(d * ctx)];
          for (int64_t j = 0; j < len; ++j) row[j] += qd * kd[j];
        }
        for (int64_t j = 0; j < len; ++j) row[j] *= scale;
        const float m = *std::max_element(row, row + len);
        float denom = 0;
        for (int64_t j = 0; j < len; ++j) denom += (row[j] = std::exp(row[j] - m));
        const float inv = 1.0f / denom;
        std::fill(O.begin(), O.end(), 0.0f);
        for (int64_t j = 0; j < len; ++j) {
          const float pj = (round_p_bf16 ? bf16_to_f32(f32_to_bf16(row[j])) : row[j]) * inv;
          const float* vj = &V[size_t(j * D)];
          for (int64_t d = 0; d < D; ++d) O[size_t(d)] += pj * vj[d];
        }
        std::memcpy(out + (i * num_heads + h) * D, O.data(), size_t(D) * 4);
      }
  }
}

}  // namespace moefold::cpu
