#include "io/model_config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config_fields.h"
#include "io/deepseek_v4_config.h"

namespace moefold {

using json = nlohmann::json;

std::string family_name(Family f) {
  switch (f) {
    case Family::Qwen3_5Moe: return "qwen3_5_moe";
    case Family::Qwen3Next: return "qwen3_next";
    case Family::Qwen3Moe: return "qwen3_moe";
    case Family::Qwen3: return "qwen3";
    case Family::Llama: return "llama";
    case Family::DeepseekV4: return "deepseek_v4";
    case Family::DeepseekV32: return "deepseek_v32";
  }
  return "?";
}

int64_t ModelConfig::num_layers_of(LayerType t) const {
  int64_t n = 0;
  for (auto x : layer_types) n += x == t;
  return n;
}

int64_t ModelConfig::kv_bytes_per_token(int64_t elem_bytes) const {
  if (deepseek_v4) return int64_t(std::llround(deepseek_v4->kv_bytes_per_token_bf16() * double(elem_bytes) / 2.0));
  if (mla.enabled()) return num_layers * mla.cache_floats_per_token() * elem_bytes;
  return num_layers_of(LayerType::FullAttention) * 2 * num_kv_heads * head_dim * elem_bytes;
}

int64_t ModelConfig::deltanet_state_bytes_per_seq(int64_t conv_elem_bytes) const {
  int64_t conv = (linear_conv_kernel_dim - 1) * conv_dim() * conv_elem_bytes;
  int64_t rec = linear_num_value_heads * linear_key_head_dim * linear_value_head_dim * 4;
  return num_layers_of(LayerType::LinearAttention) * (conv + rec);
}

namespace config_fields {  // declared in io/config_fields.h (shared with the per-family parsers)

// The size limits (kMax*) live in io/config_fields.h.

bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

/// An integer field in [lo, hi]; `def` when absent (nullopt: required). Floats such as 128.5 or 128.0,
/// strings, booleans and integers outside int64 are errors naming the field.
int64_t int_field(const json& j, const char* key, std::optional<int64_t> def, int64_t lo, int64_t hi) {
  if (!present(j, key)) {
    if (!def) fail("config.json: required field '{}' is missing", key);
    return *def;
  }
  const json& v = j[key];
  if (!v.is_number_integer()) fail("config.json: field '{}' must be an integer, not {}", key, v.dump());
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    fail("config.json: field '{}' = {} is out of range [{}, {}]", key, v.dump(), lo, hi);
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) fail("config.json: field '{}' = {} is out of range [{}, {}]", key, x, lo, hi);
  return x;
}
int64_t req_int(const json& j, const char* key, int64_t lo, int64_t hi) { return int_field(j, key, std::nullopt, lo, hi); }
int64_t opt_int(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) { return int_field(j, key, def, lo, hi); }

/// A finite number field in [lo, hi] (integers accepted), or `def` when absent (nullopt: required).
double num_field(const json& j, const char* key, std::optional<double> def, double lo, double hi) {
  if (!present(j, key)) {
    if (!def) fail("config.json: required field '{}' is missing", key);
    return *def;
  }
  const json& v = j[key];
  if (!v.is_number()) fail("config.json: field '{}' must be a number, not {}", key, v.dump());
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) fail("config.json: field '{}' = {} is out of range [{}, {}]", key, x, lo, hi);
  return x;
}

bool bool_field(const json& j, const char* key, bool def) {
  if (!present(j, key)) return def;
  if (!j[key].is_boolean()) fail("config.json: field '{}' must be true or false, not {}", key, j[key].dump());
  return j[key].get<bool>();
}

std::string str_field(const json& j, const char* key, const std::string& def) {
  if (!present(j, key)) return def;
  if (!j[key].is_string()) fail("config.json: field '{}' must be a string, not {}", key, j[key].dump());
  return j[key].get<std::string>();
}

/// eos_token_id: one token id or a list of them (each in [0, INT32_MAX]); anything else names `where`.
std::vector<int32_t> ids_of(const json& v, const char* where) {
  std::vector<int32_t> out;
  if (v.is_null()) return out;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || (!x.is_number_unsigned() && x.get<int64_t>() < 0) ||
        (x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT32_MAX)))
      fail("{}: field 'eos_token_id' must hold token ids (integers in [0, {}]), not {}", where, INT32_MAX, x.dump());
    out.push_back(x.get<int32_t>());
  };
  if (v.is_array())
    for (auto& x : v) one(x);
  else
    one(v);
  return out;
}

}  // namespace config_fields

using namespace config_fields;

ModelConfig ModelConfig::from_json(const json& root) {
  if (!root.is_object()) fail("config.json: expected a JSON object, not {}", root.type_name());
  ModelConfig c;
  std::string top_type = str_field(root, "model_type", "");
  const json& j = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  c.model_type = str_field(j, "model_type", top_type);
  const bool nested = &j != &root;
  if (c.model_type == "deepseek_v4") {  // its own parser; the generic fields are filled for shared tools
    auto d = std::make_shared<DeepseekV4Config>(DeepseekV4Config::from_json(root));
    c.family = Family::DeepseekV4;
    c.vocab_size = d->vocab_size;
    c.hidden_size = d->hidden_size;
    c.num_layers = d->num_layers;
    c.num_heads = d->num_heads;
    c.num_kv_heads = 1;
    c.head_dim = d->head_dim;
    c.rms_norm_eps = d->rms_norm_eps;
    c.max_position_embeddings = d->max_position_embeddings;
    c.rotary_dim = d->rope_dim;
    c.num_experts = d->num_experts;
    c.num_experts_per_tok = d->num_experts_per_tok;
    c.moe_intermediate_size = d->moe_intermediate_size;
    c.layer_types.assign(size_t(c.num_layers), LayerType::FullAttention);
    c.layer_is_moe.assign(size_t(c.num_layers), true);
    c.eos_token_ids = d->eos_token_ids;
    c.deepseek_v4 = std::move(d);
    return c;
  }

  if (c.model_type == "qwen3_5_moe" || c.model_type == "qwen3_5_moe_text") c.family = Family::Qwen3_5Moe;
  else if (c.model_type == "qwen3_next") c.family = Family::Qwen3Next;
  else if (c.model_type == "qwen3_moe") c.family = Family::Qwen3Moe;
  else if (c.model_type == "qwen3") c.family = Family::Qwen3;
  else if (c.model_type == "llama") c.family = Family::Llama;
  else if (c.model_type == "deepseek_v32") {
    c.family = Family::DeepseekV32;
    parse_deepseek_v32(j, c);
    return c;
  } else
    fail("unknown model_type '{}' (supported: qwen3_5_moe, qwen3_5_moe_text, qwen3_next, qwen3_moe, qwen3, llama, "
         "deepseek_v32, deepseek_v4)",
         c.model_type.empty() ? top_type : c.model_type);
  c.tensor_prefix = nested || top_type == "qwen3_5_moe" ? "model.language_model." : "model.";

  c.vocab_size = req_int(j, "vocab_size", 1, kMaxVocab);
  c.hidden_size = req_int(j, "hidden_size", 1, kMaxHidden);
  c.num_layers = req_int(j, "num_hidden_layers", 1, kMaxLayers);
  c.rms_norm_eps = num_field(j, "rms_norm_eps", 1e-6, 0.0, 1.0);
  c.max_position_embeddings = opt_int(j, "max_position_embeddings", 4096, 1, kMaxPositions);
  c.tie_word_embeddings = bool_field(j, "tie_word_embeddings", bool_field(root, "tie_word_embeddings", false));
  c.num_heads = req_int(j, "num_attention_heads", 1, kMaxHeads);
  c.num_kv_heads = opt_int(j, "num_key_value_heads", c.num_heads, 1, c.num_heads);
  if (c.num_heads % c.num_kv_heads)
    fail("config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}", c.num_heads, c.num_kv_heads);
  if (!present(j, "head_dim") && c.hidden_size / c.num_heads < 1)
    fail("config.json: head_dim is missing and hidden_size {} / num_attention_heads {} is 0", c.hidden_size, c.num_heads);
  c.head_dim = opt_int(j, "head_dim", c.hidden_size / c.num_heads, 1, kMaxHeadDim);
  c.attention_bias = bool_field(j, "attention_bias", false);
  c.intermediate_size = opt_int(j, "intermediate_size", 0, 0, kMaxIntermediate);
  c.mlp_bias = bool_field(j, "mlp_bias", false);

  const bool hybrid = c.family == Family::Qwen3_5Moe || c.family == Family::Qwen3Next;
  c.norm_zero_centred = hybrid;
  c.attn_output_gate = hybrid ? bool_field(j, "attn_output_gate", true) : false;
  c.qk_norm = c.family != Family::Llama;

  // RoPE: transformers v5 keeps theta and partial factor in rope_parameters; older files at top level.
  json rp = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
            : j.contains("rope_scaling") && j["rope_scaling"].is_object()   ? j["rope_scaling"]
                                                                             : json::object();
  constexpr double kHuge = 1e300;
  c.rope_theta = num_field(rp, "rope_theta", num_field(j, "rope_theta", 10000.0, 1e-300, kHuge), 1e-300, kHuge);
  c.partial_rotary_factor =
      num_field(rp, "partial_rotary_factor", num_field(j, "partial_rotary_factor", 1.0, 1e-300, 1.0), 1e-300, 1.0);
  std::string rope_type = str_field(rp, "rope_type", str_field(rp, "type", "default"));
  if (rope_type == "llama3") {
    c.rope_llama3_factor = num_field(rp, "factor", std::nullopt, 1e-300, kHuge);
    c.rope_llama3_low_freq = num_field(rp, "low_freq_factor", 1.0, 1e-300, kHuge);
    c.rope_llama3_high_freq = num_field(rp, "high_freq_factor", 4.0, 1e-300, kHuge);
    c.rope_llama3_original_max = opt_int(rp, "original_max_position_embeddings", 8192, 1, kMaxPositions);
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
    if (present(j, "layer_types")) {
      const json& lt = j["layer_types"];
      if (!lt.is_array()) fail("config.json: field 'layer_types' must be a list of strings, not {}", lt.dump());
      if (int64_t(lt.size()) != c.num_layers)
        fail("config.json: layer_types has {} entries but num_hidden_layers is {}", lt.size(), c.num_layers);
      for (size_t i = 0; i < lt.size(); ++i) {
        if (lt[i] == "linear_attention") c.layer_types[i] = LayerType::LinearAttention;
        else if (lt[i] != "full_attention") fail("config.json: unknown layer type {} at layer {}", lt[i].dump(), i);
      }
    } else {
      int64_t interval = opt_int(j, "full_attention_interval", 4, 1, kMaxLayers);
      for (int64_t i = 0; i < c.num_layers; ++i)
        c.layer_types[size_t(i)] = (i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::LinearAttention;
    }
    c.linear_num_key_heads = req_int(j, "linear_num_key_heads", 1, kMaxHeads);
    c.linear_num_value_heads = req_int(j, "linear_num_value_heads", 1, kMaxHeads);
    c.linear_key_head_dim = req_int(j, "linear_key_head_dim", 1, kMaxHeadDim);
    c.linear_value_head_dim = req_int(j, "linear_value_head_dim", 1, kMaxHeadDim);
    c.linear_conv_kernel_dim = opt_int(j, "linear_conv_kernel_dim", 4, 1, kMaxConvKernel);
    c.linear_fused_interleaved = c.family == Family::Qwen3Next;
    if (c.linear_num_value_heads % c.linear_num_key_heads)
      fail("config.json: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
           c.linear_num_value_heads, c.linear_num_key_heads);
  }

  // MoE placement.
  c.layer_is_moe.assign(size_t(c.num_layers), false);
  if (c.family == Family::Qwen3_5Moe || c.family == Family::Qwen3Next || c.family == Family::Qwen3Moe) {
    // transformers v5 writes Qwen3-MoE configs with num_local_experts; released files say num_experts.
    c.num_experts = present(j, "num_experts") ? req_int(j, "num_experts", 1, kMaxExperts)
                                              : req_int(j, "num_local_experts", 1, kMaxExperts);
    c.num_experts_per_tok = req_int(j, "num_experts_per_tok", 1, c.num_experts);
    c.moe_intermediate_size = req_int(j, "moe_intermediate_size", 1, kMaxMoeIntermediate);
    c.shared_expert_intermediate_size = opt_int(j, "shared_expert_intermediate_size", 0, 0, kMaxMoeIntermediate);
    // Qwen3.5 always renormalises the top-k weights; the others read norm_topk_prob.
    c.norm_topk_prob = c.family == Family::Qwen3_5Moe ? true : bool_field(j, "norm_topk_prob", false);
    int64_t step = opt_int(j, "decoder_sparse_step", 1, 1, kMaxLayers);
    std::vector<int64_t> mlp_only;
    if (present(j, "mlp_only_layers")) {
      const json& m = j["mlp_only_layers"];
      if (!m.is_array()) fail("config.json: field 'mlp_only_layers' must be a list of layer indices, not {}", m.dump());
      for (const json& x : m) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.num_layers)
          fail("config.json: mlp_only_layers entry {} is not a layer index in [0, {})", x.dump(), c.num_layers);
        mlp_only.push_back(x.get<int64_t>());
      }
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      bool dense = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
      c.layer_is_moe[size_t(i)] = c.family == Family::Qwen3_5Moe || (!dense && (i + 1) % step == 0);
    }
  }
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (!c.layer_is_moe[size_t(i)] && c.intermediate_size <= 0)
      fail("config.json: layer {} is a dense MLP but intermediate_size is missing", i);

  c.eos_token_ids = ids_of(present(j, "eos_token_id") ? j["eos_token_id"] : root.value("eos_token_id", json()),
                           "config.json");
  // quantization_config (top level as released, or in text_config): block-scaled FP8 only.
  const json& qroot = present(root, "quantization_config") ? root : j;
  if (present(qroot, "quantization_config")) {
    const json& q = qroot["quantization_config"];
    if (!q.is_object()) fail("config.json: field 'quantization_config' must be an object, not {}", q.dump());
    const std::string method = str_field(q, "quant_method", "");
    if (method != "fp8")
      fail("config.json: quantization_config.quant_method '{}' is not supported (supported: fp8 with "
           "weight_block_size [128, 128])", method);
    const json bs = q.value("weight_block_size", json());
    if (bs != json::array({128, 128}))
      fail("config.json: quantization_config.weight_block_size {} is not supported (supported: [128, 128])",
           bs.dump());
    const std::string act = str_field(q, "activation_scheme", "dynamic");
    if (act != "dynamic")
      fail("config.json: quantization_config.activation_scheme '{}' is not supported (supported: dynamic)", act);
    c.quant_method = method;
  }
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
      auto ids = ids_of(gj["eos_token_id"], "generation_config.json");
      if (!ids.empty()) c.eos_token_ids = ids;
    }
  }
  return c;
}

}  // namespace moefold
