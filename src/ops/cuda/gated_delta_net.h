// CUDA Gated DeltaNet (linear attention) core: the gating, q/k L2 norm and the delta-rule recurrence,
// as a chunked (UT-transform) varlen prefill and a one-token recurrent decode step, both reading and
// writing the per-sequence fp32 state in a slot pool. The short conv before it is causal_conv1d.h.
// Math: src/ops/cpu/gated_delta_net.h (gdn_gating, gated_delta_rule_recurrent / _chunked).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/causal_conv1d.h"

namespace moefold::cuda {

/// Head counts and sizes of one DeltaNet layer. Value head h reads key/query head h / (Hv / Hk).
struct GdnDims {
  int num_k_heads;  ///< Hk
  int num_v_heads;  ///< Hv, a multiple of Hk
  int k_dim;        ///< dk, 1..256 (prefill: as far as its shared memory fits, ~150 on sm_90)
  int v_dim;        ///< dv, >= 1
};

/// Snapshot request for gdn_chunked_prefill: copy the state of live sequence `seq` as it is after chunk
/// `chunk` (0-based; chunk c covers this launch's rows [64c, min(64c + 64, len)) of the sequence) into slot
/// `dst_slot` of the same pool. Entries naming a sequence >= num_seqs or a chunk past the sequence's
/// end are ignored. dst_slot must not be a slot any live sequence uses.
struct GdnSnapshot {
  int32_t seq;
  int32_t chunk;
  int32_t dst_slot;
};

/// Prefill chunk length of gdn_chunked_prefill (the snapshot granularity).
inline constexpr int kGdnChunk = 64;

/// Inputs shared by both entry points. Rows are tokens (prefill: concatenated sequences; decode: row s =
/// sequence s). All pointers are device pointers.
struct GdnArgs {
  const __nv_bfloat16* q;  ///< [rows, row_stride]: key head kh of row r at q + r*row_stride + kh*dk (raw, pre-norm)
  const __nv_bfloat16* k;  ///< same layout as q
  const __nv_bfloat16* v;  ///< [rows, row_stride]: value head h of row r at v + r*row_stride + h*dv
  int64_t row_stride;      ///< elements between rows of q, k, v (conv output: conv_dim = 2*Hk*dk + Hv*dv)
  const __nv_bfloat16* a;  ///< [rows, ab_stride]: decay logit of value head h at a + r*ab_stride + h
  const __nv_bfloat16* b;  ///< [rows, ab_stride]: beta logit, same layout
  int64_t ab_stride;       ///< elements between rows of a and b
  const float* A_log;      ///< [Hv] fp32
  const float* dt_bias;    ///< [Hv] fp32
  float* state_pool;       ///< fp32 [num_slots, Hv, dk, dv] (HF layout [K, V] per head), read and written in place
  const int32_t* state_slots;  ///< [max_seqs] slot of each sequence (distinct among live sequences)
  const int32_t* num_seqs;     ///< one int32: live sequences (<= max_seqs); the rest are padding, untouched
  __nv_bfloat16* out;          ///< [rows, Hv, dv] bf16 (o_t = S_t^T q_t), rows of padding never written
  /// Prefill: an upper bound on the launch's rows (cu_seqlens[num_seqs] <= max_rows; the step's row
  /// capacity), which sizes the tensor-core path's chunk scratch; 0 = unknown (the fused tensor-core kernel
  /// runs instead of the split one). A bound below the real rows leaves chunks past it uncomputed. Decode: unused.
  int64_t max_rows = 0;
};

/// Chunked varlen prefill of the delta rule for several sequences in one launch.
/// Sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]) (cu_seqlens: device [max_seqs + 1]); its state is
/// read from slot state_slots[s] (the caller zeroes a slot for a new sequence) and the final state is
/// written back; a zero-length sequence leaves its slot untouched. Per token and value head (fp32):
/// g = -exp(A_log) * softplus(a + dt_bias) (softplus threshold 20), beta = sigmoid(b),
/// q <- q * rsqrt(|q|^2 + 1e-6) * dk^-0.5, k <- k * rsqrt(|k|^2 + 1e-6), S = exp(g) S, d = beta (v - S^T k),
/// S += k d^T, o = S^T q, computed chunk by chunk (kGdnChunk) with the UT transform. dk = 128 with dv a
/// multiple of 16 (the Qwen3.5/3.6 shapes) runs on tensor cores (gated_delta_net_tc.h: a chunk-parallel
/// kernel and a sequential state pass when args.max_rows is set, else one fused kernel; bf16 operands with
/// bf16 residual terms on the state's path, fp32 accumulation and fp32 state; about 1e-4 relative on the
/// state, ~3e-3 on the bf16 output); other shapes on the fp32 CUDA-core kernel. MOEFOLD_GDN_TC=0 forces
/// the latter.
/// snapshots (device, may be null when max_snapshots == 0): up to max_snapshots entries, of which the first
/// *num_snapshots (device int32) are live. Preconditions: rows do not alias out; live sequences use
/// distinct slots. Throws moefold::Error on bad arguments or a launch error. Asynchronous on `stream`.
void gdn_chunked_prefill(const GdnArgs& args, const int32_t* cu_seqlens, int max_seqs, const GdnSnapshot* snapshots,
                         const int32_t* num_snapshots, int max_snapshots, const GdnDims& dims, cudaStream_t stream);

/// One recurrent decode step: one token per sequence (row s = sequence s, rows [0, max_seqs)), the same
/// per-token math as gdn_chunked_prefill, state slot state_slots[s] updated in place. Rows and slots of
/// sequences >= *num_seqs are neither read nor written. Throws moefold::Error on bad arguments or a launch
/// error. Asynchronous on `stream`.
void gdn_recurrent_decode(const GdnArgs& args, int max_seqs, const GdnDims& dims, cudaStream_t stream);


/// The conv step of gdn_decode_fused: causal_conv1d_silu_decode's arguments (causal_conv1d.h).
struct GdnDecodeConv {
  const __nv_bfloat16* x = nullptr;       ///< [rows, x_stride]: the conv input channels [q | k | v] (C of them)
  int64_t x_stride = 0;                   ///< elements between rows of x (>= C = 2 Hk dk + Hv dv)
  const __nv_bfloat16* w = nullptr;       ///< [C, K] depthwise taps
  __nv_bfloat16* state_pool = nullptr;    ///< [num_slots, C, K - 1] conv state, slot args.state_slots[s]
  int K = 0;                              ///< taps, 1..kMaxConvKernel
};

/// The gated RMSNorm of gdn_decode_fused: gated_rms_norm's arguments (gated_rms_norm.h) over dim dv.
struct GdnDecodeGatedNorm {
  const __nv_bfloat16* z = nullptr;  ///< [rows, z_stride]: gate z of value head h at z + r * z_stride + h * dv
  int64_t z_stride = 0;
  const __nv_bfloat16* w = nullptr;  ///< [dv] norm weight
  float eps = 0.0f;
  int tpr = 0;                       ///< set by gdn_decode_fused
};

/// One DeltaNet decode step from the in-projection's output to the out-projection's input in one launch:
/// for each live sequence s (row s), causal_conv1d_silu_decode of conv.x (conv state updated in place),
/// gdn_recurrent_decode of its output (args.q / k / v unused: the conv output stays on chip), then
/// gated_rms_norm(o, z) written to args.out: the same bits as those three launches. Sequences >= *num_seqs
/// are neither read nor written. Preconditions: gdn_decode_fused_supported (else moefold::Error).
/// Asynchronous on `stream`.
void gdn_decode_fused(const GdnArgs& args, const GdnDecodeConv& conv, const GdnDecodeGatedNorm& norm, int max_seqs,
                      const GdnDims& dims, cudaStream_t stream);

/// Whether gdn_decode_fused takes these arguments: dk <= 128, dv a multiple of 32 up to 256, K <= kMaxConvKernel,
/// the tiles of the Hv / Hk value heads of one key head at most 8 blocks (one cluster), the gated norm's buffers
/// 16-byte aligned with z_stride % 8 == 0.
bool gdn_decode_fused_supported(const GdnArgs& args, const GdnDecodeConv& conv, const GdnDecodeGatedNorm& norm,
                                int max_seqs, const GdnDims& dims);

/// Whether the CUDA executor runs a DeltaNet decode step through gdn_decode_fused: MOEFOLD_FUSE_GDN_DECODE=1
/// (read once). Off by default: on the H200 the fused launch made the 35B decode step slower (batch 1
/// 3.37 -> 3.42 ms, batch 64 21.8 -> 22.8 ms; docs/benchmarks.md, session 11): its conv, delta rule and norm
/// run one after another in each block, where the three launches overlapped under PDL.
bool gdn_decode_fused_enabled();

namespace detail {
/// gdn_recurrent_decode with the decode kernel chosen (tests, A/B timing): variant -1 = the automatic
/// choice, 0 = the former kernel (32 columns a block, state loaded after the q/k norm), 1 / 2 / 4 = the
/// current kernel with that many value columns a lane (2 and 4 need dk <= 128 and dv % (32 * variant)
/// == 0). All variants give the same bits. Throws moefold::Error on a bad variant or arguments.
void gdn_recurrent_decode_variant(const GdnArgs& args, int max_seqs, const GdnDims& dims, int variant,
                                  cudaStream_t stream);
/// Columns a lane of the automatic choice for `max_seqs` sequences of `dims` (1, 2 or 4).
int gdn_decode_auto_cols(int max_seqs, const GdnDims& dims);
}  // namespace detail

}  // namespace moefold::cuda
