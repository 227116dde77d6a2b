// Device helpers of the block-scaled FP8 kernels (fp8_gemv.cu, moe_fp8.cu; private to src/ops/cuda).
//
// Decoding e4m3 exactly without a conversion unit: the 7 magnitude bits of an e4m3 byte, placed at bit 7
// of an IEEE half (sign at bit 15), are the half of value f8 * 2^-8, exactly, subnormals included (both
// formats put the same mantissa bits after the same implicit bit; the exponent biases differ by 8). The
// half -> fp32 conversion is exact, and the 2^8 is folded into the block scale (an exact power-of-two
// multiply). Four e4m3 bytes take two byte permutes, four logic ops and two half2 -> float2 conversions.
//
// warp_dots_fp8: one warp computes acc[r][p] = sum_k W[r, k] * v_p[k] for R weight rows and n <= NP
// bf16 vectors, W = f8 * scale per 128-column block. Lane l owns the 16-byte chunks k = s * 512 + 16 l
// .. + 15 (s = 0, 1, ...: one block each, since 16 divides 128); per chunk it sums the 16 products in k
// order into an fp32 partial (fmaf from 0), then adds partial * (scale * 2^8) to its accumulator, steps
// in ascending s; the 32 lane sums are added by an xor butterfly (16, 8, 4, 2, 1). This order depends on
// K only: never on n, NP, U, the other vectors or the launch, which is what makes every FP8 kernel
// batch-invariant. Needs K % 16 == 0, the weight rows and vectors 16-byte aligned.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/ptx.cuh"

namespace moefold::cuda::fp8 {

constexpr int kChunk = 16;                // e4m3 bytes per lane per step (one 16-byte load)
constexpr int kStep = 32 * kChunk;        // columns a warp covers per step
constexpr int kBlock = 128;               // scale block (columns)
constexpr float kHalfBias = 256.0f;       // 2^8: the half decoding's factor, folded into the scale

/// Two e4m3 bytes (sel picks them: 0x1404 bytes 0, 1; 0x3424 bytes 2, 3) as two halves f8 * 2^-8.
__device__ __forceinline__ float2 e4m3x2_scaled(uint32_t w, uint32_t sel) {
  uint32_t h = __byte_perm(w, 0u, sel);
  h = (h & 0x80008000u) | ((h >> 1) & 0x3f803f80u);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

/// 16 e4m3 (element 0 in the low byte of v.x) as fp32 values f8 * 2^-8, exactly.
__device__ __forceinline__ void e4m3x16_scaled(const uint4& v, float (&f)[16]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 a = e4m3x2_scaled(w[q], 0x1404u), b = e4m3x2_scaled(w[q], 0x3424u);
    f[4 * q] = a.x;
    f[4 * q + 1] = a.y;
    f[4 * q + 2] = b.x;
    f[4 * q + 3] = b.y;
  }
}

/// 16 bf16 at p (16-byte aligned) as fp32, exactly.
__device__ __forceinline__ void bf16x16(const __nv_bfloat16* p, float (&f)[16]) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    f[2 * q] = __uint_as_float(w[q] << 16);
    f[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
  }
}

/// See the file header. w: row 0 of R rows `rstride` bytes apart; sc: their scale rows (fp32,
/// `sstride` floats apart, one per 128 columns); vec(p): the bf16 vector p (p < n <= NP, warp-uniform).
/// Called by all 32 lanes; the result is in every lane.
template <int R, int NP, int U, class Vec>
__device__ __forceinline__ void warp_dots_fp8(const uint8_t* __restrict__ w, int64_t rstride,
                                              const float* __restrict__ sc, int64_t sstride, const Vec& vec, int n,
                                              int K, float (&acc)[R][NP]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int p = 0; p < NP; ++p) acc[r][p] = 0.0f;
  const int steps = (K + kStep - 1) / kStep;
  for (int s0 = 0; s0 < steps; s0 += U) {
    uint4 wv[U][R];
    float sv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = (s0 + u) * kStep + lane * kChunk;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool ok = k0 < K;
        wv[u][r] = ok ? ptx::ld_stream16(w + r * rstride + k0) : make_uint4(0, 0, 0, 0);
        sv[u][r] = ok ? __ldg(sc + r * sstride + k0 / kBlock) * kHalfBias : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = (s0 + u) * kStep + lane * kChunk;
      if (k0 < K) {  // per lane, fixed by K
        float wf[R][16];
#pragma unroll
        for (int r = 0; r < R; ++r) e4m3x16_scaled(wv[u][r], wf[r]);
#pragma unroll
        for (int p = 0; p < NP; ++p) {
          if (p < n) {
            float xf[16];
            bf16x16(vec(p) + k0, xf);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              float part = 0.0f;
#pragma unroll
              for (int i = 0; i < 16; ++i) part = fmaf(wf[r][i], xf[i], part);
              acc[r][p] = fmaf(part, sv[u][r], acc[r][p]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int p = 0; p < NP; ++p)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][p] += __shfl_xor_sync(0xffffffffu, acc[r][p], o);
}

}  // namespace moefold::cuda::fp8
