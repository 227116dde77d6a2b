// Helpers shared by the FP8 kernel tests (fp8_kernels_test.cc, moe_fp8_prefill_test.cc): random
// block-scaled weights with widely different block scales, their device copies, the routed-expert case
// of one MoE shape (per-expert gate / up / down quantised separately and stacked, as the per-expert
// release) and bf16 bit helpers.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/fp8_block.h"
#include "cuda/cuda_test_util.h"
#include "ops/cuda/device_buffer.h"

namespace moefold::cuda::fp8test {

using bf16 = __nv_bfloat16;

/// A random [rows, cols] weight quantised to FP8 (std ~ 1/sqrt(cols)), with a few blocks scaled up and
/// down by 2^+-6 so the block scales differ a lot.
inline Fp8Weight rand_fp8(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> w = test::rand_bf16(size_t(rows * cols), seed, 1.7f / std::sqrt(float(cols)));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t b = (r / 128) * 7 + c / 128;
      if (b % 5 == 1) w[size_t(r * cols + c)] *= 64.0f;
      if (b % 5 == 3) w[size_t(r * cols + c)] /= 64.0f;
    }
  return fp8_quantize(w.data(), 1, rows, cols);
}

struct DevFp8 {
  DeviceBuffer<uint8_t> q;
  DeviceBuffer<float> s;
  explicit DevFp8(const Fp8Weight& w) : q(w.q.size()), s(w.scale.size()) {
    q.upload(w.q);
    s.upload(w.scale);
  }
};

inline std::vector<uint16_t> bits_of(const DeviceBuffer<bf16>& d) { return test::host_bits(d); }

inline std::vector<float> to_f32(const std::vector<uint16_t>& b, size_t from, size_t to) {
  std::vector<float> v;
  for (size_t i = from; i < to; ++i) v.push_back(bf16_to_f32(b[i]));
  return v;
}

/// MOEFOLD_FP8_SMALL=1: the small shapes only (compute-sanitizer runs).
inline bool small_only() { return std::getenv("MOEFOLD_FP8_SMALL") != nullptr; }

struct MoeCase {
  int E, k, H, I;
  Fp8Weight gate_up, down;
  std::vector<float> router;
  std::unique_ptr<DevFp8> dgu, ddn;
  DeviceBuffer<bf16> drouter;
  MoeCase(int E_, int k_, int H_, int I_) : E(E_), k(k_), H(H_), I(I_) {
    // Per expert: gate [I, H] and up [I, H] quantised separately (the per-expert release), stacked.
    for (int e = 0; e < E; ++e) {
      fp8_append_rows(gate_up, rand_fp8(I, H, uint64_t(e * 3 + 1)));
      fp8_append_rows(gate_up, rand_fp8(I, H, uint64_t(e * 3 + 2)));
      fp8_append_rows(down, rand_fp8(H, I, uint64_t(e * 3 + 3)));
    }
    dgu = std::make_unique<DevFp8>(gate_up);
    ddn = std::make_unique<DevFp8>(down);
    router = test::rand_bf16(size_t(E) * H, 77, 2.0f / std::sqrt(float(H)));
    drouter = test::dev_bf16(router);
  }
  std::string name(int T, int cap) const {
    char b[128];
    std::snprintf(b, sizeof b, "E=%d,k=%d,H=%d,I=%d,T=%d,cap=%d", E, k, H, I, T, cap);
    return b;
  }
};

/// The Qwen3.6-35B-A3B expert shape, built once per binary (its 800 MB of weights take seconds).
inline MoeCase& real_shape() {
  static MoeCase m(256, 8, 2048, 512);
  return m;
}

}  // namespace moefold::cuda::fp8test
