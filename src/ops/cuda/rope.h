// Rotary position embedding on the GPU: half-split (NeoX) pairing, partial or full, in place on bf16
// [tokens, heads, head_dim] rows, positions read on the device. Math as ops/cpu/rope.h: for each
// j < rotary_dim/2 the pair (x[j], x[j + rotary_dim/2]) rotates by angle positions[t] * inv_freq[j]:
// lo' = lo cos - hi sin, hi' = hi cos + lo sin; dims >= rotary_dim pass through.
//
// Accuracy: inv_freq is computed on the host in double (cpu::rope_inv_freq, Llama-3 scaling included)
// and kept on the device in double; each kernel forms the angle pos * inv_freq[j] in double and takes
// cos / sin in double before rounding to fp32 — the same operations as the CPU reference, so cos / sin
// agree with it to the last fp32 bit (up to double libm ulps) at any position (checked to 100k+). The
// double math is a few dozen FP64 ops per (token, frequency), shared by all heads of the token, which
// costs nothing next to the memory traffic; no cos/sin table of max_model_len rows is needed.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/device_buffer.h"
#include "ops/cuda/elementwise.h"  // HeadRows

namespace moefold::cuda {

#ifdef __CUDACC__
/// One rotated pair with its rounding spelled out (one fma over one product each), so every kernel that
/// rotates (rope_kernel, qk_norm_rope_kernel) gives the same bits whatever the compiler would contract:
/// lo' = lo cos - hi sin, hi' = hi cos + lo sin.
__device__ __forceinline__ float rope_lo(float lo, float hi, float c, float s) {
  return __fmaf_rn(lo, c, -__fmul_rn(hi, s));
}
__device__ __forceinline__ float rope_hi(float lo, float hi, float c, float s) {
  return __fmaf_rn(hi, c, __fmul_rn(lo, s));
}
#endif

/// The device copy of one model's inverse frequencies (rotary_dim / 2 doubles).
struct RopeFreqs {
  int64_t rotary_dim = 0;
  DeviceBuffer<double> inv_freq;
  /// Uploads inv_freq (from cpu::rope_inv_freq) for a rotary dimension of rotary_dim.
  RopeFreqs(int64_t rotary_dim, const std::vector<double>& inv_freq);
};

/// Rotates q (and k, if not null) in place. q rows: q_rows ([tokens, Hq, head_dim] layout; heads =
/// Hq), k rows likewise with k_rows.heads = Hkv. positions: device int32 [max_rows], >= 0.
/// live_rows: device count of live tokens, or nullptr for all max_rows. rotary_dim even, <= head_dim.
void apply_rope(bf16* q, HeadRows q_rows, bf16* k, HeadRows k_rows, const int32_t* positions, int64_t max_rows,
                int64_t head_dim, const RopeFreqs& freqs, const int32_t* live_rows, cudaStream_t stream);

}  // namespace moefold::cuda
