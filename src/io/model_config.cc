#include "io/model_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moefold {

using json = nlohmann::json;

std::string family_name(Family f) {
  switch (f) {
    case Family::Qwen3_5Moe: return "qwen3_5_moe";
    case Family::Qwen3Next: return "qwen3_next";
    case Family::Qwen3Moe: return "qwen3_moe";
    case Family::Qwen3: return "qwen3";
    case Family::Llama: return "llama";
  }
  return "?";
}

int64_t ModelConfig::num_layers_of(LayerType t) const {
  int64_t n = 0;
  for (auto x : layer_types) n += x == t;
  return n;
}

int64_t ModelConfig::kv_bytes_per_token(int64_t elem_bytes) const {
  return num_layers_of(LayerType::FullAttention) * 2 * num_kv_heads * head_dim * elem_bytes;
}

int64_t ModelConfig::deltanet_state_bytes_per_seq(int64_t conv_elem_bytes) const {
  int64_t conv = (linear_conv_kernel_dim - 1) * conv_dim() * conv_elem_bytes;
  int64_t rec = linear_num_value_heads * linear_key_head_dim * linear_value_head_dim * 4;
  return num_layers_of(LayerType::LinearAttention) * (conv + rec);
}

namespace {

template <class T>
T req(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) fail("config.json: required field '{}' is missing", key);
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    fail("config.json: field '{}' has the wrong type ({})", key, j[key].dump());
  }
}
template <class T>
T opt(const json& j, const char* key, T def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    fail("config.json: field '{}' has the wrong type ({})", key, j[key].dump());
  }
}

std::vector<int32_t> ids_of(const json& v) {
  std::vector<int32_t> out;
  if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  if (v.is_array())
    for (auto& x : v) out.push_back(x.get<int32_t>());
  return out;
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& root) {
  ModelConfig c;
  std::string top_type = opt<std::string>(root, "model_type", "");
  const json& j = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  c.model_type = opt<std::string>(j, "model_type", top_type);
  const bool nested = &j != &root;

  if (c.model_type == "qwen3_5_moe" || c.model_type == "qwen3_5_moe_text") c.family = Family::Qwen3_5Moe;
  else if (c.model_type == "qwen3_next") c.family = Family::Qwen3Next;
  else if (c.model_type == "qwen3_moe") c.family = Family::Qwen3Moe;
  else if (c.model_type == "qwen3") c.family = Family::Qwen3;
  else if (c.model_type == "llama") c.family = Family::Llama;
  else
    fail("unknown model_type '{}' (supported: qwen3_5_moe, qwen3_5_moe_text, qwen3_next, qwen3_moe, qwen3, llama)",
         c.model_type.empty() ? top_type : c.model_type);
  c.tensor_prefix = nested || top_type == "qwen3_5_moe" ? "model.language_model." : "model.";

  c.vocab_size = req<int64_t>(j, "vocab_size");
  c.hidden_size = req<int64_t>(j, "hidden_size");
  c.num_layers = req<int64_t>(j, "num_hidden_layers");
  c.rms_norm_eps = opt<double>(j, "rms_norm_eps", 1e-6);
  c.max_position_embeddings = opt<int64_t>(j, "max_position_embeddings", 4096);
  c.tie_word_embeddings = opt<bool>(j, "tie_word_embeddings", opt<bool>(root, "tie_word_embeddings", false));
  c.num_heads = req<int64_t>(j, "num_attention_heads");
  c.num_kv_heads = opt<int64_t>(j, "num_key_value_heads", c.num_heads);
  c.head_dim = opt<int64_t>(j, "head_dim", c.hidden_size / c.num_heads);
  c.attention_bias = opt<bool>(j, "attention_bias", false);
  c.intermediate_size = opt<int64_t>(j, "intermediate_size", 0);
  c.mlp_bias = opt<bool>(j, "mlp_bias", false);

  const bool hybrid = c.family == Family::Qwen3_5Moe || c.family == Family::Qwen3Next;
  c.norm_zero_centred = hybrid;
  c.attn_output_gate = hybrid ? opt<bool>(j, "attn_output_gate", true) : false;
  c.qk_norm = c.family != Family::Llama;

  // RoPE: transformers v5 keeps theta and partial factor in rope_parameters; older files at top level.
  json rp = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
            : j.contains("rope_scaling") && j["rope_scaling"].is_object()   ? j["rope_scaling"]
                                                                             : json::object();
  c.rope_theta = opt<double>(rp, "rope_theta", opt<double>(j, "rope_theta", 10000.0));
  c.partial_rotary_factor = opt<double>(rp, "partial_rotary_factor", opt<double>(j, "partial_rotary_factor", 1.0));
  std::string rope_type = opt<std::string>(rp, "rope_type", opt<std::string>(rp, "type", "default"));
  if (rope_type == "llama3") {
    c.rope_llama3_factor = req<double>(rp, "factor");
    c.rope_llama3_low_freq = opt<double>(rp, "low_freq_factor", 1.0);
    c.rope_llama3_high_freq = opt<double>(rp, "high_freq_factor", 4.0);
    c.rope_llama3_original_max = opt<int64_t>(rp, "original_max_position_embeddings", 8192);
  } else if (rope_type != "default") {
    fail("config.json: rope_type '{}' is not supported (supported: default, llama3)", rope_type);
  }
  c.rotary_dim = int64_t(double(c.head_dim) * c.partial_rotary_factor);
  if (c.rotary_dim % 2 || c.rotary_dim <= 0 || c.rotary_dim > c.head_dim)
    fail("config.json: rotary dim {} (head_dim {} x partial_rotary_factor {}) must be even and in (0, head_dim]",
         c.rotary_dim, c.head_dim, c.partial_rotary_factor);

  // Layer types.
  c.layer_types.assign(size_t(c.num_layers), LayerType::FullAttention);
  if (hybrid) {
    if (j.contains("layer_types") && j["layer_types"].is_array()) {
      auto lt = j["layer_types"].get<std::vector<std::string>>();
      if (int64_t(lt.size()) != c.num_layers)
        fail("config.json: layer_types has {} entries but num_hidden_layers is {}", lt.size(), c.num_layers);
      for (size_t i = 0; i < lt.size(); ++i) {
        if (lt[i] == "linear_attention") c.layer_types[i] = LayerType::LinearAttention;
        else if (lt[i] != "full_attention") fail("config.json: unknown layer type '{}' at layer {}", lt[i], i);
      }
    } else {
      int64_t interval = opt<int64_t>(j, "full_attention_interval", 4);
      for (int64_t i = 0; i < c.num_layers; ++i)
        c.layer_types[size_t(i)] = (i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::LinearAttention;
    }
    c.linear_num_key_heads = req<int64_t>(j, "linear_num_key_heads");
    c.linear_num_value_heads = req<int64_t>(j, "linear_num_value_heads");
    c.linear_key_head_dim = req<int64_t>(j, "linear_key_head_dim");
    c.linear_value_head_dim = req<int64_t>(j, "linear_value_head_dim");
    c.linear_conv_kernel_dim = opt<int64_t>(j, "linear_conv_kernel_dim", 4);
    c.linear_fused_interleaved = c.family == Family::Qwen3Next;
    if (c.linear_num_value_heads % c.linear_num_key_heads)
      fail("config.json: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
           c.linear_num_value_heads, c.linear_num_key_heads);
  }

  // MoE placement.
  c.layer_is_moe.assign(size_t(c.num_layers), false);
  if (c.family == Family::Qwen3_5Moe || c.family == Family::Qwen3Next || c.family == Family::Qwen3Moe) {
    // transformers v5 writes Qwen3-MoE configs with num_local_experts; released files say num_experts.
    c.num_experts = j.contains("num_experts") ? req<int64_t>(j, "num_experts") : req<int64_t>(j, "num_local_experts");
    c.num_experts_per_tok = req<int64_t>(j, "num_experts_per_tok");
    c.moe_intermediate_size = req<int64_t>(j, "moe_intermediate_size");
    c.shared_expert_intermediate_size = opt<int64_t>(j, "shared_expert_intermediate_size", 0);
    // Qwen3.5 always renormalises the top-k weights; the others read norm_topk_prob.
    c.norm_topk_prob = c.family == Family::Qwen3_5Moe ? true : opt<bool>(j, "norm_topk_prob", false);
    int64_t step = opt<int64_t>(j, "decoder_sparse_step", 1);
    std::vector<int64_t> mlp_only = opt<std::vector<int64_t>>(j, "mlp_only_layers", {});
    for (int64_t i = 0; i < c.num_layers; ++i) {
      bool dense = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
      c.layer_is_moe[size_t(i)] = c.family == Family::Qwen3_5Moe ||
                                  (!dense && c.num_experts > 0 && step > 0 && (i + 1) % step == 0);
    }
    if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
      fail("config.json: num_experts_per_tok {} must be in [1, num_experts {}]", c.num_experts_per_tok, c.num_experts);
  }
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (!c.layer_is_moe[size_t(i)] && c.intermediate_size <= 0)
      fail("config.json: layer {} is a dense MLP but intermediate_size is missing", i);

  auto eos = j.contains("eos_token_id") ? j["eos_token_id"] : root.value("eos_token_id", json());
  c.eos_token_ids = ids_of(eos);
  if (c.num_heads % c.num_kv_heads) fail("config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}", c.num_heads, c.num_kv_heads);
  return c;
}

ModelConfig ModelConfig::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path p = fs::path(dir) / "config.json";
  if (!fs::exists(p)) fail("no config.json in model directory '{}'", dir);
  auto read = [](const fs::path& path) {
    std::ifstream f(path);
    try {
      return json::parse(f);
    } catch (const json::exception& e) {
      fail("'{}': malformed JSON: {}", path.string(), e.what());
    }
  };
  ModelConfig c = from_json(read(p));
  fs::path g = fs::path(dir) / "generation_config.json";
  if (fs::exists(g)) {
    json gj = read(g);
    if (gj.contains("eos_token_id")) {
      auto ids = ids_of(gj["eos_token_id"]);
      if (!ids.empty()) c.eos_token_ids = ids;
    }
  }
  return c;
}

}  // namespace moefold
