// Batch-invariant dense projections for ANY row count: y[r, n] = sum_k x[r, k] * w[n, k] (+ bias[n]),
// where row r's output bits depend only on x[r, :], w and bias, never on how many rows share the call.
//
// Why: the decode GEMM (decode_gemm.h) gives that guarantee for 1..256 rows, but a prefill step of more
// than 256 rows used to run cuBLASLt, whose reduction order differs from the decode GEMM's (it does not
// cut K into the decode GEMM's S(N, K) splits) and whose algorithm and split-K change with M. So a
// prompt row computed in a 300-row step (eight requests sharing a prefix in one step) and the same row
// in a 200-row step (one request resumed from the prefix cache, or computed cold) differed in the
// last bf16 bit, and a cache hit's logprobs differed from a cold run's (the prefix_cache_cuda_test
// failure on the dense Qwen3 fixture, whose o_proj has S = 2).
//
// prefill_gemm_bf16 runs the decode GEMM's exact arithmetic with large tiles: K cut into 64-wide chunks
// and the chunks into the S = decode_gemm_splits(N, K) contiguous splits; inside a split one fp32 chain
// of mma.sync m16n8k16 steps in ascending k (k >= K zero-filled); the split partials added in order
// 0..S-1 (kept in registers, no workspace), then the bias, then one rounding. A block holds 128 rows
// x 128 columns (8 warps of 64 x 32) and walks all of K through a 4-stage cp.async pipeline; blocks
// tile rows and columns (grouped raster for L2 reuse), so large M fills the GPU without split-K.
// invariant_gemm_bf16 dispatches: the decode GEMM up to 256 rows, prefill_gemm_bf16 above.
//
// prefill_gemm_wgmma_bf16 (prefill_gemm_wgmma.cu) is the same arithmetic on Hopper's warpgroup path:
// wgmma m64nNk16 chains fed by bulk tensor copies through an mbarrier ring, warp-specialised, 128 x
// 128 or 128 x 192 tiles, persistent. It gives the decode GEMM's bits because one wgmma k16 step
// rounds as one mma.sync m16n8k16 step (tests/cuda/wgmma_probe_test.cu checks it on the device), and
// invariant_gemm_bf16 runs it above 256 rows by default. MOEFOLD_INVARIANT_GEMM (read once) selects
// other kernels: =mma prefill_gemm_bf16 above 256 rows; =wgmma_all also the decode range on wgmma
// (decode_gemm_wgmma.h).
//
// Live rows: *live_rows is read on the device (nullptr = max_rows); rows >= live of y are never
// written, of x never read. Asynchronous on `stream`, capture-safe, no allocation.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moefold::cuda {

/// y[r, n] (bf16) = sum_k x[r, k] * w[n, k] (+ bias[n] bf16, optional) for r < *live_rows (nullptr:
/// max_rows), bitwise equal to decode_gemm_bf16's row r for any batch of 1..256 rows.
/// x: [max_rows, K] bf16, row stride x_stride >= K (0 = K); w: [N, K] dense row-major; y: [max_rows, N],
/// row stride y_stride >= N (0 = N). Preconditions as decode_gemm_bf16 (K >= 8, K % 8 == 0, x and w
/// 16-byte aligned, x_stride % 8 == 0, N in [1, 2^30]) except max_rows, any value >= 0 (0 is a no-op).
/// Throws moefold::Error naming the shape for a broken precondition or a launch failure.
void prefill_gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                       int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
                       int64_t x_stride = 0, int64_t y_stride = 0);

/// prefill_gemm_bf16 without its register double-buffering of the mma fragments (the first version,
/// kept for the PERF comparison); bitwise the same results.
void prefill_gemm_bf16_unpipelined(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                   __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                                   cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0);

/// The same with fp32 output (the lm_head's logits); bias, if given, fp32.
void prefill_gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                              int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
                              int64_t x_stride = 0, int64_t y_stride = 0);

/// prefill_gemm_bf16 on the wgmma path (sm_90a; see the note above): the same contract, arguments and
/// errors, plus tile_n: the column-tile width, 128 or 192, 0 = chosen from N (192 unless its last
/// tile wastes more than 5% of the columns). max_rows up to 2^31 - 128. Reads x through a tensor
/// map of max_rows rows, but only row tiles that are fully live; the tile holding the live-row
/// boundary is read row by row, so rows >= *live_rows of x are never read.
void prefill_gemm_wgmma_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                             __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                             cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0, int tile_n = 0);

/// The same with fp32 output; bias, if given, fp32.
void prefill_gemm_wgmma_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                                    int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                                    cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0, int tile_n = 0);

/// The kernels invariant_gemm_bf16(_f32out) run, from MOEFOLD_INVARIANT_GEMM (read once):
///   unset or "wgmma": prefill_gemm_wgmma_bf16 from 128 rows on, decode_gemm_bf16 below (the default;
///                   invariant_gemm_wgmma_min_rows below);
///   "mma":          decode_gemm_bf16 up to 256 rows, prefill_gemm_bf16 above;
///   "wgmma_all":    decode_gemm_wgmma_bf16 (decode_gemm_wgmma.h) up to 256 rows,
///                   prefill_gemm_wgmma_bf16 above (plan B: decode and prefill both on wgmma).
/// Throws moefold::Error naming the variable for any other value.
enum class InvariantGemmPath { Mma, Wgmma, WgmmaAll };
InvariantGemmPath invariant_gemm_path();

/// Inside the decode GEMM's range (<= 256 rows) on the default path (wgmma), which kernel a call takes:
/// both give the same bits for every row, so the choice is made for speed only. By default calls of
/// 128 rows or more take prefill_gemm_wgmma_bf16 (there it is 1.5-2.5x faster than the decode GEMM on
/// the large projections and the lm_head), fewer rows the decode GEMM. MOEFOLD_WGMMA_MIN_ROWS=N (read
/// once) moves that bound to N (tests and A/B runs); the function returns N, or 0 when unset. Throws
/// moefold::Error for a value that is not a row count >= 1.
inline constexpr int64_t kWgmmaDefaultMinRows = 128;
int64_t invariant_gemm_wgmma_min_rows();

/// The batch-invariant projection for any row count: decode_gemm_bf16 for max_rows <= 256 (with its
/// `workspace`, sized by decode_gemm_workspace_bytes(256, N, K) and zero-filled once), else
/// prefill_gemm_bf16 (workspace unused); other kernels by invariant_gemm_path(). Same preconditions and errors as those two.
void invariant_gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                         int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                         cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0);

/// The same with fp32 output.
void invariant_gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                                int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                                cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0);

}  // namespace moefold::cuda
