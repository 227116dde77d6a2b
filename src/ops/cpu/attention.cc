#include "ops/cpu/attention.h"

#include <cblas.h>

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

// Per KV head: gather the sequence's keys and values from its pages into contiguous [ctx, D] matrices,
// then for each query head of the group S = scale * Q K^T (sgemm), causal mask, row softmax (fp32,
// max subtracted), O = P V (sgemm).
void paged_attention(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
                     int64_t start, int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t block_size, float scale, float* out, bool round_p_bf16) {
  const int64_t group = num_heads / num_kv_heads, kv_dim = num_kv_heads * head_dim, D = head_dim;
  const int64_t ctx = start + n;
  std::vector<float> K(size_t(ctx * D)), V(size_t(ctx * D)), Q(size_t(n * D)), S(size_t(n * ctx)), O(size_t(n * D));
  for (int64_t g = 0; g < num_kv_heads; ++g) {
    for (int64_t p = 0; p < ctx; ++p) {
      const int64_t slot = int64_t(block_table[p / block_size]) * block_size + p % block_size;
      std::memcpy(&K[size_t(p * D)], k_cache + slot * kv_dim + g * D, size_t(D) * 4);
      std::memcpy(&V[size_t(p * D)], v_cache + slot * kv_dim + g * D, size_t(D) * 4);
    }
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(&Q[size_t(i * D)], q + (i * num_heads + h) * D, size_t(D) * 4);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(ctx), int(D), scale, Q.data(), int(D),
                  K.data(), int(D), 0.0f, S.data(), int(ctx));
      for (int64_t i = 0; i < n; ++i) {
        float* row = &S[size_t(i * ctx)];
        const int64_t len = start + i + 1;  // causal: keys 0 .. start + i
        const float m = *std::max_element(row, row + len);
        float denom = 0;
        for (int64_t j = 0; j < len; ++j) denom += (row[j] = std::exp(row[j] - m));
        const float inv = 1.0f / denom;
        for (int64_t j = 0; j < len; ++j) row[j] = (round_p_bf16 ? bf16_to_f32(f32_to_bf16(row[j])) : row[j]) * inv;
        std::fill(row + len, row + ctx, 0.0f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(D), int(ctx), 1.0f, S.data(), int(ctx),
                  V.data(), int(D), 0.0f, O.data(), int(D));
      for (int64_t i = 0; i < n; ++i) std::memcpy(out + (i * num_heads + h) * D, &O[size_t(i * D)], size_t(D) * 4);
    }
  }
}

}  // namespace moefold::cpu
