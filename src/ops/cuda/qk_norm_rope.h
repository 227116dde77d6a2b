// The prologue of a gated / plain attention layer after its q / k / v projection, in one launch: the
// per-head RMSNorm of q and k (Qwen3 / Qwen3.5 q_norm, k_norm), RoPE on both, and the K / V cache write:
// the bits of rms_norm (twice), apply_rope and kv_cache_write (elementwise.h, rope.h, attention.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/elementwise.h"  // HeadRows, NormKind
#include "ops/cuda/rope.h"

namespace moefold::cuda {

/// Buffers of qk_norm_rope_kv_write: q / k / v rows inside the projection output (HeadRows layouts,
/// heads = Hq / Hkv / Hkv), the norm weights [head_dim], and the layer's bf16 K / V cache pages.
struct QkNormRopeArgs {
  bf16* q = nullptr;
  HeadRows q_rows;
  bf16* k = nullptr;
  HeadRows k_rows;
  const bf16* v = nullptr;
  int64_t v_stride = 0;  ///< elements between tokens' v rows (0 = Hkv * head_dim)
  const bf16* q_norm = nullptr;
  const bf16* k_norm = nullptr;
  float eps = 0.0f;
  NormKind kind = NormKind::Plain;
  bf16* k_cache = nullptr;  ///< [slots, Hkv, head_dim]
  bf16* v_cache = nullptr;
  const int32_t* slot_mapping = nullptr;  ///< [max_rows]; a negative slot skips the row's cache write
  const int32_t* positions = nullptr;     ///< [max_rows]
};

/// For each live token t (t < *live_rows): q and k heads normalised in place (rms_norm with the head's
/// weights), rotated in place (apply_rope), then k and v written to their cache slot (kv_cache_write).
/// Padding tokens are neither read nor written. Preconditions: qk_norm_rope_supported (else moefold::Error).
/// Asynchronous on `stream`.
void qk_norm_rope_kv_write(const QkNormRopeArgs& a, int64_t max_rows, int64_t head_dim, const RopeFreqs& freqs,
                           const int32_t* live_rows, cudaStream_t stream);

/// Whether qk_norm_rope_kv_write takes these buffers: head_dim 64, 128 or 256 (a head row is one warp's
/// 8-element vectors, the norm's layout for these sizes), rotary_dim / 2 a multiple of 8, q / k / v and
/// the weights 16-byte aligned with strides multiples of 8, and MOEFOLD_FUSE_QK_ROPE not "0" (read once).
bool qk_norm_rope_supported(const QkNormRopeArgs& a, int64_t head_dim, const RopeFreqs& freqs);

}  // namespace moefold::cuda
