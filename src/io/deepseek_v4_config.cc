#include "io/deepseek_v4_config.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "io/config_fields.h"

namespace moefold {

using json = nlohmann::json;

namespace {

// The shared typed readers (io/config_fields.h): each names the field and the bound it broke.
using config_fields::present;
int64_t get_int(const json& j, const char* key, std::optional<int64_t> def, int64_t lo, int64_t hi) {
  return config_fields::int_field(j, key, def, lo, hi);
}
double get_num(const json& j, const char* key, std::optional<double> def, double lo, double hi) {
  return config_fields::num_field(j, key, def, lo, hi);
}
std::string get_str(const json& j, const char* key, const std::string& def) {
  return config_fields::str_field(j, key, def);
}

constexpr int64_t kBig = int64_t(1) << 20;

}  // namespace

double DeepseekV4Config::kv_bytes_per_token_bf16() const {
  double b = 0;
  for (int32_t r : compress_ratios) {
    if (r == 0) continue;  // window only: bounded, not per token
    b += double(head_dim) / r;
    if (r == 4) b += double(index_head_dim) / r;
  }
  return 2 * b;
}

DeepseekV4Config DeepseekV4Config::from_json(const json& j) {
  if (!j.is_object()) fail("config.json: expected a JSON object, not {}", j.type_name());
  for (const char* k : {"engram_layer_ids", "kv_source_layers", "index_source_layers", "candidate_topk_blocks",
                        "candidate_block_size"})
    if (j.contains(k))
      fail("config.json: field '{}' belongs to DeepSeek-V4.1 (Engram / shared KV sources), which is not supported; "
           "supported: DeepSeek-V4 and V4-Flash (model_type deepseek_v4)", k);
  if (present(j, "text_config")) fail("config.json (deepseek_v4): a nested text_config is not supported");
  DeepseekV4Config c;
  c.vocab_size = get_int(j, "vocab_size", std::nullopt, 1, int64_t(1) << 24);
  c.hidden_size = get_int(j, "hidden_size", std::nullopt, 1, int64_t(1) << 16);
  c.num_layers = get_int(j, "num_hidden_layers", std::nullopt, 1, 1024);
  c.num_heads = get_int(j, "num_attention_heads", std::nullopt, 1, 1024);
  if (get_int(j, "num_key_value_heads", 1, 1, 1024) != 1)
    fail("config.json (deepseek_v4): num_key_value_heads must be 1 (one shared K=V head)");
  c.head_dim = get_int(j, "head_dim", std::nullopt, 2, 4096);
  c.rope_dim = get_int(j, "qk_rope_head_dim", 64, 2, c.head_dim);
  if (present(j, "partial_rotary_factor") && !present(j, "qk_rope_head_dim"))
    c.rope_dim = int64_t(double(c.head_dim) * get_num(j, "partial_rotary_factor", 0.125, 1e-9, 1.0));
  if (c.rope_dim % 2) fail("config.json (deepseek_v4): qk_rope_head_dim {} must be even", c.rope_dim);
  c.q_lora_rank = get_int(j, "q_lora_rank", std::nullopt, 1, kBig);
  c.o_groups = get_int(j, "o_groups", std::nullopt, 1, c.num_heads);
  c.o_lora_rank = get_int(j, "o_lora_rank", std::nullopt, 1, kBig);
  if (c.num_heads % c.o_groups)
    fail("config.json (deepseek_v4): num_attention_heads {} is not a multiple of o_groups {}", c.num_heads, c.o_groups);
  c.num_experts = get_int(j, "n_routed_experts", std::nullopt, 1, int64_t(1) << 14);
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok", std::nullopt, 1, c.num_experts);
  c.moe_intermediate_size = get_int(j, "moe_intermediate_size", std::nullopt, 1, int64_t(1) << 18);
  if (get_int(j, "n_shared_experts", 1, 0, 64) != 1)
    fail("config.json (deepseek_v4): n_shared_experts must be 1 (one shared expert of moe_intermediate_size)");
  c.num_hash_layers = get_int(j, "num_hash_layers", 3, 0, c.num_layers);
  c.sliding_window = get_int(j, "sliding_window", std::nullopt, 1, kBig);
  c.index_n_heads = get_int(j, "index_n_heads", 64, 1, 1024);
  c.index_head_dim = get_int(j, "index_head_dim", 128, 2, 4096);
  if (c.index_head_dim < c.rope_dim)
    fail("config.json (deepseek_v4): index_head_dim {} is smaller than qk_rope_head_dim {}", c.index_head_dim, c.rope_dim);
  c.index_topk = get_int(j, "index_topk", 512, 1, kBig);
  c.hc_mult = get_int(j, "hc_mult", 4, 1, 64);
  c.hc_sinkhorn_iters = get_int(j, "hc_sinkhorn_iters", 20, 1, 1000);
  c.hc_eps = get_num(j, "hc_eps", 1e-6, 0, 1);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", 1048576, 1, INT32_MAX);
  c.rms_norm_eps = get_num(j, "rms_norm_eps", 1e-6, 0, 1);
  c.rope_theta = get_num(j, "rope_theta", 10000, 1e-9, 1e300);
  c.compress_rope_theta = get_num(j, "compress_rope_theta", 160000, 1e-9, 1e300);
  c.swiglu_limit = get_num(j, "swiglu_limit", 0, 0, 1e300);
  c.routed_scaling_factor = get_num(j, "routed_scaling_factor", 1.0, 0, 1e300);
  c.scoring_func = get_str(j, "scoring_func", "sqrtsoftplus");
  if (c.scoring_func != "sqrtsoftplus" && c.scoring_func != "sigmoid")
    fail("config.json (deepseek_v4): scoring_func '{}' is not supported (supported: sqrtsoftplus, sigmoid)",
         c.scoring_func);
  if (present(j, "tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() && j["tie_word_embeddings"].get<bool>())
    fail("config.json (deepseek_v4): tie_word_embeddings true is not supported (V4 ships a separate head)");

  const json* rs = present(j, "rope_scaling") ? &j["rope_scaling"] : nullptr;
  if (rs) {
    if (!rs->is_object()) fail("config.json (deepseek_v4): field 'rope_scaling' must be an object");
    const std::string type = get_str(*rs, "type", get_str(*rs, "rope_type", "default"));
    if (type == "yarn") {
      c.yarn_factor = get_num(*rs, "factor", std::nullopt, 1e-9, 1e300);
      c.yarn_beta_fast = get_num(*rs, "beta_fast", 32, 1e-9, 1e300);
      c.yarn_beta_slow = get_num(*rs, "beta_slow", 1, 1e-9, 1e300);
      c.yarn_original_max = get_int(*rs, "original_max_position_embeddings", std::nullopt, 1, INT32_MAX);
    } else if (type != "default") {
      fail("config.json (deepseek_v4): rope_scaling type '{}' is not supported (supported: yarn, default)", type);
    }
  }

  if (!present(j, "compress_ratios") || !j["compress_ratios"].is_array())
    fail("config.json (deepseek_v4): required field 'compress_ratios' (a list of per-layer ratios) is missing");
  const json& cr = j["compress_ratios"];
  // Releases list one ratio per layer plus entries for the MTP layers: the first num_layers apply.
  if (int64_t(cr.size()) < c.num_layers)
    fail("config.json (deepseek_v4): compress_ratios has {} entries but num_hidden_layers is {}", cr.size(),
         c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const json& v = cr[size_t(i)];
    if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 4 && v.get<int64_t>() != 128))
      fail("config.json (deepseek_v4): compress_ratios[{}] = {} is not supported (supported: 0, 4, 128; other ratios "
           "are DeepSeek-V4.1's)", i, v.dump());
    c.compress_ratios.push_back(v.get<int32_t>());
  }

  if (present(j, "quantization_config")) {
    const json& q = j["quantization_config"];
    if (!q.is_object()) fail("config.json (deepseek_v4): field 'quantization_config' must be an object");
    const std::string m = get_str(q, "quant_method", "");
    if (m != "fp8") fail("config.json (deepseek_v4): quantization_config.quant_method '{}' is not supported (fp8)", m);
    if (present(q, "weight_block_size")) {
      const json& b = q["weight_block_size"];
      if (b != json::array({128, 128}))
        fail("config.json (deepseek_v4): weight_block_size {} is not supported ([128, 128])", b.dump());
    }
    c.fp8_weights = true;
  }
  const std::string ed = get_str(j, "expert_dtype", "");
  if (!ed.empty() && ed != "fp4" && ed != "fp8" && ed != "bf16")
    fail("config.json (deepseek_v4): expert_dtype '{}' is not supported (fp4, fp8, bf16)", ed);
  c.fp4_experts = ed == "fp4";

  if (present(j, "eos_token_id")) c.eos_token_ids = config_fields::ids_of(j["eos_token_id"], "config.json");
  return c;
}

}  // namespace moefold
