#include "ops/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace moefold::cpu {

namespace {
// Rows per sgemm call. OpenBLAS picks its kernels (and so a row's rounding) from the matrix shape, so
// every call gets the same shape: a row's result is then independent of how many rows come with it.
constexpr int64_t kRowTile = 16;
}  // namespace

void linear(const float* x, const float* w, const float* b, float* y, int64_t T, int64_t in, int64_t out) {
  if (T == 0 || out == 0) return;
  const int64_t full = (T / kRowTile) * kRowTile;
  for (int64_t r = 0; r < full; r += kRowTile)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(kRowTile), int(out), int(in), 1.0f, x + r * in, int(in), w,
                int(in), 0.0f, y + r * out, int(out));
  if (full < T) {  // the tail, zero-padded to a whole tile
    thread_local std::vector<float> xt, yt;
    xt.assign(size_t(kRowTile * in), 0.0f);
    yt.resize(size_t(kRowTile * out));
    std::copy(x + full * in, x + T * in, xt.begin());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(kRowTile), int(out), int(in), 1.0f, xt.data(), int(in), w,
                int(in), 0.0f, yt.data(), int(out));
    std::copy(yt.begin(), yt.begin() + (T - full) * out, y + full * out);
  }
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
