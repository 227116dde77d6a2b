// Shared helpers of row_norm_test (the norm and RoPE kernels of elementwise.h, gated_rms_norm.h and
// rope.h): fp64 CPU references on bf16-rounded inputs, and one-call runners that upload inputs, poison
// the outputs (0xFF bytes: bf16 NaN), launch with a device live count and download raw bits.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"

namespace moefold::test::rownorm {

inline void device_sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

inline float bits_to_f32(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::vector<float> bits_to_f32(const std::vector<uint16_t>& b, size_t from, size_t to) {
  std::vector<float> f(to - from);
  for (size_t i = from; i < to; ++i) f[i - from] = bits_to_f32(b[i]);
  return f;
}

/// fp64 RMSNorm of rows of dim: y = x / sqrt(mean(x^2) + eps) * (w or 1 + w).
inline std::vector<double> ref_rms_norm(const std::vector<float>& x, const std::vector<float>& w, int64_t rows,
                                        int64_t dim, double eps, bool zc) {
  std::vector<double> y(size_t(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[size_t(r * dim + i)]) * x[size_t(r * dim + i)];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i)
      y[size_t(r * dim + i)] = double(x[size_t(r * dim + i)]) * inv * (zc ? 1.0 + w[size_t(i)] : double(w[size_t(i)]));
  }
  return y;
}

/// fp64 gated RMSNorm (ops/cpu/norm.h gated_rms_norm): y = w * (x / sqrt(mean(x^2) + eps)) * silu(z).
inline std::vector<double> ref_gated(const std::vector<float>& x, const std::vector<float>& z,
                                     const std::vector<float>& w, int64_t rows, int64_t dim, double eps) {
  std::vector<double> y(size_t(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[size_t(r * dim + i)]) * x[size_t(r * dim + i)];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) {
      const double zz = z[size_t(r * dim + i)];
      y[size_t(r * dim + i)] = double(w[size_t(i)]) * (double(x[size_t(r * dim + i)]) * inv) * (zz / (1.0 + std::exp(-zz)));
    }
  }
  return y;
}

/// A device int32 holding n (a live count).
inline DeviceBuffer<int32_t> dev_count(int64_t n) { return cuda::to_device(std::vector<int32_t>{int32_t(n)}); }

/// rms_norm on dense [cap, dim] rows of x (values), live rows live (device count, or nullptr when
/// live == cap and use_null), output poisoned first. x_off: elements the rows start past a 256-byte
/// aligned base (0, 1, 2, 4: forces a narrower vector width). Returns the raw output bits [cap, dim].
inline std::vector<uint16_t> run_rms_norm(const std::vector<float>& x, const std::vector<float>& w, int64_t cap,
                                          int64_t live, int64_t dim, bool zc, bool use_null, int64_t x_off = 0,
                                          bool in_place = false) {
  std::vector<float> xs(size_t(x_off), 1.0f);
  xs.insert(xs.end(), x.begin(), x.end());
  auto dx = dev_bf16(xs), dw = dev_bf16(w);
  DeviceBuffer<bf16> dy(xs.size());
  dy.fill_bytes(0xFF);
  auto dl = dev_count(live);
  bf16* out = in_place ? dx.data() : dy.data();
  cuda::rms_norm(dx.data() + x_off, dw.data(), out + x_off, cap, dim, 1e-6f,
                 zc ? cpu::NormKind::ZeroCentred : cpu::NormKind::Plain, use_null ? nullptr : dl.data(), nullptr);
  device_sync();
  auto bits = host_bits(in_place ? dx : dy);
  return std::vector<uint16_t>(bits.begin() + x_off, bits.end());
}

/// add_rms_norm on dense [cap, dim]; returns {h bits after, x bits} ([cap, dim] each; x poisoned first).
inline std::pair<std::vector<uint16_t>, std::vector<uint16_t>> run_add_rms_norm(
    const std::vector<float>& h, const std::vector<float>& y, const std::vector<float>& w, int64_t cap, int64_t live,
    int64_t dim, bool zc, bool use_null) {
  auto dh = dev_bf16(h), dy = dev_bf16(y), dw = dev_bf16(w);
  DeviceBuffer<bf16> dx(h.size());
  dx.fill_bytes(0xFF);
  auto dl = dev_count(live);
  cuda::add_rms_norm(dh.data(), dy.data(), dw.data(), dx.data(), cap, dim, 1e-6f,
                     zc ? cpu::NormKind::ZeroCentred : cpu::NormKind::Plain, use_null ? nullptr : dl.data(), nullptr);
  device_sync();
  return {host_bits(dh), host_bits(dx)};
}

}  // namespace moefold::test::rownorm
