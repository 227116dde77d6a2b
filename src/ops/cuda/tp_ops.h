// Kernels of the CUDA tensor / expert parallel step (models/cuda/cuda_tp_rank.h): the vocab-parallel
// embedding, the fp32 partial sums the collectives reduce, the rank-order sum, the local-expert combine
// and the vocabulary gather of the logits. All enqueue on `stream` without synchronising the host, read
// the live row count from device memory where one is given (rows >= *live_rows are padding: written as
// zeros where noted, never read as data), and so may be captured in a CUDA graph.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moefold::cuda {

/// Most ranks one rank-order sum reads (the pointers travel by value in the launch).
constexpr int kTpMaxRanks = 16;

/// Pointers to the ranks' fp32 inputs of one sum, in rank order.
struct RankInputs {
  const float* p[kTpMaxRanks] = {};
};

/// out[i] = in.p[0][i] + in.p[1][i] + ... + in.p[n_ranks - 1][i] (fp32, left to right: the CPU
/// communicator's order, so the bits equal parallel/cpu_communicator.cc's sums) for i < n. out may
/// alias one input. Throws Error unless 1 <= n_ranks <= kTpMaxRanks.
void rank_order_sum(const RankInputs& in, int n_ranks, float* out, int64_t n, cudaStream_t stream);

/// The vocab-parallel embedding as fp32 partials: out[t, :] = embed_local[ids[t] - v0, :] when ids[t] is
/// in this rank's rows [v0, v0 + vn), else zeros, for t < live; padding rows are written as zeros. An
/// id outside [0, vocab) sets *oob_flag to 1 (each rank checks the same ids). embed_local [vn, hidden];
/// out [max_rows, hidden].
void tp_embedding_f32(const __nv_bfloat16* embed_local, int64_t v0, int64_t vn, int64_t vocab, int64_t hidden,
                      const int32_t* ids, float* out, int64_t max_rows, const int32_t* live_rows, int32_t* oob_flag,
                      cudaStream_t stream);

/// y[t, :] = float(x[t, :]) for t < live, zeros for the padding rows. x, y [max_rows, dim].
void bf16_rows_to_f32(const __nv_bfloat16* x, float* y, int64_t max_rows, int64_t dim, const int32_t* live_rows,
                      cudaStream_t stream);

/// out[t, :] = bf16(y[t, :]) for t < live (the summed embedding). y [max_rows, dim] fp32.
void f32_rows_to_bf16(const float* y, __nv_bfloat16* out, int64_t max_rows, int64_t dim, const int32_t* live_rows,
                      cudaStream_t stream);

/// The residual add of a reduced block output: h[t, :] = bf16(float(h[t, :]) + y[t, :]) for t < live
/// (the CPU reference's h += y, then the bf16 rounding). h [max_rows, dim] bf16, y fp32.
void residual_add_f32(__nv_bfloat16* h, const float* y, int64_t max_rows, int64_t dim, const int32_t* live_rows,
                      cudaStream_t stream);

/// The routed pairs this rank's experts take: local[i] = ids[i] - first when ids[i] is in [first, first
/// + count), else -1 (moe_plan drops the pair), for the live pairs i < *live_rows * k. ids, local [P].
void moe_local_ids(const int32_t* ids, int64_t first, int64_t count, int32_t* local, int64_t max_rows, int64_t k,
                   const int32_t* live_rows, cudaStream_t stream);

/// This rank's part of the MoE output in fp32, per live row t: out[t] = sum over slots s in order with
/// local[t * k + s] >= 0 of weights[t * k + s] * y[t * k + s] (y: moe_expert_down's rows, bf16), plus,
/// when shared_out is given, g * shared_out[t] with g = sigmoid(shared_gate_w . x[t]) (1 when
/// shared_gate_w is null). Padding rows are written as zeros. weights [P] fp32; local [P]; y [P, H];
/// shared_out, x [max_rows, H] bf16; out [max_rows, H] fp32.
void moe_combine_local_f32(const float* weights, const int32_t* local, const __nv_bfloat16* y,
                           const __nv_bfloat16* shared_out, const __nv_bfloat16* shared_gate_w,
                           const __nv_bfloat16* x, int64_t max_rows, int64_t k, int64_t hidden,
                           const int32_t* live_rows, float* out, cudaStream_t stream);

/// dst[r, 0 .. cols) = src[r, 0 .. cols) and dst[r, cols .. stride) = 0 for r < rows: the lm_head block
/// of this rank's vn vocabulary rows padded to the all-gather unit. src [rows, cols], dst [rows, stride].
void pad_columns(const float* src, int64_t rows, int64_t cols, int64_t stride, float* dst, cudaStream_t stream);

/// The gathered vocabulary shards in row order: logits[r, j * shard + c] = all[(j * rows + r) * shard + c]
/// for every rank j < n_ranks and j * shard + c < vocab. all [n_ranks, rows, shard]; logits [rows, vocab].
void gather_vocab_shards(const float* all, int n_ranks, int64_t rows, int64_t shard, int64_t vocab, float* logits,
                         cudaStream_t stream);

}  // namespace moefold::cuda
