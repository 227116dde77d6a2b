// Block-scaled FP8 dense projections for decode-sized steps (1 .. kFp8GemvMaxRows rows), and the
// dequantisation to bf16 that prefill-sized steps use (core/fp8_block.h has the format):
//   y[r, n] = bf16( sum_kb scale[n, kb] * sum_{k in block kb} f8(w[n, k]) * x[r, k]  (+ bias[n]) )
// W8A16: bf16 activations, e4m3 weights decoded exactly to bf16 in registers.
//   fp8_gemv / fp8_gemv_f32out: tensor cores (mma.sync m16n8k16, fp32 accumulation, fp8_mma.cuh): each
//     weight row streamed once from HBM for up to 64 rows (larger batches: 64 rows per pass, later
//     passes from L2), one fp32 partial per 128-column scale block times its scale, one rounding per
//     output.
//   fp8_gemv_simt: the CUDA-core kernel of before (fp8.cuh; 8 rows per pass), kept as the baseline of
//     the benchmarks.
//
// Batch invariance by construction: an output's reduction order depends on K only (fp8_mma.cuh /
// fp8.cuh), never on max_rows, the live count, the row's position or the other rows: a row alone equals
// the same row in any batch of 1 .. kFp8GemvMaxRows rows, bit for bit.
//
// Live rows: *live_rows is read on the device (nullptr = max_rows); rows >= it of x are never read and
// of y never written. Asynchronous on `stream`, capture-safe (no allocation, no host synchronisation).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "models/dummy_init.h"

namespace moefold::cuda {

/// The most rows fp8_gemv takes (the decode buckets).
inline constexpr int64_t kFp8GemvMaxRows = 256;

/// Whether fp8_gemv runs for these sizes and pointers: K % 16 == 0, w and x 16-byte aligned,
/// x_stride (0 = K) % 8 == 0.
bool fp8_gemv_supported(int64_t K, const void* x, int64_t x_stride, const void* w);

/// y[r, n] as above for r < *live_rows. x: [max_rows, K] bf16, row stride x_stride (0 = K); w: [N, K]
/// e4m3 bytes row-major; scale: [N, ceil(K / 128)] fp32 (per row, Fp8Weight::scale); bias: [N] bf16 or
/// null; y: [max_rows, N] bf16, row stride y_stride (0 = N), not overlapping x or w. 0 <= max_rows <=
/// kFp8GemvMaxRows (0: no-op). Throws moefold::Error when !fp8_gemv_supported, for null pointers, bad
/// sizes or a launch failure.
void fp8_gemv(const __nv_bfloat16* x, const uint8_t* w, const float* scale, const __nv_bfloat16* bias,
              __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
              int64_t x_stride = 0, int64_t y_stride = 0);

/// The same with fp32 outputs (the FP8 lm_head's logits): bias fp32 or null, y fp32 [max_rows, N].
void fp8_gemv_f32out(const __nv_bfloat16* x, const uint8_t* w, const float* scale, const float* bias, float* y,
                     int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
                     int64_t x_stride = 0, int64_t y_stride = 0);

/// fp8_gemv on the CUDA cores (the kernel before the tensor-core one; same contract, other bits).
void fp8_gemv_simt(const __nv_bfloat16* x, const uint8_t* w, const float* scale, const __nv_bfloat16* bias,
                   __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                   cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0);

/// fp8_quantize (core/fp8_block.h) of the dummy tensor `recipe` (models/dummy_init.h), [mats, rows, cols]
/// fp32 values dummy_value(recipe, i), on the device: q [mats * rows, cols] e4m3 bytes, scale
/// [mats * rows, ceil(cols / 128)] fp32 per row, bit for bit the host's result. Asynchronous; throws
/// moefold::Error on bad sizes or a launch failure.
void fp8_quantize_dummy(const DummyRecipe& recipe, int64_t mats, int64_t rows, int64_t cols, uint8_t* q, float* scale,
                        cudaStream_t stream);

/// out[r, c] = bf16(f8(w[r, c]) * scale[r, c / 128]) for a [rows, cols] block-scaled weight (prefill
/// steps run the bf16 GEMMs on this copy). Asynchronous; throws moefold::Error on a launch failure.
void fp8_dequantize_bf16(const uint8_t* w, const float* scale, int64_t rows, int64_t cols, __nv_bfloat16* out,
                         cudaStream_t stream);

}  // namespace moefold::cuda
