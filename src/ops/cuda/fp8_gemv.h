// Block-scaled FP8 dense projections for decode-sized steps (1 .. kFp8GemvMaxRows rows), and the
// dequantisation to bf16 that prefill-sized steps use (core/fp8_block.h has the format):
//   y[r, n] = bf16( sum_kb scale[n, kb] * sum_{k in block kb} f8(w[n, k]) * x[r, k]  (+ bias[n]) )
// W8A16: bf16 activations, e4m3 weights decoded exactly, fp32 accumulation on the CUDA cores, one
// rounding per output. Each warp streams its weight rows once from HBM (16-byte non-L1 loads) with
// their fp32 scales; batches of more than 8 rows re-read the rows, 8 at a time, from L2.
//
// Batch invariance by construction: an output's reduction order depends on K only (fp8.cuh), never on
// max_rows, the live count, the row's position or the other rows: a row alone equals the same row in
// any batch of 1 .. kFp8GemvMaxRows rows, bit for bit.
//
// Live rows: *live_rows is read on the device (nullptr = max_rows); rows >= it of x are never read and
// of y never written. Asynchronous on `stream`, capture-safe (no allocation, no host synchronisation).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

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

/// out[r, c] = bf16(f8(w[r, c]) * scale[r, c / 128]) for a [rows, cols] block-scaled weight (prefill
/// steps run the bf16 GEMMs on this copy). Asynchronous; throws moefold::Error on a launch failure.
void fp8_dequantize_bf16(const uint8_t* w, const float* scale, int64_t rows, int64_t cols, __nv_bfloat16* out,
                         cudaStream_t stream);

}  // namespace moefold::cuda
