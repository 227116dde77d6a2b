// The epilogue the batch-invariant GEMMs share (decode_gemm.cu, invariant_gemm.cu, prefill_gemm_wgmma.cu):
// one output pair (row, col), (row, col + 1) = fp32 accumulators + bias, rounded once to OutT (bf16 or
// fp32) and stored, columns >= N skipped. Keeping it in one place keeps the kernels' bits the same.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace moefold::cuda::gemm_epilogue {

/// bias[n] as fp32: fp32 for fp32 outputs, bf16 otherwise.
template <class OutT>
__device__ __forceinline__ float bias_at(const void* b, int n) {
  if constexpr (sizeof(OutT) == 4) return static_cast<const float*>(b)[n];
  else return __bfloat162float(static_cast<const __nv_bfloat16*>(b)[n]);
}

/// P has bias (nullable), y, y_stride (elements), N and pair_stores (y_stride even and y aligned to a
/// pair: the two values go in one store; col is then even).
template <class OutT, class P>
__device__ __forceinline__ void store_pair(const P& p, int64_t row, int col, float v0, float v1) {
  if (col >= p.N) return;
  const bool two = col + 1 < p.N;
  if (p.bias) {
    v0 += bias_at<OutT>(p.bias, col);
    if (two) v1 += bias_at<OutT>(p.bias, col + 1);
  }
  OutT* out = static_cast<OutT*>(p.y) + row * p.y_stride + col;
  if constexpr (sizeof(OutT) == 4) {
    if (two && p.pair_stores) {
      *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
    } else {
      out[0] = v0;
      if (two) out[1] = v1;
    }
  } else {
    if (two && p.pair_stores) {
      *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
    } else {
      out[0] = __float2bfloat16_rn(v0);
      if (two) out[1] = __float2bfloat16_rn(v1);
    }
  }
}

}  // namespace moefold::cuda::gemm_epilogue
