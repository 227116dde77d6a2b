#include "ops/cpu/norm.h"

#include <cmath>

#include "ops/cpu/linear.h"

namespace moefold::cpu {

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps, NormKind kind) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    float inv = float(1.0 / std::sqrt(ss / double(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * (kind == NormKind::ZeroCentred ? 1.0f + w[i] : w[i]);
  }
}

void gated_rms_norm(const float* x, const float* z, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    float inv = float(1.0 / std::sqrt(ss / double(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = w[i] * (xr[i] * inv) * silu(z[r * dim + i]);
  }
}

}  // namespace moefold::cpu
