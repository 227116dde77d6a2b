// Dense GEMMs through cuBLASLt: y[T, out] = x[T, in] . W[out, in]^T (+ bias[out]) (+ y if accumulate).
// bf16 inputs, fp32 accumulation (CUBLAS_COMPUTE_32F), bf16 or fp32 output (fp32 for lm_head logits).
// Row-major throughout, the checkpoint's [out, in] weight layout used as is (cuBLASLt "TN" form:
// column-major C[out, T] = W^T-as-stored(op T) x X(op N)).
//
// One cuBLASLt handle per device and one 32 MiB workspace per (device, stream) are created on first
// use and cached for the process (thread-safe); matmul descriptors, layouts and the heuristic's
// algorithm are cached per problem shape, so a steady-state call does no host allocation and no
// heuristic query, and a call can be captured in a CUDA graph (after one warm-up call per shape,
// outside capture, which creates the stream's workspace).
//
// Live row count: the GEMM runs over all T rows given by the host (cuBLASLt takes M from the host;
// there is no device-side row count). For a batch padded to a captured bucket, pass the bucket size:
// the padding rows of y are computed too (they are scratch, never read back into live rows). Their
// inputs must be finite, which holds when activation buffers are zero-filled once at allocation:
// every other kernel of this backend leaves padding rows untouched (they read the live count on the
// device), so padding rows only ever hold GEMM outputs of finite inputs (0 . W = 0, plus bias).
// Batch invariance: every GEMM of up to 256 rows runs the algorithm cuBLASLt's heuristic picks for 256
// rows among those without split-K or a cross-CTA reduction, one per problem (in, out, strides, types),
// so a row's result is bitwise the same whatever the number of rows: a decode step's tokens do not
// depend on the rest of the batch or on the bucket. Above 256 rows the heuristic chooses per shape, so
// these rows are not invariant: the executor runs its batch-invariant projections through
// invariant_gemm.h instead (the decode GEMM's arithmetic at every row count) and cuBLASLt only with
// --no-batch-invariant (and for rows the decode GEMM's alignment rules exclude).
// Chosen over a custom device-counted GEMM because cuBLASLt is the fastest dense GEMM on Hopper and
// its cost for a bucket of T rows versus T_live rows is weight-read bound (identical) at decode sizes.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moefold::cuda {

/// y[T, out] (bf16) = x[T, in] . w[out, in]^T (+ bias[out] bf16, optional) (+ y if accumulate).
/// Row strides: x_stride >= in, y_stride >= out (elements; 0 means dense). All pointers device,
/// any alignment (the algorithm is chosen for the actual alignment). T may be 0 (no-op).
/// Throws moefold::Error for bad sizes or a cuBLASLt failure.
void gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
               int64_t T, int64_t in, int64_t out, cudaStream_t stream, bool accumulate = false,
               int64_t x_stride = 0, int64_t y_stride = 0);

/// Same with fp32 output y[T, out] (the lm_head's logits); bias, if given, is fp32.
void gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t T,
                      int64_t in, int64_t out, cudaStream_t stream, bool accumulate = false, int64_t x_stride = 0,
                      int64_t y_stride = 0);

/// Frees every cached handle, workspace and plan (e.g. before cudaDeviceReset). Not thread-safe
/// against concurrent GEMM calls.
void gemm_release_all();

}  // namespace moefold::cuda
