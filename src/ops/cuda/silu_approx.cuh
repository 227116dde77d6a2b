// The SiLU of the memory-bound DeltaNet kernels (private to src/ops/cuda): the conv1d (prefill, decode, the
// fused DeltaNet decode's conv step) and the gated RMSNorm (its kernel and the fused decode's norm). Each
// pair of kernels that must give the same bits uses this one definition.
#pragma once
#include <cuda_runtime.h>

namespace moefold::cuda {

/// silu(x) = x / (1 + e^-x) with the approximate exponential and reciprocal (ex2.approx, rcp.approx: a few
/// fp32 ulp, below the bf16 rounding of these kernels' outputs; an IEEE division costs these kernels more
/// issue slots than their bytes). For 1 + e^-x > 2^126 (x < -87.3) it gives 0.
__device__ __forceinline__ float silu_approx(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

}  // namespace moefold::cuda
