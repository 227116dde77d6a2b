#include "ops/cpu/linear.h"

#include <cblas.h>

#include <cmath>

namespace moefold::cpu {

void linear(const float* x, const float* w, const float* b, float* y, int64_t T, int64_t in, int64_t out) {
  if (T == 0 || out == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(out), int(in), 1.0f, x, int(in), w, int(in), 0.0f,
              y, int(out));
  if (b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) y[t * out + o] += b[o];
}

float sigmoid(float x) { return x >= 0 ? 1.0f / (1.0f + std::exp(-x)) : std::exp(x) / (1.0f + std::exp(x)); }
float silu(float x) { return x * sigmoid(x); }

void swiglu(const float* gate_up, float* y, int64_t T, int64_t I) {
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * I;
    for (int64_t i = 0; i < I; ++i) y[t * I + i] = silu(g[i]) * g[I + i];
  }
}

}  // namespace moefold::cpu
