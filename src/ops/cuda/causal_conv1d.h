// CUDA causal depthwise conv1d + SiLU of the Gated DeltaNet layers (the qkv projection's short conv),
// with the per-sequence conv state kept in a slot pool. Math: src/ops/cpu/gated_delta_net.h
// causal_conv1d_silu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moefold::cuda {

/// Largest conv kernel width the kernels support (Qwen3.5/3.6 and Qwen3-Next use 4).
inline constexpr int kMaxConvKernel = 8;

/// Varlen prefill: y = silu(causal depthwise conv(x)) for several sequences in one launch.
/// x, y: bf16 [rows, C] row-major (y dense; x_stride elements between rows of x, 0 = C, e.g. x read in
/// place from a fused projection's output); sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]).
/// w: bf16 [C, K] (w[c, K-1] multiplies the current token). conv_state_pool: bf16 [num_slots, C, K-1],
/// per channel the previous K-1 inputs, oldest first (zeros for a new sequence: the caller zeroes a slot
/// at allocation); sequence s reads its initial state from slot state_slots[s] and the slot is
/// overwritten with the last K-1 inputs of [state, x_s] (a zero-length sequence leaves it unchanged).
/// The state is kept in bf16: it holds copies of bf16 inputs, so this is lossless.
/// Device pointers: cu_seqlens [max_seqs + 1], state_slots [max_seqs], num_seqs (one int32, the live
/// sequence count <= max_seqs). Rows >= cu_seqlens[*num_seqs] are neither read nor written, nor are
/// slots of sequences >= *num_seqs. max_rows (host) sizes the grid: cu_seqlens[*num_seqs] <= max_rows.
/// Preconditions: live sequences use distinct slots; 1 <= K <= kMaxConvKernel; x and y do not alias.
/// Throws moefold::Error on bad arguments or a launch error. Asynchronous on `stream`.
void causal_conv1d_silu_prefill(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* cu_seqlens,
                                const int32_t* state_slots, const int32_t* num_seqs, int max_rows,
                                __nv_bfloat16* conv_state_pool, __nv_bfloat16* y, int C, int K,
                                cudaStream_t stream, int64_t x_stride = 0);

/// Prefill kernels (all give the same bits): MOEFOLD_CONV_PREFILL unset or "tile" runs the row-tile
/// kernel where K = 4, C and x_stride are multiples of 8 and x, y 16-byte aligned (else the scalar one;
/// MOEFOLD_CONV_TILE_ROWS = 4, 8 (default) or 16 rows per thread); "vec" runs the vectorised kernel under
/// the same conditions; "scalar" the scalar kernel always. Read at each launch (at capture in a graph).
namespace detail {
/// The prefill kernel causal_conv1d_silu_prefill would launch for these arguments and the environment:
/// "scalar", "vec", "tile4", "tile8" or "tile16" (for tests and benchmarks).
const char* causal_conv1d_prefill_kernel_name(const void* x, const void* y, int C, int K, int64_t x_stride);
}  // namespace detail

/// Decode: one new token per sequence. x, y: bf16 [max_seqs, C] (row s = sequence s; x rows x_stride
/// apart, 0 = C); w, conv_state_pool
/// as in causal_conv1d_silu_prefill; the slot state_slots[s] is read and shifted in place (oldest value
/// dropped, x[s] appended). Device pointers state_slots [max_seqs], num_seqs (one int32 <= max_seqs);
/// rows and slots of sequences >= *num_seqs are untouched. Throws moefold::Error on bad arguments or a
/// launch error. Asynchronous on `stream`.
void causal_conv1d_silu_decode(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* state_slots,
                               const int32_t* num_seqs, int max_seqs, __nv_bfloat16* conv_state_pool,
                               __nv_bfloat16* y, int C, int K, cudaStream_t stream, int64_t x_stride = 0);

}  // namespace moefold::cuda
