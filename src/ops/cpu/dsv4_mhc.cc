#include "ops/cpu/dsv4_mhc.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/linear.h"

namespace moefold::cpu {

namespace {

/// m [T, rows] = fn . (X / rms(X)) with the rms over all hc*H values of a token.
std::vector<float> mix_logits(const float* X, const float* fn, int64_t T, int64_t rows, int64_t width,
                              float norm_eps) {
  std::vector<float> flat(static_cast<size_t>(T * width)), m(static_cast<size_t>(T * rows));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X + t * width;
    double ss = 0;
    for (int64_t i = 0; i < width; ++i) ss += double(x[i]) * x[i];
    const float r = 1.0f / std::sqrt(float(ss / double(width)) + norm_eps);
    for (int64_t i = 0; i < width; ++i) flat[size_t(t * width + i)] = x[i] * r;
  }
  linear(flat.data(), fn, nullptr, m.data(), T, width, rows);
  return m;
}

float sigm(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void mhc_mix(const float* X, const float* fn, const float* base, const float* scale, int64_t T, int64_t hc,
             int64_t H, int64_t iters, float hc_eps, float norm_eps, float* pre, float* post, float* comb,
             float* collapsed) {
  const int64_t rows = (2 + hc) * hc;
  std::vector<float> m = mix_logits(X, fn, T, rows, hc * H, norm_eps);
  for (int64_t t = 0; t < T; ++t) {
    const float* mt = m.data() + t * rows;
    float* pr = pre + t * hc;
    float* po = post + t * hc;
    float* c = comb + t * hc * hc;
    for (int64_t j = 0; j < hc; ++j) {
      pr[j] = sigm(mt[j] * scale[0] + base[j]) + hc_eps;
      po[j] = 2.0f * sigm(mt[hc + j] * scale[1] + base[hc + j]);
    }
    for (int64_t j = 0; j < hc; ++j) {  // softmax over each row
      float* row = c + j * hc;
      float mx = -INFINITY;
      for (int64_t k = 0; k < hc; ++k) {
        row[k] = mt[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
        mx = std::max(mx, row[k]);
      }
      float s = 0;
      for (int64_t k = 0; k < hc; ++k) s += (row[k] = std::exp(row[k] - mx));
      for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / s + hc_eps;
    }
    auto norm_cols = [&] {
      for (int64_t k = 0; k < hc; ++k) {
        float s = 0;
        for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k];
        for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= s + hc_eps;
      }
    };
    auto norm_rows = [&] {
      for (int64_t j = 0; j < hc; ++j) {
        float s = 0;
        for (int64_t k = 0; k < hc; ++k) s += c[j * hc + k];
        for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= s + hc_eps;
      }
    };
    norm_cols();
    for (int64_t it = 1; it < iters; ++it) {
      norm_rows();
      norm_cols();
    }
    float* y = collapsed + t * H;
    const float* x = X + t * hc * H;
    for (int64_t d = 0; d < H; ++d) {
      float s = 0;
      for (int64_t j = 0; j < hc; ++j) s += pr[j] * x[j * H + d];
      y[d] = s;
    }
  }
}

void mhc_expand(float* X, const float* out, const float* post, const float* comb, int64_t T, int64_t hc, int64_t H) {
  std::vector<float> old(static_cast<size_t>(hc * H));
  for (int64_t t = 0; t < T; ++t) {
    float* x = X + t * hc * H;
    std::copy(x, x + hc * H, old.begin());
    const float* c = comb + t * hc * hc;
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t d = 0; d < H; ++d) {
        float s = post[t * hc + k] * out[t * H + d];
        for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k] * old[size_t(j * H + d)];
        x[k * H + d] = s;
      }
  }
}

void mhc_head(const float* X, const float* fn, const float* base, const float* scale, int64_t T, int64_t hc,
              int64_t H, float hc_eps, float norm_eps, float* y) {
  std::vector<float> m = mix_logits(X, fn, T, hc, hc * H, norm_eps);
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X + t * hc * H;
    for (int64_t d = 0; d < H; ++d) y[t * H + d] = 0;
    for (int64_t j = 0; j < hc; ++j) {
      const float p = sigm(m[size_t(t * hc + j)] * scale[0] + base[j]) + hc_eps;
      for (int64_t d = 0; d < H; ++d) y[t * H + d] += p * x[j * H + d];
    }
  }
}

}  // namespace moefold::cpu
