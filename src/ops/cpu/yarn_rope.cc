#include "ops/cpu/yarn_rope.h"

#include <algorithm>
#include <cmath>

namespace moefold::cpu {

double yarn_mscale(double scale, double k) { return scale <= 1 ? 1.0 : 0.1 * k * std::log(scale) + 1.0; }

std::vector<double> yarn_inv_freq(int64_t d, double theta, const YarnParams& p) {
  // The dim whose wavelength turns `rotations` times over L positions: d ln(L / (2 pi r)) / (2 ln theta).
  auto correction_dim = [&](double rotations) {
    return double(d) * std::log(double(p.original_max) / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  double low = correction_dim(p.beta_fast), high = correction_dim(p.beta_slow);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(d - 1));
  if (low == high) high += 0.001;  // no zero-width ramp
  std::vector<double> f(static_cast<size_t>(d / 2));
  for (size_t j = 0; j < f.size(); ++j) {
    const double extrap = 1.0 / std::pow(theta, double(2 * j) / double(d)), interp = extrap / p.factor;
    const double ramp = std::clamp((double(j) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // weight of the extrapolated (unscaled) frequency
    f[j] = interp * (1.0 - keep) + extrap * keep;
  }
  return f;
}

double yarn_attention_factor(const YarnParams& p) {
  if (p.mscale != 0 && p.mscale_all_dim != 0) return yarn_mscale(p.factor, p.mscale) / yarn_mscale(p.factor, p.mscale_all_dim);
  return yarn_mscale(p.factor, 1.0);
}

double yarn_softmax_scale_factor(const YarnParams& p) {
  if (p.mscale_all_dim == 0) return 1.0;
  const double m = yarn_mscale(p.factor, p.mscale_all_dim);
  return m * m;
}

namespace {

/// cos and sin of positions[t] * inv_freq[j] times f, j < half.
void angles(int32_t pos, const double* inv_freq, int64_t half, double f, std::vector<float>& c, std::vector<float>& s) {
  c.resize(size_t(half));
  s.resize(size_t(half));
  for (int64_t j = 0; j < half; ++j) {
    const double a = double(pos) * inv_freq[j];
    c[size_t(j)] = float(std::cos(a) * f);
    s[size_t(j)] = float(std::sin(a) * f);
  }
}

}  // namespace

void apply_rope_interleaved(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim,
                            int64_t offset, int64_t rotary_dim, const double* inv_freq, double attention_factor) {
  const int64_t half = rotary_dim / 2;
  std::vector<float> c, s;
  for (int64_t t = 0; t < T; ++t) {
    angles(positions[t], inv_freq, half, attention_factor, c, s);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim + offset;
      for (int64_t j = 0; j < half; ++j) {
        const float a = v[2 * j], b = v[2 * j + 1];
        v[2 * j] = a * c[size_t(j)] - b * s[size_t(j)];
        v[2 * j + 1] = b * c[size_t(j)] + a * s[size_t(j)];
      }
    }
  }
}

void apply_rope_half_scaled(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim,
                            int64_t rotary_dim, const double* inv_freq, double attention_factor) {
  const int64_t half = rotary_dim / 2;
  std::vector<float> c, s;
  for (int64_t t = 0; t < T; ++t) {
    angles(positions[t], inv_freq, half, attention_factor, c, s);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int64_t j = 0; j < half; ++j) {
        const float lo = v[j], hi = v[j + half];
        v[j] = lo * c[size_t(j)] - hi * s[size_t(j)];
        v[j + half] = hi * c[size_t(j)] + lo * s[size_t(j)];
      }
    }
  }
}

}  // namespace moefold::cpu
