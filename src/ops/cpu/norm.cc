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

namespace moefold::cpu {

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < dim; ++i) mean += xr[i];
    mean /= double(dim);
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const double inv = 1.0 / std::sqrt(var / double(dim) + double(eps));
    float* yr = y + r * dim;
    for (int64_t i = 0; i < dim; ++i) yr[i] = float((xr[i] - mean) * inv) * w[i] + (b ? b[i] : 0.0f);
  }
}

}  // namespace moefold::cpu
