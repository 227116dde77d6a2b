// Paged KV cache for the full-attention layers and the DeltaNet state pool for the linear-attention
// layers (CPU), with their allocators. Page layout: [num_blocks, block_size, kv_heads, head_dim]
// per attention layer for K and for V, of the element type --kv-cache-dtype picks (auto: fp32 on the
// CPU backend, bf16 on the GPU; bfloat16; fp8 / fp8_e4m3: float8_e4m3fn with a dequantisation scale
// per (layer, KV head), ops/cpu/kv_quant.h). State layout per linear layer and slot: conv [conv_dim,
// K-1], recurrent [Hv, dk, dv] fp32 (whatever the KV cache dtype).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/model_config.h"
#include "ops/cpu/attention.h"

namespace moefold {

/// --kv-cache-dtype (vLLM's flag and names): auto = the model's compute dtype (fp32 on the CPU backend,
/// bf16 on the GPU), bfloat16, fp8 (= fp8_e4m3).
enum class KvCacheDtype : uint8_t { Auto, BFloat16, Fp8E4m3 };

/// Parses "auto", "bfloat16", "fp8" or "fp8_e4m3" ("" = auto); throws Error naming the choices otherwise.
KvCacheDtype parse_kv_cache_dtype(const std::string& s);
/// "auto", "bfloat16" or "fp8_e4m3".
std::string_view kv_cache_dtype_name(KvCacheDtype d);
/// The stored element type of `d` on the CPU backend (gpu false) or the GPU (gpu true).
cpu::KvElem kv_elem_for(KvCacheDtype d, bool gpu);
/// Bytes per stored element: 4, 2 or 1.
int64_t kv_elem_bytes(cpu::KvElem e);
/// "fp32", "bf16" or "fp8_e4m3".
std::string_view kv_elem_name(cpu::KvElem e);

/// Throws Error when `cfg` cannot store its KV cache as `d`: MLA (DeepSeek-V3.2: a latent cache read by
/// the lightning indexer) and DeepSeek-V4 (its compressed cache) keep the model's dtype, so anything
/// but auto is refused with a message saying so. `device` "cpu" or "cuda" (both store FP8 pages).
void check_kv_cache_dtype(const ModelConfig& cfg, KvCacheDtype d, const std::string& device);

/// KV pages of `block_size` tokens that `memory_bytes` holds for `cfg` with elements `e` (0 when a
/// page does not fit; -1 when the model has no paged KV cache). fp8 holds twice the pages of bf16.
int64_t kv_pages_for_memory(const ModelConfig& cfg, cpu::KvElem e, int64_t memory_bytes, int64_t block_size);

/// Fixed pool of KV pages shared by all sequences. allocate() returns -1 when the pool is empty.
class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);
  int32_t allocate();
  void release(int32_t block);
  int32_t num_free() const { return int32_t(free_.size()); }
  int32_t num_total() const { return total_; }

 private:
  int32_t total_;
  std::vector<int32_t> free_;
  std::vector<bool> used_;
};

struct KvCache {
  /// Pages of element type `elem` for every full-attention layer. Throws Error for a narrow `elem` on
  /// an MLA model (its latent pages stay fp32).
  KvCache(const ModelConfig& cfg, int32_t num_blocks, int32_t block_size, cpu::KvElem elem = cpu::KvElem::F32);
  int32_t block_size, num_blocks;
  int64_t kv_dim;  ///< elements per token in k pages
  int64_t v_dim;   ///< elements per token in v pages (kv_dim, except for MLA)
  int64_t num_kv_heads, head_dim;
  cpu::KvElem elem;
  /// fp32 pages (elem == F32), indexed by layer; empty for linear-attention layers. MLA layers
  /// (DeepSeek-V3.2, ops/cpu/mla.h): k holds per token the latent and the rope key [kv_lora_rank |
  /// qk_rope], v the lightning indexer's key [index_head_dim].
  std::vector<std::vector<float>> k, v;
  /// bf16 / e4m3 pages (elem != F32) as raw elements, indexed by layer like k, v.
  std::vector<std::vector<uint8_t>> k_narrow, v_narrow;
  /// Elements that saturated on store (FP8 pages: |x / scale| > 448) since creation; the first one
  /// is also reported on stderr.
  int64_t saturated = 0;
  /// 1 per KV head: the FP8 scale of a checkpoint without k_scale / v_scale (vLLM's default; e4m3 then
  /// holds |x| up to 448 and down to 2^-9, which covers the K and V of the supported models: docs/fp8.md).
  std::vector<float> unit_scale;
  /// Layer `l`'s pages for the attention ops; k_scale, v_scale [num_kv_heads] (FP8 pages; null: 1).
  /// The pointers must outlive the returned view.
  cpu::KvPages pages(size_t l, const float* k_scale = nullptr, const float* v_scale = nullptr);
  /// Adds `n` saturated elements of layer `l` (stderr line on the first).
  void count_saturated(size_t l, int64_t n);
};

struct StatePool {
  StatePool(const ModelConfig& cfg, int32_t num_slots);
  int32_t num_slots;
  int64_t conv_elems, rec_elems;  ///< per slot and layer
  /// Indexed by layer; empty for full-attention layers.
  std::vector<std::vector<float>> conv, recurrent;
  /// Zeroes slot `s` in every layer (a new sequence starts from the zero state).
  void reset(int32_t s);
  /// Copies slot `src` onto slot `dst` in every layer (bitwise). Throws Error for a slot out of range.
  void copy(int32_t src, int32_t dst);
  /// Bytes of one slot over all layers.
  int64_t slot_bytes() const;
  float* conv_state(size_t layer, int32_t s) { return conv[layer].data() + size_t(s) * size_t(conv_elems); }
  float* recurrent_state(size_t layer, int32_t s) { return recurrent[layer].data() + size_t(s) * size_t(rec_elems); }
};

}  // namespace moefold
