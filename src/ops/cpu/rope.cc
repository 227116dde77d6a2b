#include "ops/cpu/rope.h"

#include <cmath>

namespace moefold::cpu {

std::vector<double> rope_inv_freq(int64_t rotary_dim, double theta, double llama3_factor, double low_freq_factor,
                                  double high_freq_factor, int64_t original_max_positions) {
  std::vector<double> f(static_cast<size_t>(rotary_dim / 2));
  for (size_t j = 0; j < f.size(); ++j) f[j] = 1.0 / std::pow(theta, double(2 * j) / double(rotary_dim));
  if (llama3_factor > 0) {  // transformers _compute_llama3_parameters
    double low_wavelen = double(original_max_positions) / low_freq_factor;
    double high_wavelen = double(original_max_positions) / high_freq_factor;
    for (auto& v : f) {
      double wavelen = 2 * M_PI / v;
      if (wavelen > low_wavelen) {
        v = v / llama3_factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (double(original_max_positions) / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
        v = (1 - smooth) * v / llama3_factor + smooth * v;
      }
    }
  }
  return f;
}

void apply_rope(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                const double* inv_freq) {
  const int64_t half = rotary_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      double a = double(positions[t]) * inv_freq[j];
      c[size_t(j)] = float(std::cos(a));
      s[size_t(j)] = float(std::sin(a));
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int64_t j = 0; j < half; ++j) {
        float lo = v[j], hi = v[j + half];
        v[j] = lo * c[size_t(j)] - hi * s[size_t(j)];
        v[j + half] = hi * c[size_t(j)] + lo * s[size_t(j)];
      }
    }
  }
}

}  // namespace moefold::cpu
