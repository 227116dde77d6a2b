// One decode step of the causal depthwise conv1d + SiLU for one channel (private to src/ops/cuda): shared by
// conv1d_decode_kernel (causal_conv1d.cu) and the fused DeltaNet decode kernel (gated_delta_net.cu), so
// both give the same bits. Math: src/ops/cpu/gated_delta_net.cc causal_conv1d_silu.
#pragma once
#include <cuda_bf16.h>

#include "ops/cuda/causal_conv1d.h"
#include "ops/cuda/silu_approx.cuh"

namespace moefold::cuda::conv1d {

/// The window of one channel: its K - 1 state values st[0..K-2] (oldest first), then the new input x;
/// entries past K - 1 are zero.
__device__ __forceinline__ void load_window(const __nv_bfloat16* st, __nv_bfloat16 x, int K,
                                            __nv_bfloat16 (&win)[kMaxConvKernel]) {
  const int Km1 = K - 1;
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j < Km1) win[j] = st[j];
    else if (j == Km1) win[j] = x;
    else win[j] = __float2bfloat16(0.0f);
  }
}

/// bf16(silu(w . window)) for the channel's K taps w[0..K-1] (fp32 sum in tap order).
__device__ __forceinline__ __nv_bfloat16 output(const __nv_bfloat16* w, int K,
                                                const __nv_bfloat16 (&win)[kMaxConvKernel]) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j)
    if (j < K) acc += __bfloat162float(w[j]) * __bfloat162float(win[j]);
  return __float2bfloat16(silu_approx(acc));
}

/// The new state: the window shifted by one (oldest value dropped, x appended).
__device__ __forceinline__ void store_state(__nv_bfloat16* st, int K, const __nv_bfloat16 (&win)[kMaxConvKernel]) {
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j)
    if (j < K - 1) st[j] = win[j + 1];
}

}  // namespace moefold::cuda::conv1d
