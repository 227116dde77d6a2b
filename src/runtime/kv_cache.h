// Paged KV cache for the full-attention layers and the DeltaNet state pool for the linear-attention
// layers (CPU, fp32), with their allocators. Page layout: [num_blocks, block_size, kv_heads, head_dim]
// per attention layer for K and for V. State layout per linear layer and slot: conv [conv_dim, K-1],
// recurrent [Hv, dk, dv] fp32.
#pragma once
#include <cstdint>
#include <vector>

#include "io/model_config.h"

namespace moefold {

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
  KvCache(const ModelConfig& cfg, int32_t num_blocks, int32_t block_size);
  int32_t block_size, num_blocks;
  int64_t kv_dim;  ///< floats per token in k pages
  int64_t v_dim;   ///< floats per token in v pages (kv_dim, except for MLA)
  /// Indexed by layer; empty for linear-attention layers. MLA layers (DeepSeek-V3.2, ops/cpu/mla.h):
  /// k holds per token the latent and the rope key [kv_lora_rank | qk_rope], v the lightning
  /// indexer's key [index_head_dim].
  std::vector<std::vector<float>> k, v;
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
