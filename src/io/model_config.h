// ModelConfig: everything the engine needs from config.json, parsed once, derived sizes in one place.
// Families: qwen3_5_moe (nested text_config or flat qwen3_5_moe_text), qwen3_next, qwen3_moe,
// qwen3 (dense), llama, deepseek_v32 (DeepSeek-V3.2 / V3.2-Exp). Field meanings follow the transformers configuration classes of each family.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/deepseek_config.h"

namespace moefold {

struct DeepseekV4Config;

enum class Family { Qwen3_5Moe, Qwen3Next, Qwen3Moe, Qwen3, Llama, DeepseekV32, DeepseekV4 };
enum class LayerType { FullAttention, LinearAttention };

std::string family_name(Family f);

struct ModelConfig {
  Family family = Family::Llama;
  std::string model_type;     ///< as written in config.json (the text model's, if nested)
  std::string tensor_prefix;  ///< "model.language_model." (Qwen3.5 release) or "model."

  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0;
  double rms_norm_eps = 1e-6;
  bool norm_zero_centred = false;  ///< y = x_hat * (1 + w) (Qwen3.5, Qwen3-Next) instead of x_hat * w
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;

  std::vector<LayerType> layer_types;  ///< [num_layers]
  std::vector<bool> layer_is_moe;      ///< [num_layers]; false: dense SwiGLU MLP of intermediate_size

  // Full attention.
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool attn_output_gate = false;  ///< q_proj also produces a per-dim sigmoid gate (Qwen3.5, Qwen3-Next)
  bool qk_norm = false;           ///< RMSNorm over head_dim on q and k before RoPE (all Qwen3 families)
  bool attention_bias = false;    ///< q/k/v (and for Llama o) projections carry a bias
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  int64_t rotary_dim = 0;  ///< head_dim * partial_rotary_factor, rotated half-split (NeoX style)
  // Llama-3 style RoPE frequency scaling (rope_type "llama3"); factor 0 = none.
  double rope_llama3_factor = 0, rope_llama3_low_freq = 1, rope_llama3_high_freq = 4;
  int64_t rope_llama3_original_max = 8192;

  // Gated DeltaNet (linear attention).
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0, linear_value_head_dim = 0, linear_conv_kernel_dim = 0;
  bool linear_fused_interleaved = false;  ///< Qwen3-Next in_proj_qkvz / in_proj_ba group-interleaved layout

  // MoE.
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  ///< 0 = no shared expert
  bool norm_topk_prob = true;
  // Dense MLP.
  int64_t intermediate_size = 0;
  bool mlp_bias = false;

  // DeepSeek-V3.2 (io/deepseek_config.h): MLA + lightning indexer, grouped routing, YaRN RoPE.
  MlaConfig mla;
  GroupedRoutingConfig grouped_routing;
  YarnRopeConfig yarn;

  std::vector<int32_t> eos_token_ids;  ///< generation_config.json's eos_token_id, else config's
  /// quantization_config.quant_method: "" (none) or "fp8" (block-scaled, weight_block_size [128, 128],
  /// dynamic activation scales: the Qwen3.x-FP8 releases); any other method fails to parse.
  std::string quant_method;

  /// deepseek_v4 only: the family's own config (io/deepseek_v4_config.h); the generic fields above hold
  /// vocab, hidden, layers, heads and head_dim, and its layers count as full attention.
  std::shared_ptr<const DeepseekV4Config> deepseek_v4;

  // Derived sizes.
  int64_t key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t q_proj_rows() const { return num_heads * head_dim * (attn_output_gate ? 2 : 1); }
  int64_t num_layers_of(LayerType t) const;
  /// KV-cache bytes per token over all full-attention layers for an element size of `elem_bytes`.
  int64_t kv_bytes_per_token(int64_t elem_bytes) const;
  /// DeltaNet state bytes per sequence: conv state (conv_elem_bytes) + recurrent state (fp32).
  int64_t deltanet_state_bytes_per_seq(int64_t conv_elem_bytes) const;

  /// Parses a config.json object (flat or with nested text_config). Throws Error for an unknown
  /// model_type or a missing/invalid field, naming it.
  static ModelConfig from_json(const nlohmann::json& j);
  /// Reads DIR/config.json and, if present, DIR/generation_config.json.
  static ModelConfig from_dir(const std::string& dir);
};

}  // namespace moefold
