#include "runtime/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace moefold {

BlockAllocator::BlockAllocator(int32_t num_blocks) : total_(num_blocks), used_(size_t(num_blocks), false) {
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockAllocator::allocate() {
  if (free_.empty()) return -1;
  int32_t b = free_.back();
  free_.pop_back();
  used_[size_t(b)] = true;
  return b;
}

void BlockAllocator::release(int32_t b) {
  MOEFOLD_CHECK(b >= 0 && b < total_ && used_[size_t(b)], "BlockAllocator: release of block {} that is not allocated", b);
  used_[size_t(b)] = false;
  free_.push_back(b);
}

KvCache::KvCache(const ModelConfig& cfg, int32_t nb, int32_t bs)
    : block_size(bs),
      num_blocks(nb),
      kv_dim(cfg.mla.enabled() ? cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim : cfg.num_kv_heads * cfg.head_dim),
      v_dim(cfg.mla.enabled() ? cfg.mla.index_head_dim : kv_dim) {
  k.resize(size_t(cfg.num_layers));
  v.resize(size_t(cfg.num_layers));
  for (size_t l = 0; l < k.size(); ++l)
    if (cfg.layer_types[l] == LayerType::FullAttention) {
      k[l].assign(size_t(nb) * size_t(bs) * size_t(kv_dim), 0.0f);
      v[l].assign(size_t(nb) * size_t(bs) * size_t(v_dim), 0.0f);
    }
}

StatePool::StatePool(const ModelConfig& cfg, int32_t n)
    : num_slots(n),
      conv_elems(cfg.conv_dim() * std::max<int64_t>(cfg.linear_conv_kernel_dim - 1, 0)),
      rec_elems(cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim) {
  conv.resize(size_t(cfg.num_layers));
  recurrent.resize(size_t(cfg.num_layers));
  for (size_t l = 0; l < conv.size(); ++l)
    if (cfg.layer_types[l] == LayerType::LinearAttention) {
      conv[l].assign(size_t(n) * size_t(conv_elems), 0.0f);
      recurrent[l].assign(size_t(n) * size_t(rec_elems), 0.0f);
    }
}

void StatePool::reset(int32_t s) {
  MOEFOLD_CHECK(s >= 0 && s < num_slots, "StatePool: slot {} out of range [0, {})", s, num_slots);
  for (size_t l = 0; l < conv.size(); ++l)
    if (!conv[l].empty()) {
      std::fill_n(conv_state(l, s), conv_elems, 0.0f);
      std::fill_n(recurrent_state(l, s), rec_elems, 0.0f);
    }
}

void StatePool::copy(int32_t src, int32_t dst) {
  MOEFOLD_CHECK(src >= 0 && src < num_slots && dst >= 0 && dst < num_slots,
                "StatePool: copy of slot {} to {} outside [0, {})", src, dst, num_slots);
  if (src == dst) return;
  for (size_t l = 0; l < conv.size(); ++l)
    if (!conv[l].empty()) {
      std::copy_n(conv_state(l, src), conv_elems, conv_state(l, dst));
      std::copy_n(recurrent_state(l, src), rec_elems, recurrent_state(l, dst));
    }
}

int64_t StatePool::slot_bytes() const {
  int64_t layers = 0;
  for (const auto& c : conv) layers += c.empty() ? 0 : 1;
  return layers * (conv_elems + rec_elems) * int64_t(sizeof(float));
}

}  // namespace moefold
