// Internal to the CUDA attention ops: the prefill kernels called by attention_prefill (attention.cu):
// the mma.sync flash kernel (attention_flash.cu; AttnKernel::Flash, and Auto for head sizes wgmma
// does not take), the wgmma kernel (attention_wgmma.cu; Wgmma / WgmmaVt / WgmmaPipe, and Auto for
// head_dim 64/128/192/256 on pages the warp-specialised kernel does not take) and the
// warp-specialised TMA kernel (attention_ws.cu; Ws*, and Auto where it applies). Contract as attention.h.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/attention.h"

namespace moefold::cuda::detail {

/// Launch parameters of attn_fa_kernel (strides in elements, all resolved: no 0 = dense here).
struct FlashArgs {
  const bf16* q;
  int64_t q_ts, q_hs;
  const bf16* gate;  // nullptr: no output gate
  int64_t g_ts, g_hs;
  const bf16* kc;
  const bf16* vc;
  const int32_t* bt;
  int max_blocks;
  const int32_t* cu;
  const int32_t* ctx;
  bf16* out;
  int Hq, Hkv, G;         // query heads, KV heads, Hq / Hkv
  int HB, TB, head_chunks;  // q heads per tile, tokens per tile, tiles over a group's heads
  int block_size, bs_shift;  // bs_shift = log2(block_size) when a power of two, else -1
  int dh;                    // head_dim (<= the kernel's instance size; multiple of 16)
  int qtiles;
  float scale_log2;  // softmax scale * log2(e)
  bool vec_out = false;  // (ws kernels) out 16-byte aligned: rows stored in 16-byte pieces
};

/// Whether the flash kernel runs this head size: multiples of 16 from 16 to 256 (64, 80, 96, 128,
/// 192, 256 and 32 have their own instances; the others run on the next larger one, zero-padded).
bool flash_supports_head_dim(int head_dim);

/// Fills the tile fields of `a` (HB, TB, head_chunks, qtiles) for max_q_len and launches the
/// kernel. Throws moefold::Error for an unsupported head size or too many query tiles.
void launch_attention_flash(FlashArgs a, int num_seqs, int max_q_len, cudaStream_t stream);

/// The wgmma (sm_90a) variant of the same kernel (attention_wgmma.cu): head_dim 64, 128, 192, 256.
/// variant 0: V read MN-major; 1: V transposed through shared memory (K-major B); 2: as 0 with the
/// softmax of each tile overlapped with the previous tile's P V.
bool wgmma_supports_head_dim(int head_dim);
void launch_attention_wgmma(FlashArgs a, int num_seqs, int max_q_len, int variant, cudaStream_t stream);

/// Variants of the warp-specialised kernel (attention_ws.cu), for A/B timings. Default: the tuned
/// choice per head size (256: ping-pong between the consumer warpgroups + softmax overlapped with
/// P V inside each, 80-key tiles; 128: the overlap without ping-pong, Q in registers for Q K^T,
/// 128-key tiles; 64 / 192: both, Q in shared memory, 128 / 64-key tiles; 2 K/V stages).
/// NoPingPong / NoOverlap / Plain: without ping-pong / without the overlap / without both (Q in
/// shared memory); Stages3 (128): both with 3 stages; Bn64 (256): both on 64-key tiles; PingPong
/// (128): both; QRegs (128): the same as Default. A variant that does not apply to the head size
/// runs Default. V2 (128 and 256; elsewhere Default): Default's tiling and arithmetic (the same output
/// bits) with the producer issuing K(j) before V(j - 1) and each tile's block-table reads a tile
/// ahead, K pieces wholly past the block's last key left unwritten (masked anyway), the gate rows
/// prefetched into L2 and loaded all at once in the epilogue. Persist (128 and 256): V2 as a persistent
/// grid (a block per multiprocessor walking the query tiles, longest first, the K/V rings running on
/// from one tile to the next); the same bits. V2Tall / PersistTall (128 and 256): V2 / Persist with each
/// tile whose pages are consecutive in the cache loaded as one TMA box per 64 columns instead of one
/// per 16 keys (attention_ws.cuh load_tile; other tiles as before); the same bits.
enum class WsVariant { Default, NoPingPong, NoOverlap, Plain, Stages3, Bn64, PingPong, QRegs, V2, Persist, V2Tall, PersistTall };

/// Whether the warp-specialised kernel takes this head size and page size (64/128/192/256; pages of
/// a multiple of 16 tokens, so each 16-key piece of a tile is one TMA box).
bool ws_supports(int head_dim, int block_size);

/// Fills the tile fields of `a` and launches the warp-specialised kernel. Throws moefold::Error for
/// an unsupported head / page size, unaligned caches or too many query tiles.
void launch_attention_ws(FlashArgs a, int num_seqs, int max_q_len, WsVariant v, cudaStream_t stream);

/// WsVariant::Persist / PersistTall (`tall`; attention_ws_persist.cu), called by launch_attention_ws
/// with the tile fields of `a` filled; head_dim 128 or 256 (Error otherwise).
void launch_attention_ws_persist(const FlashArgs& a, int num_seqs, bool tall, cudaStream_t stream);

}  // namespace moefold::cuda::detail
