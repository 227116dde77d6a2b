// Plan B of the batch-invariant GEMMs (invariant_gemm.h): the decode GEMM's reduction order
// (decode_gemm.h: 64-wide K chunks, S = decode_gemm_splits(N, K) contiguous splits, one fp32 chain per
// split in ascending k, partials added in split order 0..S-1, bias, one rounding) computed with wgmma
// m64nNk16 steps instead of mma.sync m16n8k16 steps, for 1..256 rows.
//
// Why: the prefill GEMM on the wgmma path (prefill_gemm_wgmma_bf16) is ~3-4x faster than the mma.sync
// one, but gives the decode GEMM's bits only if a wgmma k16 step rounds exactly as an mma.sync k16
// step (tests/cuda/wgmma_probe_test.cu decides it on the device). If it does not, decode and prefill
// can still agree bitwise by both using wgmma: this kernel, with swapped operands (64 weight rows as
// the A operand, the activation rows as the B operand, N = 16, 64 or 256 by max_rows), gives every
// row the chains prefill_gemm_wgmma_bf16 gives it, provided a wgmma element depends neither on the
// instruction's N nor on which operand is A (also probed, and checked row for row by
// invariant_gemm_test's WgmmaDecodeMatchesWgmmaPrefill).
//
// Off by default: MOEFOLD_INVARIANT_GEMM=wgmma_all makes invariant_gemm_bf16 run this kernel up to
// 256 rows and prefill_gemm_wgmma_bf16 above. Not tuned (one warpgroup per block, a cp.async ring,
// each chunk's products drained before the next): it exists so that one H200 run can choose a plan.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moefold::cuda {

/// y[r, n] (bf16) = sum_k x[r, k] * w[n, k] (+ bias[n]) for r < *live_rows (nullptr: max_rows), rows
/// bitwise independent of max_rows, the live count and the other rows. Arguments, layouts,
/// preconditions and errors as decode_gemm_bf16 (decode_gemm.h), the same `workspace` (sized by
/// decode_gemm_workspace_bytes(max_rows, N, K) or more, zero-filled once, left ready for the next call);
/// sm_90a only.
void decode_gemm_wgmma_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                            __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                            void* workspace, cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0);

/// The same with fp32 output; bias, if given, fp32.
void decode_gemm_wgmma_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                                   int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                                   cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0);

}  // namespace moefold::cuda
