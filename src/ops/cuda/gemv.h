// Decode-shaped dense projections: y[r, n] = sum_k x[r, k] * w[n, k] (+ bias[n]) for the live rows
// r < *live_rows of a batch of at most kGemvMaxRows rows, streaming the checkpoint's row-major [N, K]
// bf16 weight once over all SMs (the GEMV regime, where cuBLASLt at M = 1 reaches ~23% of HBM
// bandwidth). bf16 inputs, fp32 accumulation on the tensor cores (mma.sync m16n8k16), one rounding
// per output.
//
// Batch invariance by construction: each output element is reduced in an order that depends only on
// (K, N) (and an explicit warps_k, if given): K is cut into 32-wide steps, the steps into warps_k
// contiguous warp ranges chosen from (N, K) alone, each warp accumulates its steps in ascending order
// (two mma k16 halves per step), and the warps' partial sums are added in warp order through shared
// memory. Neither max_rows, the live count, the row's position in the batch nor the pointer alignment
// (16-byte loads versus the element-wise fallback path, which zero-fills k >= K the same way) changes a
// row's bits: a row computed alone equals the same row inside any batch, bit for bit.
//
// Live rows: *live_rows is read on the device (nullptr = max_rows), so a CUDA graph captured at a
// bucket size replays with fewer live rows; rows >= *live_rows of x are never read and of y (and of the
// residual) never written. All functions are asynchronous on `stream` and capture-safe (no host
// synchronisation, no allocation).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moefold::cuda {

/// The largest max_rows the GEMV kernels take (1..16 use one 16-row tensor-core tile, 17..32 two).
inline constexpr int64_t kGemvMaxRows = 32;

/// y[r, n] (bf16) = sum_k x[r, k] * w[n, k] (+ bias[n], bf16, optional), fp32 accumulation, bias added
/// in fp32 before the single rounding. x: [max_rows, K] bf16 with row stride x_stride >= K (0 = K);
/// w: [N, K] bf16 dense row-major; y: [max_rows, N] with row stride y_stride >= N (0 = N). y must not
/// overlap x or w. live_rows: device int32 (nullptr = max_rows), clamped to [0, max_rows].
/// 0 <= max_rows <= kGemvMaxRows (0 is a no-op). Any K >= 1, N >= 1 and any alignment work: 16-byte
/// loads of w need w 16-byte aligned and K % 8 == 0, of x also x 16-byte aligned and x_stride % 8 == 0;
/// otherwise an element-wise path computes the same bits more slowly.
/// warps_k: 0 = the default K split for (N, K); 1..16 forces it (tuning only: it changes the
/// reduction order, so invariance holds per fixed warps_k). Throws moefold::Error for bad sizes, null
/// pointers or a launch failure.
void gemv_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
               int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
               int64_t x_stride = 0, int64_t y_stride = 0, int warps_k = 0);

/// The same with fp32 output y (the lm_head's logits); bias, if given, is fp32 and added in fp32.
void gemv_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                      int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
                      int64_t x_stride = 0, int64_t y_stride = 0, int warps_k = 0);

/// Fused gate|up projection with the SwiGLU epilogue: w_gate_up is [2I, K] (rows 0..I-1 gate,
/// I..2I-1 up), bias (optional, bf16) [2I]; out[r, i] = bf16(silu(g) * u) with g = bf16(x.w[i] (+b)),
/// u = bf16(x.w[I + i] (+b)): exactly gemm_bf16 into a bf16 [rows, 2I] buffer followed by
/// cuda::swiglu (the GEMM output rounded to bf16, then silu(g) * u in fp32, rounded once), without the
/// intermediate buffer. out: [max_rows, I] with row stride out_stride >= I (0 = I). Sizes, live rows,
/// alignment and errors as gemv_bf16.
void gemv_swiglu_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, const __nv_bfloat16* bias,
                      __nv_bfloat16* out, int64_t max_rows, int64_t K, int64_t I, const int32_t* live_rows,
                      cudaStream_t stream, int64_t x_stride = 0, int64_t out_stride = 0);

/// Projection with the residual add: y[r, n] = bf16(residual[r, n] + bf16(x.w[n] (+ bias[n]))),
/// i.e. gemm_bf16 followed by cuda::residual_add, in one pass. residual may alias y exactly (same
/// pointer and stride: y += x.W^T in place); it must not partially overlap it. res_stride >= N
/// (0 = y_stride). Sizes, live rows, alignment and errors as gemv_bf16.
void gemv_residual_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                        const __nv_bfloat16* residual, __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N,
                        const int32_t* live_rows, cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0,
                        int64_t res_stride = 0);

/// The default K split (warps per block, 1..16) gemv_bf16 uses for an [N, K] weight with `cols_per_block`
/// output columns per block (16; 8 for the SwiGLU variant, whose blocks read 8 gate and 8 up rows).
/// Depends only on its arguments. Exposed for tests and tuning reports.
int gemv_default_warps_k(int64_t N, int64_t K, int cols_per_block = 16);

}  // namespace moefold::cuda
