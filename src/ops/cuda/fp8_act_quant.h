// Dynamic FP8 activation quantisation (the releases' activation_scheme "dynamic"), the A operand of the
// W8A8 tensor-core GEMMs: per row and 128-column block (1 x 128),
//   s[r, b] = max |x[r, 128 b .. 128 b + 127]| / 448 (fp32, IEEE division; 1 for an all-zero block),
//   q[r, c] = e4m3(x[r, c] / s[r, b]) (IEEE division, round to nearest even, saturating to +-448; NaN 0x7f),
// so q * s is x quantised exactly as the CPU's fp8_quantize_activations / fp8_fake_quantize_activations
// (src/ops/cpu/fp8_ideal.h, core/fp8_block.h) computes it, bit for bit. A row's bytes depend on that row
// only (batch-invariant). The last block is partial when K % 128 != 0.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moefold::cuda {

/// q / s as above for rows r < *live_rows (nullptr: max_rows). x: [max_rows, K] bf16 (16-byte aligned
/// rows: K % 8 == 0); q: [max_rows, K] e4m3 bytes; s: [max_rows, ceil(K / 128)] fp32. Rows past the
/// live count are neither read nor written. Asynchronous, capture-safe; throws moefold::Error for bad
/// sizes, null pointers or a launch failure.
/// `rows_per_token` only scales the profiler's work estimate (the MoE pairs: k rows per token).
void fp8_quantize_rows(const __nv_bfloat16* x, int64_t max_rows, int64_t K, const int32_t* live_rows, uint8_t* q,
                       float* s, cudaStream_t stream, int rows_per_token = 1);

}  // namespace moefold::cuda
