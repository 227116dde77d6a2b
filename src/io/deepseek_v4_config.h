// DeepSeek-V4 / V4-Flash config.json (model_type deepseek_v4) as released, with the meanings of
// transformers 5.17's DeepseekV4Config: per-layer compress ratios (0 sliding window only, 4 compressed
// sparse attention with the Lightning Indexer, 128 heavily compressed attention), the first
// num_hash_layers MoE layers routed by a token-id table, mHC residual streams, grouped low-rank output.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moefold {

struct DeepseekV4Config {
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0;
  int64_t num_heads = 0, head_dim = 0, rope_dim = 0;     ///< rope_dim: qk_rope_head_dim (trailing dims)
  int64_t q_lora_rank = 0, o_groups = 0, o_lora_rank = 0;
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0, num_hash_layers = 0;
  int64_t sliding_window = 0;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int64_t hc_mult = 0, hc_sinkhorn_iters = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, hc_eps = 1e-6;
  double rope_theta = 10000, compress_rope_theta = 160000;
  /// YaRN on the compressed layers' RoPE (factor 0: plain RoPE); attention factor is 1 as in V4.
  double yarn_factor = 0, yarn_beta_fast = 32, yarn_beta_slow = 1;
  int64_t yarn_original_max = 0;
  double swiglu_limit = 0;            ///< 0: no clamp
  double routed_scaling_factor = 1;
  std::string scoring_func;           ///< "sqrtsoftplus" or "sigmoid"
  std::vector<int32_t> compress_ratios;  ///< [num_layers], each 0, 4 or 128
  bool fp8_weights = false;           ///< quantization_config fp8: 128x128 blocks, E8M0 (or fp32) scales
  bool fp4_experts = false;           ///< expert_dtype fp4: two e2m1 per byte, per-32 E8M0 scales
  std::vector<int32_t> eos_token_ids;

  bool is_hash_layer(int64_t layer) const { return layer < num_hash_layers; }
  /// Window + compressed KV bytes per token (bf16) averaged over a long context: each layer keeps
  /// at most sliding_window window entries, plus one head_dim entry per ratio tokens (CSA also its
  /// index_head_dim indexer key).
  double kv_bytes_per_token_bf16() const;

  /// Parses a deepseek_v4 config.json. Throws Error naming the field for a missing or invalid field,
  /// and for variants this engine does not implement (DeepSeek-V4.1: Engram / shared KV sources,
  /// compress ratios other than 0, 4, 128; more than one shared expert; more than one KV head).
  static DeepseekV4Config from_json(const nlohmann::json& j);
};

}  // namespace moefold
