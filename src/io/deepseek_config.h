// The DeepSeek-V3.2 parts of ModelConfig: multi-head latent attention, the lightning indexer, grouped
// sigmoid routing and YaRN RoPE (config.json keys as released; transformers DeepseekV32Config).
#pragma once
#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace moefold {

struct ModelConfig;

/// YaRN RoPE (rope_scaling {"type": "yarn", ...}); factor 0 = plain RoPE.
struct YarnRopeConfig {
  double factor = 0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32, beta_slow = 1, mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
};

struct MlaConfig {
  int64_t q_lora_rank = 0, kv_lora_rank = 0;  ///< kv_lora_rank 0: not an MLA model
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;  ///< lightning indexer (DSA)
  double softmax_scale = 0;  ///< (qk_nope + qk_rope)^-1/2 times YaRN's mscale(s, mscale_all_dim)^2
  int64_t num_nextn_predict_layers = 0;  ///< MTP layers stored after the decoder layers (skipped)
  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  /// Floats per token and layer in the cache: the latent, the rope key and the indexer key.
  int64_t cache_floats_per_token() const { return kv_lora_rank + qk_rope_head_dim + index_head_dim; }
};

/// Grouped routing (topk_method "noaux_tc", scoring_func "sigmoid"); enabled = false: softmax top-k.
struct GroupedRoutingConfig {
  bool enabled = false;
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
};

/// Fills `c` from a deepseek_v32 config.json (flat). Throws Error naming the field for anything
/// missing, malformed or unsupported (e.g. q_lora_rank null, a topk_method other than noaux_tc, a
/// quantization other than 128x128 block FP8).
void parse_deepseek_v32(const nlohmann::json& j, ModelConfig& c);

}  // namespace moefold
