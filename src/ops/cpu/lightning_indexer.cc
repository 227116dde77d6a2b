#include "ops/cpu/lightning_indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace moefold::cpu {

void indexer_scores(const float* q, const float* w, const float* key_cache, const int32_t* block_table,
                    int64_t block_size, int64_t n_ctx, int64_t heads, int64_t head_dim, float* scores) {
  const float qk_scale = float(1.0 / std::sqrt(double(head_dim))), w_scale = float(1.0 / std::sqrt(double(heads)));
  for (int64_t j = 0; j < n_ctx; ++j) {
    const float* k = key_cache + (int64_t(block_table[j / block_size]) * block_size + j % block_size) * head_dim;
    float acc = 0;
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q + h * head_dim;
      float dot = 0;
      for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * k[d];
      acc += w[h] * w_scale * std::max(dot * qk_scale, 0.0f);
    }
    scores[j] = acc;
  }
}

int64_t indexer_topk(const float* scores, int64_t n, int64_t k, int32_t* out) {
  if (k >= n) {
    std::iota(out, out + n, 0);
    return n;
  }
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    const bool na = std::isnan(scores[a]), nb = std::isnan(scores[b]);
    if (na != nb) return nb;
    if (!na && scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  });
  std::sort(idx.begin(), idx.begin() + k);
  std::copy(idx.begin(), idx.begin() + k, out);
  return k;
}

}  // namespace moefold::cpu
