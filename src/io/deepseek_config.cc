#include "io/deepseek_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config_fields.h"
#include "io/model_config.h"

namespace moefold {

using json = nlohmann::json;
using namespace config_fields;

namespace {

double yarn_mscale(double s, double k) { return s <= 1 ? 1.0 : 0.1 * k * std::log(s) + 1.0; }

void parse_rope(const json& j, ModelConfig& c) {
  json rp = present(j, "rope_scaling") && j["rope_scaling"].is_object()       ? j["rope_scaling"]
            : present(j, "rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
                                                                                 : json::object();
  constexpr double kHuge = 1e300;
  c.rope_theta = num_field(rp, "rope_theta", num_field(j, "rope_theta", 10000.0, 1e-300, kHuge), 1e-300, kHuge);
  const std::string type = str_field(rp, "rope_type", str_field(rp, "type", "default"));
  if (type == "yarn") {
    YarnRopeConfig& y = c.yarn;
    y.factor = num_field(rp, "factor", std::nullopt, 1.0, kHuge);
    y.original_max_position_embeddings = opt_int(rp, "original_max_position_embeddings", 4096, 1, kMaxPositions);
    y.beta_fast = num_field(rp, "beta_fast", 32.0, 1e-300, kHuge);
    y.beta_slow = num_field(rp, "beta_slow", 1.0, 1e-300, kHuge);
    y.mscale = num_field(rp, "mscale", 0.0, 0.0, kHuge);
    y.mscale_all_dim = num_field(rp, "mscale_all_dim", 0.0, 0.0, kHuge);
    y.truncate = bool_field(rp, "truncate", true);
    if (present(rp, "attention_factor"))
      fail("config.json: rope_scaling.attention_factor is not supported for deepseek_v32 (it is derived from mscale)");
  } else if (type != "default") {
    fail("config.json: rope_type '{}' is not supported for deepseek_v32 (supported: yarn, default)", type);
  }
}

}  // namespace

void parse_deepseek_v32(const json& j, ModelConfig& c) {
  c.tensor_prefix = "model.";
  c.vocab_size = req_int(j, "vocab_size", 1, kMaxVocab);
  c.hidden_size = req_int(j, "hidden_size", 1, kMaxHidden);
  c.num_layers = req_int(j, "num_hidden_layers", 1, kMaxLayers);
  c.rms_norm_eps = num_field(j, "rms_norm_eps", 1e-6, 0.0, 1.0);
  c.max_position_embeddings = opt_int(j, "max_position_embeddings", 163840, 1, kMaxPositions);
  c.tie_word_embeddings = bool_field(j, "tie_word_embeddings", false);
  if (str_field(j, "hidden_act", "silu") != "silu")
    fail("config.json: hidden_act '{}' is not supported for deepseek_v32 (silu only)", j["hidden_act"].dump());
  if (bool_field(j, "attention_bias", false))
    fail("config.json: attention_bias true is not supported for deepseek_v32 (no released checkpoint has it)");
  c.num_heads = req_int(j, "num_attention_heads", 1, kMaxHeads);
  c.num_kv_heads = c.num_heads;  // MLA: one shared latent per token, expanded per head (mla.*)

  MlaConfig& m = c.mla;
  if (!present(j, "q_lora_rank"))
    fail("config.json: q_lora_rank is missing or null; deepseek_v32 needs the compressed query (the lightning "
         "indexer reads it)");
  m.q_lora_rank = req_int(j, "q_lora_rank", 1, kMaxHidden);
  m.kv_lora_rank = req_int(j, "kv_lora_rank", 1, kMaxHidden);
  m.qk_nope_head_dim = req_int(j, "qk_nope_head_dim", 1, kMaxHeadDim);
  m.qk_rope_head_dim = req_int(j, "qk_rope_head_dim", 2, kMaxHeadDim);
  m.v_head_dim = req_int(j, "v_head_dim", 1, kMaxHeadDim);
  if (m.qk_rope_head_dim % 2) fail("config.json: qk_rope_head_dim {} must be even", m.qk_rope_head_dim);
  m.index_n_heads = req_int(j, "index_n_heads", 1, kMaxHeads);
  m.index_head_dim = req_int(j, "index_head_dim", m.qk_rope_head_dim, kMaxHeadDim);
  m.index_topk = req_int(j, "index_topk", 1, kMaxPositions);
  m.num_nextn_predict_layers = opt_int(j, "num_nextn_predict_layers", 0, 0, kMaxLayers);
  c.head_dim = m.qk_head_dim();
  c.rotary_dim = m.qk_rope_head_dim;
  parse_rope(j, c);
  double mscale2 = 1.0;
  if (c.yarn.factor > 0 && c.yarn.mscale_all_dim != 0) {
    const double ms = yarn_mscale(c.yarn.factor, c.yarn.mscale_all_dim);
    mscale2 = ms * ms;
  }
  m.softmax_scale = mscale2 / std::sqrt(double(m.qk_head_dim()));

  // MoE: grouped sigmoid routing with a correction bias.
  const std::string method = str_field(j, "topk_method", "noaux_tc"), scoring = str_field(j, "scoring_func", "sigmoid");
  if (method != "noaux_tc")
    fail("config.json: topk_method '{}' is not supported for deepseek_v32 (noaux_tc only)", method);
  if (scoring != "sigmoid")
    fail("config.json: scoring_func '{}' is not supported for deepseek_v32 (sigmoid only)", scoring);
  c.num_experts = present(j, "n_routed_experts") ? req_int(j, "n_routed_experts", 1, kMaxExperts)
                                                 : req_int(j, "num_local_experts", 1, kMaxExperts);
  GroupedRoutingConfig& g = c.grouped_routing;
  g.enabled = true;
  g.n_group = opt_int(j, "n_group", 1, 1, c.num_experts);
  if (c.num_experts % g.n_group)
    fail("config.json: n_routed_experts {} is not a multiple of n_group {}", c.num_experts, g.n_group);
  if (c.num_experts / g.n_group < 2)
    fail("config.json: n_group {} leaves {} expert(s) per group; a group's score is the sum of its top two", g.n_group,
         c.num_experts / g.n_group);
  g.topk_group = opt_int(j, "topk_group", 1, 1, g.n_group);
  c.num_experts_per_tok = req_int(j, "num_experts_per_tok", 1, g.topk_group * (c.num_experts / g.n_group));
  g.routed_scaling_factor = num_field(j, "routed_scaling_factor", 1.0, 0.0, 1e6);
  c.norm_topk_prob = bool_field(j, "norm_topk_prob", true);
  c.moe_intermediate_size = req_int(j, "moe_intermediate_size", 1, kMaxMoeIntermediate);
  c.shared_expert_intermediate_size =
      c.moe_intermediate_size * opt_int(j, "n_shared_experts", 0, 0, kMaxMoeIntermediate / c.moe_intermediate_size);
  c.intermediate_size = opt_int(j, "intermediate_size", 0, 0, kMaxIntermediate);

  // Layers: every one is MLA + indexer; the first first_k_dense_replace have a dense MLP (or as
  // mlp_layer_types says), the rest MoE every moe_layer_freq.
  c.layer_types.assign(size_t(c.num_layers), LayerType::FullAttention);
  c.layer_is_moe.assign(size_t(c.num_layers), false);
  if (present(j, "mlp_layer_types")) {
    const json& t = j["mlp_layer_types"];
    if (!t.is_array() || int64_t(t.size()) != c.num_layers)
      fail("config.json: mlp_layer_types must list 'dense' or 'sparse' for each of the {} layers, not {}", c.num_layers,
           t.dump());
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] != "dense" && t[i] != "sparse") fail("config.json: mlp_layer_types[{}] = {} is not dense or sparse", i, t[i].dump());
      c.layer_is_moe[i] = t[i] == "sparse";
    }
  } else {
    const int64_t first_dense = opt_int(j, "first_k_dense_replace", 0, 0, c.num_layers);
    const int64_t freq = opt_int(j, "moe_layer_freq", 1, 1, c.num_layers);
    for (int64_t i = 0; i < c.num_layers; ++i) c.layer_is_moe[size_t(i)] = i >= first_dense && i % freq == 0;
  }
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (!c.layer_is_moe[size_t(i)] && c.intermediate_size <= 0)
      fail("config.json: layer {} is a dense MLP but intermediate_size is missing", i);

  // Weights: bf16/f32 or block FP8 (dequantised at load by the checkpoint reader).
  if (present(j, "quantization_config")) {
    const json& q = j["quantization_config"];
    const std::string qm = q.is_object() ? str_field(q, "quant_method", "") : "";
    if (qm != "fp8")
      fail("config.json: quantization_config {} is not supported for deepseek_v32 (fp8 with 128x128 blocks only)",
           q.dump());
    if (present(q, "weight_block_size") && q["weight_block_size"] != json::array({128, 128}))
      fail("config.json: quantization_config.weight_block_size {} is not supported (128x128 only)",
           q["weight_block_size"].dump());
  }
  c.eos_token_ids = ids_of(present(j, "eos_token_id") ? j["eos_token_id"] : json(), "config.json");
}

}  // namespace moefold
