// The decoder forward of every supported family on the CPU (fp32), one code path for prefill and decode.
// Per layer (pre-norm, two residuals; transformers Qwen3_5MoeDecoderLayer and siblings):
//   h = h + Mixer(RMSNorm_in(h));  h = h + FFN(RMSNorm_post(h))
// Mixer is gated softmax attention or Gated DeltaNet by layer type; FFN is the MoE block or a dense
// SwiGLU MLP. logits = lm_head(RMSNorm_final(h)).
#pragma once
#include <atomic>
#include <functional>
#include <vector>

#include "io/model_config.h"
#include "models/weights.h"
#include "parallel/shard_plan.h"
#include "runtime/forward_batch.h"
#include "runtime/kv_cache.h"
#include "runtime/routed_experts.h"

namespace moefold {

class Model {
 public:
  Model(ModelConfig cfg, ModelWeights weights);
  /// One rank of a tensor / expert parallel group (parallel/shard_plan.h): `cfg` is the rank's local
  /// config (local_config), `weights` its shard (shard_weights); forward() then runs the collectives
  /// of `shard.comm` at the block boundaries and returns the full vocabulary's logits on every rank.
  /// A null comm is the unsharded model.
  Model(ModelConfig cfg, ModelWeights weights, ShardContext shard);

  /// Runs one step. Writes K/V of every row into the KV cache and advances each sequence's DeltaNet
  /// state in `states`. logits: resized to [batch.logits_rows.size(), vocab_size], fp32.
  /// Preconditions: block tables cover every position; state slots hold the state after
  /// context_lens[s] tokens (zero for a new sequence). `routing`: capture the MoE layers' chosen
  /// experts and/or replay given ones (runtime/routed_experts.h). Throws Error on an inconsistent batch
  /// or a replay that does not match it.
  void forward(const ForwardBatch& batch, KvCache& kv, StatePool& states, std::vector<float>& logits,
               RoutingControl routing = {}) const;

  const ModelConfig& config() const { return cfg_; }

  /// With `on`, rounds activations to bf16 wherever the CUDA executor stores them in bf16 (norm, GEMM
  /// and SwiGLU outputs, q/k after norm and RoPE, attention and DeltaNet outputs, the residual stream,
  /// expert activations and outputs, the prefill attention probabilities before P V) while keeping fp32 where it keeps fp32 (router logits, softmax,
  /// DeltaNet state, the MoE combine): the ideal bf16 chain the GPU forward is checked against.
  void set_emulate_bf16(bool on) { emulate_bf16_ = on; }

  /// With `on`, the input of every projection whose weight is FP8 (Param::fp8: attention, DeltaNet
  /// qkv / z / out, shared expert, dense MLP, and the routed experts' gate_up and down; not the lm_head
  /// nor bf16 weights) is quantised per token and 128 columns first (fp8_fake_quantize_activations): the
  /// W8A8 chain of the FP8 releases' dynamic activation scheme, for accuracy measurements (moefold
  /// perplexity --b-fp8-activations). Off (the default): W8A16, the FP8 weights times unquantised
  /// activations. The two-argument form chooses the dense projections and the routed experts apart
  /// (the CUDA executor's prefill steps: W8A16 dense projections, W8A8 routed experts). The routed
  /// experts of an expert-parallel rank are not emulated.
  void set_emulate_fp8_activations(bool on) { set_emulate_fp8_activations(on, on); }
  void set_emulate_fp8_activations(bool dense, bool experts) {
    emulate_fp8_act_ = dense;
    emulate_fp8_expert_act_ = experts;
  }

  /// Probe tap (moefold probe): called in forward() for every layer once its FFN has run, before the
  /// residual add, with h (the residual stream after the mixer), x (the FFN input) and y (the FFN
  /// output), each [T, hidden]. Empty: no tap.
  using FfnTap = std::function<void(size_t layer, const float* h, const float* x, const float* y, int64_t T)>;
  void set_ffn_tap(FfnTap tap) { ffn_tap_ = std::move(tap); }
  /// The weights as loaded (FP8 ones keep Param::fp8).
  const ModelWeights& weights() const { return w_; }
  /// (token, expert) pairs this rank's routed experts have computed since construction (expert
  /// parallel load; with experts split instead, every rank counts every pair).
  int64_t routed_pairs() const { return routed_pairs_; }

 private:
  void attention(size_t layer, const ForwardBatch& b, const float* x, float* out, KvCache& kv) const;
  /// DeepSeek-V3.2 MLA with the lightning indexer (models/deepseek_v32.cc).
  void mla_attention(size_t layer, const ForwardBatch& b, const float* x, float* out, KvCache& kv) const;
  void deltanet(size_t layer, const ForwardBatch& b, const float* x, float* out, StatePool& st) const;
  void moe(size_t layer, const float* x, float* out, int64_t T, const int32_t* replay, int32_t* chosen) const;
  /// The routed experts of an expert-parallel rank (parallel/expert_dispatch.h): out += this rank's
  /// share of the routed experts' weighted outputs, to be summed by the block's all-reduce.
  void moe_expert_parallel(size_t layer, const float* x, float* out, int64_t T, const int32_t* ids,
                           const float* wts) const;
  bool sharded() const { return shard_.comm != nullptr && shard_.shard.world > 1; }
  /// In place: the sum over the ranks of [n] floats (a no-op unsharded).
  void all_reduce(float* p, int64_t n) const;
  void mlp(size_t layer, const float* x, float* out, int64_t T) const;

  void round_act(float* p, int64_t n) const;
  void proj(const Linear& l, const float* x, float* y, int64_t T) const;

  ModelConfig cfg_;
  ModelWeights w_;
  bool emulate_bf16_ = false;
  bool emulate_fp8_act_ = false;
  bool emulate_fp8_expert_act_ = false;
  FfnTap ffn_tap_;
  std::vector<double> inv_freq_;
  double rope_attention_factor_ = 1.0;  ///< YaRN's cos/sin scale (1 without YaRN)
  ShardContext shard_;
  mutable std::atomic<int64_t> routed_pairs_{0};
};

}  // namespace moefold
