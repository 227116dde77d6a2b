#include "runtime/kv_cache.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace moefold {

KvCacheDtype parse_kv_cache_dtype(const std::string& s) {
  if (s.empty() || s == "auto") return KvCacheDtype::Auto;
  if (s == "bfloat16") return KvCacheDtype::BFloat16;
  if (s == "fp8" || s == "fp8_e4m3") return KvCacheDtype::Fp8E4m3;
  fail("--kv-cache-dtype {}: expected auto, bfloat16, fp8 or fp8_e4m3", s);
}

std::string_view kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::Auto: return "auto";
    case KvCacheDtype::BFloat16: return "bfloat16";
    case KvCacheDtype::Fp8E4m3: return "fp8_e4m3";
  }
  return "?";
}

cpu::KvElem kv_elem_for(KvCacheDtype d, bool gpu) {
  switch (d) {
    case KvCacheDtype::Auto: return gpu ? cpu::KvElem::BF16 : cpu::KvElem::F32;
    case KvCacheDtype::BFloat16: return cpu::KvElem::BF16;
    case KvCacheDtype::Fp8E4m3: return cpu::KvElem::F8E4M3;
  }
  return cpu::KvElem::F32;
}

int64_t kv_elem_bytes(cpu::KvElem e) { return e == cpu::KvElem::F32 ? 4 : e == cpu::KvElem::BF16 ? 2 : 1; }

std::string_view kv_elem_name(cpu::KvElem e) {
  return e == cpu::KvElem::F32 ? "fp32" : e == cpu::KvElem::BF16 ? "bf16" : "fp8_e4m3";
}

void check_kv_cache_dtype(const ModelConfig& cfg, KvCacheDtype d, const std::string& device) {
  if (d == KvCacheDtype::Auto) return;
  if (cfg.deepseek_v4)
    fail("--kv-cache-dtype {}: DeepSeek-V4 keeps its compressed KV cache in the model's dtype; use auto",
         kv_cache_dtype_name(d));
  if (cfg.mla.enabled())
    fail("--kv-cache-dtype {}: MLA models (DeepSeek-V3.2) keep their latent KV cache and indexer keys in the "
         "model's dtype (the FP8 KV cache covers grouped-query attention only); use auto",
         kv_cache_dtype_name(d));
  (void)device;  // both backends store FP8 pages
}

int64_t kv_pages_for_memory(const ModelConfig& cfg, cpu::KvElem e, int64_t memory_bytes, int64_t block_size) {
  const int64_t per_page = cfg.kv_bytes_per_token(kv_elem_bytes(e)) * block_size;
  if (per_page <= 0) return -1;
  return memory_bytes / per_page;
}

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

KvCache::KvCache(const ModelConfig& cfg, int32_t nb, int32_t bs, cpu::KvElem e)
    : block_size(bs),
      num_blocks(nb),
      kv_dim(cfg.mla.enabled() ? cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim : cfg.num_kv_heads * cfg.head_dim),
      v_dim(cfg.mla.enabled() ? cfg.mla.index_head_dim : kv_dim),
      num_kv_heads(cfg.num_kv_heads),
      head_dim(cfg.head_dim),
      elem(e),
      unit_scale(size_t(std::max<int64_t>(cfg.num_kv_heads, 1)), 1.0f) {
  MOEFOLD_CHECK(!cfg.mla.enabled() || e == cpu::KvElem::F32,
                "KV cache: MLA layers keep fp32 latent pages on the CPU backend, not {}", kv_elem_name(e));
  k.resize(size_t(cfg.num_layers));
  v.resize(size_t(cfg.num_layers));
  k_narrow.resize(size_t(cfg.num_layers));
  v_narrow.resize(size_t(cfg.num_layers));
  const size_t tokens = size_t(nb) * size_t(bs);
  for (size_t l = 0; l < k.size(); ++l) {
    if (cfg.layer_types[l] != LayerType::FullAttention) continue;
    if (e == cpu::KvElem::F32) {
      k[l].assign(tokens * size_t(kv_dim), 0.0f);
      v[l].assign(tokens * size_t(v_dim), 0.0f);
    } else {
      k_narrow[l].assign(tokens * size_t(kv_dim) * size_t(kv_elem_bytes(e)), 0);
      v_narrow[l].assign(tokens * size_t(v_dim) * size_t(kv_elem_bytes(e)), 0);
    }
  }
}

cpu::KvPages KvCache::pages(size_t l, const float* k_scale, const float* v_scale) {
  cpu::KvPages p;
  p.elem = elem;
  p.k = elem == cpu::KvElem::F32 ? static_cast<void*>(k[l].data()) : static_cast<void*>(k_narrow[l].data());
  p.v = elem == cpu::KvElem::F32 ? static_cast<void*>(v[l].data()) : static_cast<void*>(v_narrow[l].data());
  p.k_scale = k_scale ? k_scale : unit_scale.data();
  p.v_scale = v_scale ? v_scale : unit_scale.data();
  p.block_size = block_size, p.num_kv_heads = num_kv_heads, p.head_dim = head_dim;
  return p;
}

void KvCache::count_saturated(size_t l, int64_t n) {
  if (n <= 0) return;
  if (saturated == 0)
    std::fprintf(stderr,
                 "moefold: warning: FP8 KV cache: %lld K/V elements of layer %zu exceeded 448 x their scale and were "
                 "saturated to +-448 (further saturations are counted, not printed)\n",
                 (long long)n, l);
  saturated += n;
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
