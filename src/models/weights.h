// ModelWeights: the checkpoint mapped once into the layout the forward uses (fp32 on the CPU).
// Experts are always held fused ([E, 2I, H] gate|up and [E, H, I] down) whatever the file layout;
// Qwen3-Next's group-interleaved in_proj_qkvz / in_proj_ba are split into Qwen3.5's qkv / z / b / a.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/fp8_block.h"
#include "io/model_config.h"
#include "models/dummy_init.h"

namespace moefold {

/// One weight tensor: an fp32 host copy (what the CPU backend computes with) and, once an executor has
/// placed it on a GPU, a device copy it owns (`device`); a GPU executor may drop the host copy then.
/// A block-scaled FP8 weight (an FP8 checkpoint, or --quantization fp8) also carries `fp8`: its e4m3
/// values and per-row block scales, of which `host` is the exact fp32 dequantisation; a GPU executor
/// that keeps it in FP8 points `device` at the e4m3 bytes and `device_scale` at the fp32 scales.
struct Param {
  std::vector<float> host;
  int64_t numel = 0;
  void* device = nullptr;
  std::shared_ptr<const Fp8Weight> fp8;
  void* device_scale = nullptr;  ///< set only when the device copy is FP8
  /// Set for a dummy tensor left unmaterialised (host empty): its values are dummy_value(*dummy, i).
  std::optional<DummyRecipe> dummy;
  /// With `dummy`: --quantization fp8 (or --fp8-lm-head) is pending: the executor quantises the recipe's
  /// values on its device, 128 x 128 blocks per [fp8_rows, fp8_cols] matrix (fp8_quantize's bits).
  int64_t fp8_rows = 0, fp8_cols = 0;
  Param() = default;
  Param(std::vector<float> v) : host(std::move(v)), numel(int64_t(host.size())) {}  // NOLINT: implicit by design
  const float* data() const { return host.data(); }
  bool empty() const { return numel == 0; }
};

/// y = x W^T (+ b): W [out, in] row-major; b empty when the layer has no bias.
struct Linear {
  int64_t out = 0, in = 0;
  Param w, b;
};

struct AttentionWeights {
  Linear q_proj, k_proj, v_proj, o_proj;  ///< q_proj rows: per head [query D | gate D] when gated
  Param q_norm, k_norm;     ///< [head_dim]; empty without q/k norm
  /// FP8 KV cache dequantisation scales [num_kv_heads] from an FP8 checkpoint (vLLM's k_scale /
  /// v_scale; a per-tensor scalar is repeated per head); empty when the checkpoint has none.
  std::vector<float> k_scale, v_scale;
};

struct DeltaNetWeights {
  Linear in_proj_qkv;  ///< [conv_dim, H]: rows [Q all key heads | K all key heads | V all value heads]
  Linear in_proj_z;    ///< [value_dim, H]
  Linear in_proj_b;    ///< [Hv, H]
  Linear in_proj_a;    ///< [Hv, H]
  Param conv1d;   ///< [conv_dim, K] depthwise
  Param dt_bias;  ///< [Hv]
  Param A_log;    ///< [Hv]
  Param norm;     ///< [v_dim], plain scale of the gated RMSNorm
  Linear out_proj;             ///< [H, value_dim]
};

struct MoeWeights {
  Linear router;                 ///< [E, H]
  Param e_score_correction_bias;  ///< [E] grouped routing only: added to the scores to choose experts
  Param gate_up;    ///< [E, 2I, H]
  Param down;       ///< [E, H, I]
  Linear shared_gate_up;         ///< [2 Is, H] (gate rows then up rows); empty without a shared expert
  Linear shared_down;            ///< [H, Is]
  Linear shared_expert_gate;     ///< [1, H]
};

struct MlpWeights {
  Linear gate_up;  ///< [2I, H]
  Linear down;     ///< [H, I]
};

/// DeepSeek-V3.2's lightning indexer (ops/cpu/lightning_indexer.h).
struct IndexerWeights {
  Linear wq_b;          ///< [index_heads * index_dim, q_lora_rank]
  Linear wk;            ///< [index_dim, H]
  Param k_norm, k_norm_bias;  ///< [index_dim] LayerNorm
  Linear weights_proj;  ///< [index_heads, H]
};

/// Multi-head latent attention (ops/cpu/mla.h).
struct MlaWeights {
  Linear q_a_proj;   ///< [q_lora_rank, H]
  Param q_a_norm;    ///< [q_lora_rank] RMSNorm
  Linear q_b_proj;   ///< [heads * (qk_nope + qk_rope), q_lora_rank]; per head [nope | rope]
  Linear kv_a_proj;  ///< [kv_lora_rank + qk_rope, H] (kv_a_proj_with_mqa): [latent | rope key]
  Param kv_a_norm;   ///< [kv_lora_rank] RMSNorm
  Linear kv_b_proj;  ///< [heads * (qk_nope + v_head), kv_lora_rank]; per head [W_uk | W_uv]
  Linear o_proj;     ///< [H, heads * v_head]
  IndexerWeights indexer;
};

struct LayerWeights {
  Param input_norm, post_attention_norm;  ///< [H]
  AttentionWeights attn;                               ///< full-attention layers
  MlaWeights mla;                                      ///< MLA layers (DeepSeek-V3.2)
  DeltaNetWeights gdn;                                 ///< linear-attention layers
  MoeWeights moe;                                      ///< MoE layers
  MlpWeights mlp;                                      ///< dense layers
};

struct ModelWeights {
  Param embed;  ///< [V, H]
  Param final_norm;
  Param lm_head;  ///< [V, H]; empty when tied (use embed)
  std::vector<LayerWeights> layers;
  const Param& lm_head_param() const { return lm_head.empty() ? embed : lm_head; }
};

/// Calls fn on every Param of one layer / of the whole model (embedding, final norm and lm_head last).
void for_each_param(LayerWeights& layer, const std::function<void(Param&)>& fn);
void for_each_param(ModelWeights& weights, const std::function<void(Param&)>& fn);

}  // namespace moefold
