#include "ops/cpu/fp8_ideal.h"

#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"

namespace moefold::cpu {

namespace {

/// Row r of w as fp64 values (exact: e4m3 times an fp32 scale).
void weight_row(const Fp8Weight& w, int64_t r, double* out) {
  const int64_t kb = w.col_blocks();
  for (int64_t c = 0; c < w.cols; ++c)
    out[c] = double(f8e4m3_to_f32(w.q[size_t(r * w.cols + c)])) * double(w.scale[size_t(r * kb + c / kFp8BlockSize)]);
}

std::vector<double> quantize_rows(const double* x, int64_t T, int64_t K) {
  std::vector<float> f(size_t(T * K));
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(x[i]);
  return fp8_quantize_activations(f.data(), T, K);
}

/// y[t, n] = sum_k w_rows(n)[k] * a[t, k] for rows r0 .. r0 + N - 1 of w.
void linear_rows(const double* a, int64_t T, const Fp8Weight& w, int64_t r0, int64_t N, double* y) {
  std::vector<double> row(size_t(w.cols));
  for (int64_t n = 0; n < N; ++n) {
    weight_row(w, r0 + n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      const double* at = a + t * w.cols;
      for (int64_t k = 0; k < w.cols; ++k) s += row[size_t(k)] * at[k];
      y[t * N + n] = s;
    }
  }
}

}  // namespace

std::vector<double> fp8_quantize_activations(const float* x, int64_t T, int64_t K) {
  std::vector<double> out(size_t(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b0 = 0; b0 < K; b0 += kFp8BlockSize) {
      const int64_t b1 = std::min(K, b0 + kFp8BlockSize);
      float amax = 0;
      for (int64_t k = b0; k < b1; ++k) amax = std::max(amax, std::fabs(x[t * K + k]));
      const float s = amax > 0 ? amax / kFp8E4m3Max : 1.0f;
      for (int64_t k = b0; k < b1; ++k)
        out[size_t(t * K + k)] = double(f8e4m3_to_f32(f32_to_f8e4m3(x[t * K + k] / s))) * double(s);
    }
  return out;
}

std::vector<double> fp8_linear_ideal(const float* x, int64_t T, const Fp8Weight& w, bool act_quant) {
  std::vector<double> a;
  if (act_quant) {
    a = fp8_quantize_activations(x, T, w.cols);
  } else {
    a.assign(x, x + T * w.cols);
  }
  std::vector<double> y(size_t(T * w.rows));
  // Parallel over output columns in chunks: each chunk writes its own columns of y.
  const int64_t chunk = 64;
  parallel_for((w.rows + chunk - 1) / chunk, [&](int64_t lo, int64_t hi) {
    std::vector<double> part;
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t n0 = c * chunk, N = std::min(chunk, w.rows - n0);
      part.assign(size_t(T * N), 0.0);
      linear_rows(a.data(), T, w, n0, N, part.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) y[size_t(t * w.rows + n0 + n)] = part[size_t(t * N + n)];
    }
  }, 1);
  return y;
}

MoeIdealStages moe_fp8_ideal(const float* x, int64_t T, const int32_t* ids, const float* weights, int64_t k,
                             const Fp8Weight& gate_up, const Fp8Weight& down, int64_t E, int64_t H, int64_t I,
                             bool act_quant) {
  MOEFOLD_CHECK(gate_up.rows == E * 2 * I && gate_up.cols == H && down.rows == E * H && down.cols == I,
                "moe_fp8_ideal: weights [{}, {}] / [{}, {}] do not match E={} H={} I={}", gate_up.rows, gate_up.cols,
                down.rows, down.cols, E, H, I);
  for (int64_t i = 0; i < T * k; ++i)
    MOEFOLD_CHECK(ids[i] >= 0 && ids[i] < E, "moe_fp8_ideal: expert id {} outside [0, {})", ids[i], E);
  MoeIdealStages st;
  st.act.assign(size_t(T * k * I), 0.0);
  st.y.assign(size_t(T * k * H), 0.0);
  st.out.assign(size_t(T * H), 0.0);
  std::vector<double> a = act_quant ? fp8_quantize_activations(x, T, H) : std::vector<double>(x, x + T * H);
  parallel_for(T * k, [&](int64_t lo, int64_t hi) {
    std::vector<double> gu(size_t(2 * I)), yy(size_t(H));
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t t = p / k, e = ids[p];
      linear_rows(a.data() + t * H, 1, gate_up, e * 2 * I, 2 * I, gu.data());
      double* act = st.act.data() + p * I;
      for (int64_t i = 0; i < I; ++i) {
        const double g = gu[size_t(i)], u = gu[size_t(I + i)];
        act[i] = g / (1.0 + std::exp(-g)) * u;
      }
      const std::vector<double> aq = act_quant ? quantize_rows(act, 1, I) : std::vector<double>(act, act + I);
      linear_rows(aq.data(), 1, down, e * H, H, st.y.data() + p * H);
    }
  }, 1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < k; ++s)
      for (int64_t h = 0; h < H; ++h)
        st.out[size_t(t * H + h)] += double(weights[t * k + s]) * st.y[size_t((t * k + s) * H + h)];
  return st;
}

double rel_err(const double* a, const double* b, size_t n) {
  double e = 0, r = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return NAN;
    e += (a[i] - b[i]) * (a[i] - b[i]);
    r += b[i] * b[i];
  }
  if (r == 0) return e == 0 ? 0.0 : INFINITY;
  return std::sqrt(e / r);
}

double rel_err(const float* a, const double* b, size_t n) {
  std::vector<double> d(a, a + n);
  return rel_err(d.data(), b, n);
}

}  // namespace moefold::cpu
