// Attention over the paged KV cache on the GPU: KV-cache write, prefill (flash-style, causal, GQA,
// several sequences of different lengths in one launch, each chunk attending to its earlier cached
// pages plus itself) and decode (one query row per sequence, split over the KV length with a
// log-sum-exp combine). Math as ops/cpu/attention.h (cpu::paged_attention); the output gate of
// Qwen3.5's gated attention (o * sigmoid(gate), design doc 4.3 step 6) can be fused.
//
// KV cache layout, per attention layer (same as the CPU's): k_cache, v_cache bf16
// [num_blocks, block_size, kv_heads, head_dim]; token p of sequence s lives in page
// block_tables[s * max_blocks_per_seq + p / block_size], slot p % block_size.
//
// Batch description (ForwardBatch, uploaded once per step; all device int32):
//   cu_seqlens [S + 1]: sequence s owns query rows [cu_seqlens[s], cu_seqlens[s+1]) (prefill);
//   context_lens [S]: tokens already cached BEFORE this step; the query rows of s are at positions
//     context_lens[s] + i and attend causally to keys 0 .. context_lens[s] + i, all read from the
//     cache, so kv_cache_write of this step's K/V must run first.
//   Padding: a prefill sequence with no rows (cu_seqlens[s+1] == cu_seqlens[s]), a decode sequence
//   with context_lens[s] < 0, and query rows >= cu_seqlens[S] are not touched (their output rows
//   keep whatever they held), so a batch padded to a captured bucket replays correctly.
//
// Kernels. Rows of a block are (token, q head) pairs of ONE KV head, so all GQA heads of a token
// share each K/V tile read. Prefill (default): tensor cores, flash-attention structure (128 rows
// per block, causal mask only on diagonal tiles, longest tiles first), fp32 accumulation and online
// softmax. For head_dim 64/128/192/256 on pages of a multiple of 16 tokens: the warp-specialised
// wgmma kernel (attention_ws.cu: a TMA producer warp fills K/V rings on mbarriers, two consumer
// warpgroups compute); other pages of those head sizes: the wgmma kernel with cp.async gathers
// (attention_wgmma.cu); other multiples of 16: mma.sync m16n8k16 (attention_flash.cu). The
// probabilities P are rounded to bf16 for the P.V product (as FlashAttention does).
// AttnKernel::TensorCore keeps the older 64-row kernel.
// Decode, and prefill with AttnKernel::Simt: CUDA cores, q.k and p.v in fp32 (P never rounded),
// 32-key tiles, 4 rows per warp, split over the KV length for decode. Softmax statistics are fp32
// throughout (online softmax on exp2 of log2e-scaled scores); the output is rounded once to bf16.
//
// Preconditions (checked on the host; Error otherwise): head_dim a multiple of 16 up to 256 for
// the default prefill kernel, in {32, 64, 96, 128, 192, 256} for decode and the older prefill
// variants;
// num_heads % num_kv_heads == 0; q, gate, out, caches 16-byte aligned and strides multiples of 8
// elements; block tables cover every position they are asked for (entries past a sequence's
// length are never read).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moefold::cuda {

using bf16 = __nv_bfloat16;

/// Kernel choice for attention_prefill (decode always uses the split CUDA-core kernel).
/// Auto: on pages of a multiple of 16 tokens WsV2Tall for head_dim 128 and 256, Ws for 64/192 (the same
/// bits as Ws everywhere), else Wgmma for those
/// head sizes, Flash for the other multiples of 16. Flash: the mma.sync
/// kernel of attention_flash.cu (128-row tiles, double-buffered K/V, every multiple of 16 up to 256).
/// Wgmma / WgmmaVt: the same tiling on Hopper warpgroup MMA (attention_wgmma.cu; V read MN-major /
/// transposed through shared memory); WgmmaPipe: Wgmma with each tile's softmax overlapped with the
/// previous tile's P V. Ws: the warp-specialised kernel (attention_ws.cu: a TMA producer warp, K/V
/// rings on mbarriers, two consumer warpgroups ping-ponging with the softmax overlapped with P V;
/// head_dim 64/128/192/256 on pages of a multiple of 16 tokens); WsNoPingPong,
/// WsNoOverlap, WsPlain, WsStages3, WsBn64, WsPingPong, WsQRegs, WsV2: its A/B variants (attention_flash.h,
/// WsVariant; WsV2 gives Ws's bits with a reordered producer and a faster gated epilogue, WsPersist the
/// same as a persistent grid; WsV2Tall / WsPersistTall: those two with one TMA box per 64 columns for
/// each tile whose pages are consecutive in the cache, the same bits). TensorCore: the
/// older 64-row mma.sync kernel. Simt keeps the CUDA-core kernel (fp32 P, the reference-like variant).
enum class AttnKernel {
  Auto,
  Flash,
  Wgmma,
  WgmmaVt,
  TensorCore,
  Simt,
  WgmmaPipe,
  Ws,
  WsNoPingPong,
  WsNoOverlap,
  WsPlain,
  WsStages3,
  WsBn64,
  WsPingPong,
  WsQRegs,
  WsV2,
  WsPersist,
  WsV2Tall,
  WsPersistTall
};

/// Whether a model of this head size runs on the GPU: attention_prefill (Auto / Flash) takes every
/// multiple of 16 from 16 to 256, attention_decode 32, 64, 96, 128, 192 and 256; true for the
/// sizes both take. Checked by the executor at load so that an unsupported model fails clearly.
bool attention_supports_head_dim(int head_dim);

/// Shapes and the layouts of q and of the optional output gate.
struct AttentionShape {
  int num_heads = 0;     ///< query heads Hq
  int num_kv_heads = 0;  ///< KV heads Hkv (Hq % Hkv == 0; q head h reads KV head h / (Hq / Hkv))
  int head_dim = 0;      ///< D
  int block_size = 0;    ///< tokens per KV page
  float scale = 0;       ///< softmax scale; 0 = 1/sqrt(D)
  /// q row (t, h) at q + t * q_token_stride + h * q_head_stride (0 = dense [T, Hq, D]). Qwen3.5's
  /// fused q_proj output [T, Hq, 2D] is read in place with {2*Hq*D, 2*D}.
  int64_t q_token_stride = 0, q_head_stride = 0;
  /// Optional output gate: out = o * sigmoid(gate), gate (t, h) at gate + t * gate_token_stride +
  /// h * gate_head_stride (0 = dense). For Qwen3.5: gate = qg + D with the q strides above.
  const bf16* gate = nullptr;
  int64_t gate_token_stride = 0, gate_head_stride = 0;
  /// Prefill kernel variant (tests and benchmarks compare them).
  AttnKernel kernel = AttnKernel::Auto;
  /// The caller needs per-row bits that do not depend on where a sequence's query rows start or what
  /// else the launch holds (a prompt row alone == the same row resumed after a cached prefix). Auto's
  /// choice is the same either way: the warp-specialised and wgmma kernels keep a row's bits (a key
  /// tile wholly past a row's last key rescales by exactly 1; tests/cuda/attention_invariance_test.cu).
  bool batch_invariant = false;
};

/// Writes this step's K and V rows into their cache slots: for rows r < live,
/// k_cache[slot_mapping[r]] = k[r], v_cache[...] = v[r] (kv_dim = kv_heads * head_dim elements
/// each). k / v rows at k + r * k_stride, v + r * v_stride (0 = kv_dim). slot = page * block_size +
/// offset; a negative slot skips the row (padding). live_rows: device count or nullptr.
void kv_cache_write(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride, bf16* k_cache,
                    bf16* v_cache, const int32_t* slot_mapping, int64_t max_rows, int64_t kv_dim,
                    const int32_t* live_rows, cudaStream_t stream);

/// FP8 pages (--kv-cache-dtype fp8; ops/cpu/kv_quant.h is the definition): as kv_cache_write, each
/// element stored as e4m3(float(x) / scale[h]) (an IEEE division, round to nearest even, saturating to
/// +-448; NaN stays NaN) with h the element's KV head; k_scale, v_scale: device [num_kv_heads].
/// Elements with |x / scale| > 448 (infinities included) are added to *saturated (device counter; may
/// be null). The same bits as cpu::kv_cache_write over the same fp32 inputs.
void kv_cache_write_fp8(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride, uint8_t* k_cache,
                        uint8_t* v_cache, const int32_t* slot_mapping, int64_t max_rows, int num_kv_heads,
                        int head_dim, const float* k_scale, const float* v_scale, unsigned long long* saturated,
                        const int32_t* live_rows, cudaStream_t stream);

/// slot_mapping[r] for every query row of the batch, computed on the device from the block tables:
/// row cu_seqlens[s] + i -> position context_lens[s] + i -> its page slot. Rows not covered by any
/// sequence are not written (initialise them to -1 once). max_q_len: host bound on any sequence's
/// row count.
void compute_slot_mapping(const int32_t* cu_seqlens, const int32_t* context_lens, const int32_t* block_tables,
                          int max_blocks_per_seq, int block_size, int num_seqs, int max_q_len,
                          int32_t* slot_mapping, cudaStream_t stream);

/// Prefill (or mixed) attention: out[r, h, :] for every query row r of every sequence, dense
/// [rows, Hq, D] bf16. num_seqs: host count of sequences in the arrays (padding sequences have no
/// rows); max_q_len: host upper bound on any sequence's row count (sizes the grid; rows beyond it
/// would not be computed).
void attention_prefill(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int32_t* block_tables,
                       int max_blocks_per_seq, const int32_t* cu_seqlens, const int32_t* context_lens, int num_seqs,
                       int max_q_len, bf16* out, const AttentionShape& shape, cudaStream_t stream);

/// attention_prefill over FP8 pages (e4m3 bytes, k_scale / v_scale: device [num_kv_heads]): the
/// CUDA-core kernel (AttnKernel::Simt's; shape.kernel is ignored), K and V dequantised in registers
/// (e4m3 -> fp32 exactly, times the head's scale), q.k and p.v in fp32, P never rounded. Every query
/// row reads its keys from the pages, this step's included, so a resumed prompt gives the bits of a
/// cold one. head_dim as attention_decode.
void attention_prefill_fp8(const bf16* q, const uint8_t* k_cache, const uint8_t* v_cache, const float* k_scale,
                           const float* v_scale, const int32_t* block_tables, int max_blocks_per_seq,
                           const int32_t* cu_seqlens, const int32_t* context_lens, int num_seqs, int max_q_len,
                           bf16* out, const AttentionShape& shape, cudaStream_t stream);

/// Bytes of workspace attention_decode needs for these host bounds (0 when no split is used).
size_t attention_decode_workspace_bytes(int num_seqs, const AttentionShape& shape, int64_t max_kv_len);

/// Decode attention: one query row per sequence (row s of q and out belongs to sequence s), over
/// kv_len = context_lens[s] + 1 cached keys (this step's K/V already written). The KV range is
/// split into chunks processed by separate blocks (flash-decoding) and merged by a log-sum-exp
/// combine kernel. The chunking of a sequence depends on its own kv_len alone (chunks of a multiple
/// of 32 keys, at most 64 of them), so each sequence's output is bitwise the same whatever else the
/// batch holds (batch invariance). max_kv_len: host bound on kv_len that sizes the grid and the
/// workspace (a longer sequence is still computed correctly, its last chunk taking the rest, but is
/// then no longer batch-invariant). workspace: device memory of at least
/// attention_decode_workspace_bytes(num_seqs, shape, max_kv_len) bytes.
void attention_decode(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int32_t* block_tables,
                      int max_blocks_per_seq, const int32_t* context_lens, int num_seqs, int64_t max_kv_len,
                      bf16* out, const AttentionShape& shape, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);

/// attention_decode over FP8 pages (as attention_prefill_fp8): the same kernel and splits, K and V
/// dequantised in registers; the same workspace.
void attention_decode_fp8(const bf16* q, const uint8_t* k_cache, const uint8_t* v_cache, const float* k_scale,
                          const float* v_scale, const int32_t* block_tables, int max_blocks_per_seq,
                          const int32_t* context_lens, int num_seqs, int64_t max_kv_len, bf16* out,
                          const AttentionShape& shape, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace moefold::cuda
