#include "core/fp8_block.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"

namespace moefold {

float Fp8Weight::value(int64_t r, int64_t c) const {
  return f8e4m3_to_f32(q[size_t(r * cols + c)]) * scale[size_t(r * col_blocks() + c / kFp8BlockSize)];
}

Fp8Weight fp8_from_blocks(const uint8_t* q, const float* bs, int64_t mats, int64_t rows, int64_t cols) {
  Fp8Weight w;
  w.rows = mats * rows;
  w.cols = cols;
  w.q.assign(q, q + size_t(w.rows * cols));
  const int64_t br = (rows + kFp8BlockSize - 1) / kFp8BlockSize, bc = w.col_blocks();
  w.scale.resize(size_t(w.rows * bc));
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < bc; ++b)
        w.scale[size_t((m * rows + r) * bc + b)] = bs[size_t((m * br + r / kFp8BlockSize) * bc + b)];
  return w;
}

Fp8Weight fp8_quantize(const float* src, int64_t mats, int64_t rows, int64_t cols) {
  Fp8Weight w;
  w.rows = mats * rows;
  w.cols = cols;
  w.q.resize(size_t(w.rows * cols));
  const int64_t br = (rows + kFp8BlockSize - 1) / kFp8BlockSize, bc = w.col_blocks();
  w.scale.resize(size_t(w.rows * bc));
  std::atomic<bool> finite{true};
  // One task per (matrix, block row): every block of that row band is quantised independently.
  parallel_for(mats * br, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t m = t / br, r0 = (t % br) * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
      for (int64_t b = 0; b < bc; ++b) {
        const int64_t c0 = b * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            const float v = src[size_t((m * rows + r) * cols + c)];
            if (!std::isfinite(v)) finite.store(false, std::memory_order_relaxed);
            amax = std::max(amax, std::fabs(v));
          }
        const float s = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t row = m * rows + r;
          w.scale[size_t(row * bc + b)] = s;
          for (int64_t c = c0; c < c1; ++c) w.q[size_t(row * cols + c)] = f32_to_f8e4m3(src[size_t(row * cols + c)] / s);
        }
      }
    }
  }, 1);
  MOEFOLD_CHECK(finite.load(), "fp8 quantisation: the weight holds a non-finite value");
  return w;
}

void fp8_fake_quantize_activations(float* x, int64_t T, int64_t K) {
  parallel_for_rows(T, K, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t b0 = 0; b0 < K; b0 += kFp8BlockSize) {
        float* p = x + t * K;
        const int64_t b1 = std::min(K, b0 + kFp8BlockSize);
        float amax = 0.0f;
        for (int64_t k = b0; k < b1; ++k) amax = std::max(amax, std::fabs(p[k]));
        const float s = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
        for (int64_t k = b0; k < b1; ++k) p[k] = f8e4m3_to_f32(f32_to_f8e4m3(p[k] / s)) * s;
      }
  });
}

std::vector<float> fp8_dequantize(const Fp8Weight& w) {
  std::vector<float> out(size_t(w.rows * w.cols));
  parallel_for_rows(w.rows, w.cols, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t c = 0; c < w.cols; ++c) out[size_t(r * w.cols + c)] = w.value(r, c);
  });
  return out;
}

void fp8_append_rows(Fp8Weight& a, const Fp8Weight& b) {
  if (a.rows == 0) {
    a = b;
    return;
  }
  MOEFOLD_CHECK(a.cols == b.cols, "fp8: cannot stack a [{}, {}] weight under a [{}, {}] one", b.rows, b.cols, a.rows,
                a.cols);
  a.rows += b.rows;
  a.q.insert(a.q.end(), b.q.begin(), b.q.end());
  a.scale.insert(a.scale.end(), b.scale.begin(), b.scale.end());
}

Fp8Weight fp8_slice_rows(const Fp8Weight& w, int64_t r0, int64_t n) {
  MOEFOLD_CHECK(r0 >= 0 && n >= 0 && r0 + n <= w.rows, "fp8: rows [{}, {}) outside a weight of {} rows", r0, r0 + n,
                w.rows);
  Fp8Weight out;
  out.rows = n;
  out.cols = w.cols;
  const int64_t bc = w.col_blocks();
  out.q.assign(w.q.begin() + r0 * w.cols, w.q.begin() + (r0 + n) * w.cols);
  out.scale.assign(w.scale.begin() + r0 * bc, w.scale.begin() + (r0 + n) * bc);
  return out;
}

bool fp8_cols_sliceable(int64_t cols, int64_t c0, int64_t n) {
  if (c0 < 0 || n <= 0 || c0 + n > cols) return false;
  return c0 % kFp8BlockSize == 0 || c0 / kFp8BlockSize == (c0 + n - 1) / kFp8BlockSize;
}

Fp8Weight fp8_slice_cols(const Fp8Weight& w, int64_t c0, int64_t n) {
  MOEFOLD_CHECK(c0 >= 0 && n > 0 && c0 + n <= w.cols, "fp8: columns [{}, {}) outside a weight of {} columns", c0,
                c0 + n, w.cols);
  MOEFOLD_CHECK(fp8_cols_sliceable(w.cols, c0, n),
                "fp8: columns [{}, {}) start inside a 128-wide scale block and cross into the next one: the "
                "slice's blocks would need two scales",
                c0, c0 + n);
  Fp8Weight out;
  out.rows = w.rows;
  out.cols = n;
  const int64_t bc = w.col_blocks(), obc = out.col_blocks();
  out.q.resize(size_t(w.rows * n));
  out.scale.resize(size_t(w.rows * obc));
  for (int64_t r = 0; r < w.rows; ++r) {
    std::copy(w.q.begin() + r * w.cols + c0, w.q.begin() + r * w.cols + c0 + n, out.q.begin() + r * n);
    for (int64_t kb = 0; kb < obc; ++kb)
      out.scale[size_t(r * obc + kb)] = w.scale[size_t(r * bc + (c0 + kb * kFp8BlockSize) / kFp8BlockSize)];
  }
  return out;
}

}  // namespace moefold
