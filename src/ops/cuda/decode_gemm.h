// Decode-range dense projections (M = 1..256 rows) on the tensor cores with a batch-invariant
// reduction order: y[r, n] = sum_k x[r, k] * w[n, k] (+ bias[n]) for the live rows r < *live_rows,
// W the checkpoint's row-major [N, K] bf16 weight as stored, fp32 accumulation, one rounding per output.
//
// Why: cuBLASLt at M = 1 streams the weights at ~23% of HBM bandwidth, and its algorithm (split-K,
// tile shape) changes with M, so a row's bits depend on the batch. Here the weights are streamed
// once over all SMs, and every output element's arithmetic is fixed by (N, K) alone:
//   - K is cut into 64-wide chunks and the chunks into S = decode_gemm_splits(N, K) contiguous
//     splits (S chosen from N and K only, for about two waves of blocks on 132 SMs);
//   - inside a split, each output element is ONE fp32 accumulation chain of mma.sync m16n8k16 steps
//     in ascending k (k >= K zero-filled the same way for every M);
//   - the S partial sums are added in split order 0, 1, .., S-1 (by the last block of a column tile
//     to finish, found through an integer counter; no float atomics), then the bias, then one rounding.
// The block's tile shape (how many rows and columns it holds, how warps share them) is chosen from
// max_rows for speed, but it never changes an element's chain, so a row's output bits do not depend
// on max_rows, the live count, the row's position in the batch or the other rows: a row computed
// alone equals the same row inside any batch of 1..256 rows, byte for byte.
//
// Live rows: *live_rows is read on the device (nullptr = max_rows), so a CUDA graph captured at a
// bucket size replays with fewer live rows; rows >= *live_rows of x are never read and of y never
// written, and cost nothing (M-tiles of 16 rows past the live count are skipped). Every call is
// asynchronous on `stream` and capture-safe (no allocation, no host synchronisation).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moefold::cuda {

/// Launch configurations of the decode GEMM (decode_gemm.cu's header says what each does): every one
/// gives every row the same bits, they differ in speed only. Env: the one MOEFOLD_DECODE_GEMM_CFG names
/// ("old", "new", "new_nopf", "new16" or "new_nocl", read once; unset: kDecodeGemmDefaultCfg); the others: that one.
///   Old: the workspace split combine (fence, counter, the last block folds from L2);
///   New: L2 prefetch of the weight slice before griddepcontrol.wait, the first weight copies before the
///        live-count read, the split combine inside a thread-block cluster (DSMEM; S <= 16);
///   NewNoPrefetch: New without the L2 prefetch (A/B);
///   NewUpTo16: New for max_rows <= 16, Old above;
///   NewNoCluster: New with the workspace combine (A/B).
enum class DecodeGemmCfg { Env, Old, New, NewNoPrefetch, NewUpTo16, NewNoCluster };
inline constexpr DecodeGemmCfg kDecodeGemmDefaultCfg = DecodeGemmCfg::Old;

/// The configuration DecodeGemmCfg::Env resolves to. Throws moefold::Error for an unknown
/// MOEFOLD_DECODE_GEMM_CFG value.
DecodeGemmCfg decode_gemm_cfg();

/// The largest max_rows the decode GEMM takes.
inline constexpr int64_t kDecodeGemmMaxRows = 256;

/// The number of K-splits S(N, K) >= 1 the decode GEMM uses for an [N, K] weight (a function of N
/// and K only; every max_rows uses the same S, which is what keeps rows bitwise batch-invariant).
int decode_gemm_splits(int64_t N, int64_t K);

/// Bytes of device workspace a decode_gemm_* call with these sizes needs (0 when S(N, K) = 1, then
/// `workspace` may be null). It holds the split partials and one counter per column tile. The caller
/// allocates it once and ZERO-FILLS it once (cudaMemsetAsync(ws, 0, bytes)); every call leaves it
/// ready for the next (the counters return to zero), also inside a replayed CUDA graph. One
/// workspace must not be used by two calls that may run at the same time (different streams).
/// A workspace sized for (max_rows, N, K) serves any smaller max_rows with the same N and K.
size_t decode_gemm_workspace_bytes(int64_t max_rows, int64_t N, int64_t K);

/// y[r, n] (bf16) = sum_k x[r, k] * w[n, k] (+ bias[n], bf16, optional), for r < *live_rows.
/// x: [max_rows, K] bf16, row stride x_stride >= K elements (0 = K); w: [N, K] bf16 dense row-major;
/// y: [max_rows, N] bf16, row stride y_stride >= N (0 = N); y must not overlap x, w or the workspace.
/// live_rows: device int32 (nullptr = max_rows), clamped to [0, max_rows].
/// Preconditions (else moefold::Error naming the shape, nothing launched): 0 <= max_rows <= 256
/// (0 is a no-op), N >= 1, K >= 8 and K % 8 == 0, x and w 16-byte aligned, x_stride % 8 == 0 (y: any
/// stride; pairs of outputs are stored together when y_stride is even and y aligned to a pair),
/// workspace non-null and 16-byte aligned when decode_gemm_workspace_bytes() > 0.
/// Throws moefold::Error for a launch failure as well. cfg: the launch configuration (same bits).
void decode_gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                      int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                      cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0,
                      DecodeGemmCfg cfg = DecodeGemmCfg::Env);

/// The same with fp32 output y (the lm_head's logits, N up to 248,320 and more); bias, if given, is
/// fp32; the preconditions as decode_gemm_bf16.
void decode_gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                             int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                             cudaStream_t stream, int64_t x_stride = 0, int64_t y_stride = 0,
                             DecodeGemmCfg cfg = DecodeGemmCfg::Env);

}  // namespace moefold::cuda
