#include "ops/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <vector>

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

void paged_attention(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
                     int64_t start, int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t block_size, float scale, float* out) {
  const int64_t group = num_heads / num_kv_heads, kv_dim = num_kv_heads * head_dim;
  std::vector<float> scores(static_cast<size_t>(start + n));
  std::vector<const float*> krow(static_cast<size_t>(start + n)), vrow(static_cast<size_t>(start + n));
  for (int64_t p = 0; p < start + n; ++p) {
    int64_t slot = int64_t(block_table[p / block_size]) * block_size + p % block_size;
    krow[size_t(p)] = k_cache + slot * kv_dim;
    vrow[size_t(p)] = v_cache + slot * kv_dim;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ctx = start + i + 1;
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* qh = q + (i * num_heads + h) * head_dim;
      const int64_t g = h / group;
      float m = -INFINITY;
      for (int64_t j = 0; j < ctx; ++j) {
        const float* kh = krow[size_t(j)] + g * head_dim;
        float s = 0;
        for (int64_t d = 0; d < head_dim; ++d) s += qh[d] * kh[d];
        scores[size_t(j)] = s * scale;
        m = std::max(m, scores[size_t(j)]);
      }
      float denom = 0;
      for (int64_t j = 0; j < ctx; ++j) denom += (scores[size_t(j)] = std::exp(scores[size_t(j)] - m));
      float* o = out + (i * num_heads + h) * head_dim;
      std::memset(o, 0, size_t(head_dim) * 4);
      for (int64_t j = 0; j < ctx; ++j) {
        const float p = scores[size_t(j)] / denom;
        const float* vh = vrow[size_t(j)] + g * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vh[d];
      }
    }
  }
}

}  // namespace moefold::cpu
