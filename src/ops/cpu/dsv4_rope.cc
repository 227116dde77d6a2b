#include "ops/cpu/dsv4_rope.h"

#include <algorithm>
#include <cmath>

namespace moefold::cpu {

std::vector<double> dsv4_inv_freq(double base, int64_t rope_dim, double yarn_factor, double beta_fast,
                                  double beta_slow, int64_t original_max) {
  const int64_t half = rope_dim / 2;
  // transformers computes inv_freq in fp32: round each term the same way so angles agree.
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(rope_dim);
    inv[size_t(i)] = double(1.0f / std::pow(float(base), e));
  }
  if (yarn_factor <= 0) return inv;
  auto corr_dim = [&](double rot) {
    return double(rope_dim) * std::log(double(original_max) / (rot * 2 * M_PI)) / (2 * std::log(base));
  };
  double lo = std::max(std::floor(corr_dim(beta_fast)), 0.0);
  double hi = std::min(std::ceil(corr_dim(beta_slow)), double(rope_dim - 1));
  if (lo == hi) hi += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const float pf = std::pow(float(base), float(2 * i) / float(rope_dim));
    const double extra = double(1.0f / pf), inter = double(1.0f / (float(yarn_factor) * pf));
    const double ramp = std::clamp((double(i) - lo) / (hi - lo), 0.0, 1.0);
    const double extra_w = 1.0 - ramp;
    inv[size_t(i)] = inter * (1 - extra_w) + extra * extra_w;
  }
  return inv;
}

void dsv4_rope_inplace(float* x, int64_t heads, int64_t dim, int64_t rope_dim, const std::vector<double>& inv_freq,
                       int64_t pos, int sign) {
  const int64_t half = rope_dim / 2, base = dim - rope_dim;
  for (int64_t i = 0; i < half; ++i) {
    const double ang = double(pos) * inv_freq[size_t(i)];
    const float c = float(std::cos(ang)), s = float(sign) * float(std::sin(ang));
    for (int64_t h = 0; h < heads; ++h) {
      float* p = x + h * dim + base + 2 * i;
      const float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = b * c + a * s;
    }
  }
}

}  // namespace moefold::cpu
