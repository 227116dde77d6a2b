// ModelWeights: the checkpoint mapped once into the layout the forward uses (fp32 on the CPU).
// Experts are always held fused ([E, 2I, H] gate|up and [E, H, I] down) whatever the file layout;
// Qwen3-Next's group-interleaved in_proj_qkvz / in_proj_ba are split into Qwen3.5's qkv / z / b / a.
#pragma once
#include <cstdint>
#include <vector>

#include "io/model_config.h"

namespace moefold {

/// y = x W^T (+ b): W [out, in] row-major; b empty when the layer has no bias.
struct Linear {
  int64_t out = 0, in = 0;
  std::vector<float> w, b;
};

struct AttentionWeights {
  Linear q_proj, k_proj, v_proj, o_proj;  ///< q_proj rows: per head [query D | gate D] when gated
  std::vector<float> q_norm, k_norm;     ///< [head_dim]; empty without q/k norm
};

struct DeltaNetWeights {
  Linear in_proj_qkv;  ///< [conv_dim, H]: rows [Q all key heads | K all key heads | V all value heads]
  Linear in_proj_z;    ///< [value_dim, H]
  Linear in_proj_b;    ///< [Hv, H]
  Linear in_proj_a;    ///< [Hv, H]
  std::vector<float> conv1d;   ///< [conv_dim, K] depthwise
  std::vector<float> dt_bias;  ///< [Hv]
  std::vector<float> A_log;    ///< [Hv]
  std::vector<float> norm;     ///< [v_dim], plain scale of the gated RMSNorm
  Linear out_proj;             ///< [H, value_dim]
};

struct MoeWeights {
  Linear router;                 ///< [E, H]
  std::vector<float> gate_up;    ///< [E, 2I, H]
  std::vector<float> down;       ///< [E, H, I]
  Linear shared_gate_up;         ///< [2 Is, H] (gate rows then up rows); empty without a shared expert
  Linear shared_down;            ///< [H, Is]
  Linear shared_expert_gate;     ///< [1, H]
};

struct MlpWeights {
  Linear gate_up;  ///< [2I, H]
  Linear down;     ///< [H, I]
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;  ///< [H]
  AttentionWeights attn;                               ///< full-attention layers
  DeltaNetWeights gdn;                                 ///< linear-attention layers
  MoeWeights moe;                                      ///< MoE layers
  MlpWeights mlp;                                      ///< dense layers
};

struct ModelWeights {
  std::vector<float> embed;  ///< [V, H]
  std::vector<float> final_norm;
  std::vector<float> lm_head;  ///< [V, H]; empty when tied (use embed)
  std::vector<LayerWeights> layers;
  const float* lm_head_ptr() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
};

}  // namespace moefold
