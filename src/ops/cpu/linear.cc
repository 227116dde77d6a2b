#include "ops/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace moefold::cpu {

namespace {
// Rows per sgemm call. OpenBLAS picks its kernels (and so a row's rounding) from the matrix shape, so
// every call gets the same shape. Its Haswell / Zen kernels also round a row of the M operand by the
// row's position in the call, so X's tile is the B operand: y^T[out, 16] = W . X^T, a token a column,
// which single-threaded calls compute alike in every column (OpenBLAS's threads would split the
// call by its shape). So a row's bits are independent of T, of the other rows and of its place among them.
constexpr int64_t kRowTile = 16;

void openblas_single_thread_once() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}
}  // namespace

void linear(const float* x, const float* w, const float* b, float* y, int64_t T, int64_t in, int64_t out) {
  if (T == 0 || out == 0) return;
  openblas_single_thread_once();
  thread_local std::vector<float> xt, yt;
  yt.resize(size_t(out * kRowTile));
  for (int64_t r = 0; r < T; r += kRowTile) {
    const int64_t n = std::min(kRowTile, T - r);
    const float* xs = x + r * in;
    if (n < kRowTile) {  // the tail, zero-padded to a whole tile
      xt.assign(size_t(kRowTile * in), 0.0f);
      std::copy(xs, xs + n * in, xt.begin());
      xs = xt.data();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(out), int(kRowTile), int(in), 1.0f, w, int(in), xs, int(in),
                0.0f, yt.data(), int(kRowTile));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out; ++o) y[(r + t) * out + o] = yt[size_t(o * kRowTile + t)];
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
