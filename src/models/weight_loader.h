// Reads a model's weights from a checkpoint, or fills the same layout with seeded random values
// (--load-format dummy), or only counts them (inspect). One walk over the tensors the config implies
// serves all three, so the three can never disagree about names or shapes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "models/weights.h"

namespace moefold {

/// What a tensor is for: decides its dummy initialisation and whether it counts as active per token.
enum class TensorRole { Embedding, LmHead, Linear, Router, RoutedExpert, NormZeroCentred, NormPlain, Conv, ALog, DtBias, Bias };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorRole role;
};

/// Where tensors come from. load() returns the tensor as fp32 (empty for the counting source).
/// load_param(spec, may_defer): the same as a Param; when `may_defer` (the caller uses the tensor as a
/// whole, never its host values) a source may return it unmaterialised (Param::dummy set, host empty).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  /// The stored shape of `name` in a checkpoint; nullopt for a tensor it does not hold and for sources
  /// that are not checkpoints (dummy, counting), which then hold no optional tensors (FP8 KV scales).
  virtual std::optional<std::vector<int64_t>> checkpoint_shape(const std::string& name) const {
    (void)name;
    return std::nullopt;
  }
  virtual std::vector<float> load(const TensorSpec& spec) = 0;
  virtual Param load_param(const TensorSpec& spec, bool may_defer) {
    (void)may_defer;
    return Param(load(spec));
  }
  /// Called once every tensor has been loaded: a checkpoint throws if it holds language-model tensors
  /// the config does not account for, except names starting with one of the `skip` prefixes.
  virtual void check_complete(const std::vector<std::string>& skip = {}) const { (void)skip; }
  /// --fp8-lm-head: whether the lm_head is to be block-scaled FP8 (load_weights then quantises a tied
  /// lm_head from the embedding; an untied one arrives FP8 from load_param).
  virtual bool quantizes_lm_head() const { return false; }
};

/// Dummy tensors of at least this many elements may be deferred (smaller ones, e.g. norms and the
/// DeltaNet parameters, are always materialised: executors keep their host copies).
inline constexpr int64_t kDeferMinElements = 65536;

/// Reads from a checkpoint directory; a missing or mis-shaped tensor throws one Error naming the tensor
/// and both shapes.
std::unique_ptr<WeightSource> checkpoint_source(const std::string& dir);
/// Seeded random values, scaled per role so activations stay finite and routing is not degenerate.
/// `fused_experts` picks which expert layout `has` reports (the layout of the family's release).
/// `defer`: large tensors used whole (projections, experts, embedding, lm_head) are returned as a
/// DummyRecipe for the executor to generate on its device (models/dummy_init.h); same values.
std::unique_ptr<WeightSource> dummy_source(uint64_t seed, bool fused_experts, bool defer = false);
/// --quantization fp8 over `inner`: tensors for which fp8_quantisable() holds arrive block-scaled FP8
/// (128 x 128 blocks, scale_inv = max |block| / 448; Param::fp8 set and host = its exact dequantisation);
/// tensors already FP8 in a checkpoint are kept as they are. Quantised tensors are never deferred.
/// `weights` false leaves those tensors alone; `lm_head` (--fp8-lm-head) quantises the lm_head (role
/// LmHead, or the tied embedding's copy: see WeightSource::quantizes_lm_head) the same way.
/// `only` non-empty: of those tensors, quantise just the ones whose name contains it, or one of its
/// comma-separated parts (the drift / perplexity commands' per-layer / per-tensor attribution, e.g.
/// "layers.3.", "mlp.down_proj" or "mlp.,self_attn.q_proj.").
std::unique_ptr<WeightSource> fp8_quantizing_source(std::unique_ptr<WeightSource> inner, bool weights = true,
                                                    bool lm_head = false, const std::string& only = "");
/// The tensors the FP8 releases (Qwen3.x-FP8) store in FP8: routed experts and the dense projections
/// (attention, DeltaNet qkv / z / out, shared expert, dense MLP); not embeddings, lm_head, norms, the
/// router, shared_expert_gate nor the DeltaNet in_proj_a / in_proj_b.
bool fp8_quantisable(const TensorSpec& spec);
/// Records every spec and allocates nothing.
class CountingSource : public WeightSource {
 public:
  explicit CountingSource(bool fused_experts) : fused_(fused_experts) {}
  bool has(const std::string& name) const override;
  std::vector<float> load(const TensorSpec& spec) override {
    specs.push_back(spec);
    return {};
  }
  Param load_param(const TensorSpec& spec, bool) override {
    specs.push_back(spec);
    return {};
  }
  std::vector<TensorSpec> specs;

 private:
  bool fused_;
};

/// Walks every tensor `cfg` implies (names as released for its family) and loads it from `src`.
/// `place`, if given, is called on every finished Param, layer by layer (so a GPU executor can upload
/// each layer and drop its host copy before the next is read), then on embed, final_norm, lm_head.
ModelWeights load_weights(const ModelConfig& cfg, WeightSource& src, const std::function<void(Param&)>& place = {});

/// Parameter counts from the specs (no allocation). Active per token counts every tensor except the
/// input embedding, with routed experts counted top_k / num_experts.
struct ParamCounts {
  int64_t total = 0, active_per_token = 0, routed_expert = 0, embedding = 0;
};
ParamCounts count_params(const ModelConfig& cfg);

}  // namespace moefold
