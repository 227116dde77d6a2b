#include "ops/cpu/dsv4_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/cpu/linear.h"

namespace moefold::cpu {

void sink_attention(const float* q, const float* kv, int64_t n, const float* sinks, int64_t heads, int64_t D,
                    float scale, float* out) {
  std::vector<float> s(static_cast<size_t>(n));
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * D;
    float mx = sinks[h];
    for (int64_t j = 0; j < n; ++j) {
      float a = 0;
      for (int64_t d = 0; d < D; ++d) a += qh[d] * kv[j * D + d];
      s[size_t(j)] = a * scale;
      mx = std::max(mx, s[size_t(j)]);
    }
    float den = std::exp(sinks[h] - mx);
    for (int64_t j = 0; j < n; ++j) den += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
    float* o = out + h * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const float p = s[size_t(j)] / den;
      for (int64_t d = 0; d < D; ++d) o[d] += p * kv[j * D + d];
    }
  }
}

void softmax_pool(const float* value, int64_t vstride, const float* score, int64_t sstride, int64_t slots,
                  int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d) {
    float mx = -INFINITY;
    for (int64_t s = 0; s < slots; ++s) mx = std::max(mx, score[s * sstride + d]);
    float den = 0, num = 0;
    for (int64_t s = 0; s < slots; ++s) {
      const float e = std::exp(score[s * sstride + d] - mx);
      den += e;
      num += e * value[s * vstride + d];
    }
    out[d] = num / den;
  }
}

void indexer_scores(const float* q, const float* w, const float* k, int64_t n, int64_t heads, int64_t d,
                    float* score) {
  const float inv = 1.0f / std::sqrt(float(d));
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0;
    for (int64_t h = 0; h < heads; ++h) {
      float a = 0;
      for (int64_t c = 0; c < d; ++c) a += q[h * d + c] * k[j * d + c];
      acc += w[h] * std::max(a, 0.0f) * inv;
    }
    score[j] = acc;
  }
}

std::vector<int32_t> topk_indices(const float* score, int64_t n, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t m = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + m, idx.end(), [&](int32_t a, int32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  });
  idx.resize(size_t(m));
  return idx;
}

void grouped_linear(const float* x, const float* w, float* y, int64_t T, int64_t g, int64_t in, int64_t out) {
  std::vector<float> xi(static_cast<size_t>(T * in)), yi(static_cast<size_t>(T * out));
  for (int64_t i = 0; i < g; ++i) {
    for (int64_t t = 0; t < T; ++t) std::copy_n(x + (t * g + i) * in, in, xi.data() + t * in);
    linear(xi.data(), w + i * out * in, nullptr, yi.data(), T, in, out);
    for (int64_t t = 0; t < T; ++t) std::copy_n(yi.data() + t * out, out, y + (t * g + i) * out);
  }
}

}  // namespace moefold::cpu
