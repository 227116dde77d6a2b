#include "models/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/parallel.h"
#include "models/deepseek_v4.h"
#include "models/dummy_init.h"
#include "models/kv_scales.h"
#include "models/mla_weights.h"

#include "core/error.h"
#include "io/safetensors.h"

namespace moefold {

namespace {

class CheckpointSource : public WeightSource {
 public:
  explicit CheckpointSource(const std::string& dir) : dir_(dir), ckpt_(dir) {}
  bool has(const std::string& name) const override { return ckpt_.has(name); }
  std::optional<std::vector<int64_t>> checkpoint_shape(const std::string& name) const override {
    if (!ckpt_.has(name)) return std::nullopt;
    return ckpt_.get(name).shape;
  }
  std::vector<float> load(const TensorSpec& spec) override { return load_param(spec, false).host; }
  /// The tensor as fp32; a block-scaled FP8 one (F8_E4M3 with `<name>_scale_inv`) also keeps its e4m3
  /// values and scales (Param::fp8), of which the fp32 copy is the exact dequantisation.
  Param load_param(const TensorSpec& spec, bool) override {
    if (!ckpt_.has(spec.name))
      fail("tensor '{}' (shape {} implied by config.json) is missing from the checkpoint in '{}'", spec.name,
           shape_str(spec.shape), dir_);
    const TensorView& t = ckpt_.get(spec.name);
    if (t.shape != spec.shape)
      fail("tensor '{}' has shape {} in the checkpoint but config.json implies {}", spec.name, shape_str(t.shape),
           shape_str(spec.shape));
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F8_E4M3)
      fail("tensor '{}' has dtype {}; weights must be F32, BF16, F16 or F8_E4M3", spec.name, dtype_name(t.dtype));
    used_.insert(spec.name);
    if (t.dtype != DType::F8_E4M3) return Param(t.to_f32());
    if (!ckpt_.has(spec.name + "_scale_inv"))
      fail("tensor '{}' is F8_E4M3 but the checkpoint has no '{}_scale_inv' (block-scaled FP8 needs its scales)",
           spec.name, spec.name);
    auto fp8 = std::make_shared<Fp8Weight>(block_fp8(t));
    Param p(fp8_dequantize(*fp8));
    p.fp8 = std::move(fp8);
    return p;
  }
  /// FP8 with block scales (HF FineGrainedFP8 / Qwen FP8 release): W[i, j] = W8[i, j] * scale_inv[i / 128, j / 128]
  /// over the last two dims; scale_inv (BF16, F16 or F32) has shape [..., ceil(rows / 128), ceil(cols / 128)].
  Fp8Weight block_fp8(const TensorView& t) {
    const std::string sname = t.name + "_scale_inv";
    const TensorView& sc = ckpt_.get(sname);
    used_.insert(sname);
    MOEFOLD_CHECK(t.shape.size() >= 2, "tensor '{}': block-scaled FP8 needs at least 2 dims, has {}", t.name,
                  shape_str(t.shape));
    MOEFOLD_CHECK(sc.dtype == DType::F32 || sc.dtype == DType::BF16 || sc.dtype == DType::F16,
                  "tensor '{}' has dtype {}; FP8 block scales must be F32, BF16 or F16", sname, dtype_name(sc.dtype));
    const int64_t rows = t.shape[t.shape.size() - 2], cols = t.shape.back(), blk = kFp8BlockSize;
    const int64_t mats = t.numel() / (rows * cols), br = (rows + blk - 1) / blk, bc = (cols + blk - 1) / blk;
    std::vector<int64_t> want(t.shape.begin(), t.shape.end() - 2);
    want.push_back(br);
    want.push_back(bc);
    if (sc.shape != want)
      fail("tensor '{}' has shape {} but block size 128 over {} implies {}", sname, shape_str(sc.shape),
           shape_str(t.shape), shape_str(want));
    std::vector<float> s = sc.to_f32();
    for (float v : s)
      MOEFOLD_CHECK(std::isfinite(v), "tensor '{}' holds a non-finite scale", sname);
    return fp8_from_blocks(static_cast<const uint8_t*>(t.data), s.data(), mats, rows, cols);
  }
  /// Throws if the checkpoint holds language-model tensors the config does not account for.
  /// `skip`: name prefixes of tensors left unread on purpose (DeepSeek's MTP layers after the decoder).
  void check_complete(const std::vector<std::string>& skip) const override {
    std::vector<std::string> extra;
    for (auto& n : ckpt_.names()) {
      if (used_.count(n) || n.rfind("model.visual.", 0) == 0 || n.rfind("mtp.", 0) == 0 ||
          n.find("rotary_emb.inv_freq") != std::string::npos)
        continue;
      if (std::any_of(skip.begin(), skip.end(), [&](const std::string& p) { return n.rfind(p, 0) == 0; })) continue;
      extra.push_back(n);
    }
    if (!extra.empty())
      fail("checkpoint in '{}' has {} tensor(s) that config.json does not account for, e.g. '{}'", dir_, extra.size(),
           extra.front());
  }

 private:
  std::string dir_;
  Checkpoint ckpt_;
  std::set<std::string> used_;
};

class DummySource : public WeightSource {
 public:
  DummySource(uint64_t seed, bool fused, bool defer) : seed_(seed), fused_(fused), defer_(defer) {}
  bool has(const std::string& name) const override {
    return name.find("mlp.experts.gate_up_proj") == std::string::npos || fused_;
  }
  std::vector<float> load(const TensorSpec& spec) override { return load_param(spec, false).host; }
  Param load_param(const TensorSpec& spec, bool may_defer) override {
    const int64_t n = numel(spec);
    uint64_t s = seed_;
    for (char c : spec.name) s = (s ^ uint64_t(uint8_t(c))) * 0x100000001b3ull;  // FNV-1a over the name
    const int64_t fan_in = spec.shape.back();
    // Uniform(-1, 1) has std 1/sqrt(3): scale by sqrt(3) * std.
    const float r3 = std::sqrt(3.0f), inv_fan = 1.0f / std::sqrt(float(fan_in));
    const TensorRole role = spec.role;
    // Roles whose value is one scale times u (a DummyRecipe): may stay unmaterialised.
    float scale = 0.0f;
    bool product = true;
    switch (role) {
      case TensorRole::Embedding: scale = r3; break;
      case TensorRole::LmHead:
      case TensorRole::Linear:
      case TensorRole::RoutedExpert: scale = r3 * inv_fan; break;
      case TensorRole::Router: scale = 4.0f * r3 * inv_fan; break;
      default: product = false;
    }
    if (product && defer_ && may_defer && n > kDeferMinElements) {
      Param p;
      p.numel = n;
      p.dummy = DummyRecipe{s, scale};
      return p;
    }
    std::vector<float> out(static_cast<size_t>(n));
    auto fill = [&, s](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float u = dummy_uniform(s, i);
        float& v = out[size_t(i)];
        switch (role) {
          case TensorRole::NormZeroCentred: v = 0.1f * r3 * u; break;
          case TensorRole::NormPlain: v = 1.0f + 0.1f * r3 * u; break;
          case TensorRole::Conv: v = 0.5f * r3 * u; break;
          case TensorRole::ALog: v = std::log(1.0f + 7.5f * (u + 1.0f)); break;  // A in [1, 16]
          case TensorRole::DtBias: v = u; break;
          case TensorRole::Bias: v = 0.02f * r3 * u; break;
          default: v = dummy_value(DummyRecipe{s, scale}, i);
        }
      }
    };
    parallel_for(n, fill);
    return Param(std::move(out));
  }

 private:
  static int64_t numel(const TensorSpec& spec) {
    int64_t n = 1;
    for (auto d : spec.shape) n *= d;
    return n;
  }
  uint64_t seed_;
  bool fused_, defer_;
};

/// --quantization fp8: every tensor the FP8 releases quantise (fp8_quantisable) is quantised with
/// 128 x 128 blocks as it arrives; what the inner source already holds in FP8 is kept as is.
class QuantizingSource : public WeightSource {
 public:
  QuantizingSource(std::unique_ptr<WeightSource> inner, bool weights, bool lm_head, std::string only)
      : inner_(std::move(inner)), weights_(weights), lm_head_(lm_head), only_(std::move(only)) {}
  bool has(const std::string& name) const override { return inner_->has(name); }
  std::optional<std::vector<int64_t>> checkpoint_shape(const std::string& name) const override {
    return inner_->checkpoint_shape(name);
  }
  std::vector<float> load(const TensorSpec& spec) override { return load_param(spec, false).host; }
  bool quantizes_lm_head() const override { return lm_head_; }
  Param load_param(const TensorSpec& spec, bool may_defer) override {
    const bool quantise = spec.role == TensorRole::LmHead ? lm_head_ : weights_ && fp8_quantisable(spec) && named(spec);
    if (!quantise) return inner_->load_param(spec, may_defer);
    const int64_t cols = spec.shape.back(), rows = spec.shape[spec.shape.size() - 2];
    // A deferred dummy tensor stays a recipe: its executor quantises it on the device (same bits).
    Param p = inner_->load_param(spec, may_defer);
    if (p.dummy) {
      p.fp8_rows = rows;
      p.fp8_cols = cols;
      return p;
    }
    if (p.fp8 || p.host.empty()) return p;
    auto f = std::make_shared<Fp8Weight>(fp8_quantize(p.host.data(), p.numel / (rows * cols), rows, cols));
    Param out(fp8_dequantize(*f));
    out.fp8 = std::move(f);
    return out;
  }
  void check_complete(const std::vector<std::string>& skip) const override { inner_->check_complete(skip); }

 private:
  /// `only` empty, or one of its comma-separated parts is a substring of the tensor's name.
  bool named(const TensorSpec& spec) const {
    if (only_.empty()) return true;
    for (size_t i = 0; i <= only_.size();) {
      size_t j = only_.find(',', i);
      if (j == std::string::npos) j = only_.size();
      if (j > i && spec.name.find(only_.substr(i, j - i)) != std::string::npos) return true;
      i = j + 1;
    }
    return false;
  }
  std::unique_ptr<WeightSource> inner_;
  bool weights_, lm_head_;
  std::string only_;
};

/// Rows of b stacked under a's: the fp32 values and, when both are FP8, the FP8 form (else none).
Param stack_rows(Param a, const Param& b) {
  std::shared_ptr<const Fp8Weight> fa = std::move(a.fp8);
  a.host.insert(a.host.end(), b.host.begin(), b.host.end());
  Param out(std::move(a.host));
  if (fa && b.fp8) {
    auto f = std::make_shared<Fp8Weight>(*fa);
    fp8_append_rows(*f, *b.fp8);
    out.fp8 = std::move(f);
  }
  return out;
}

Linear make_linear(WeightSource& src, const std::string& name, int64_t out, int64_t in, bool bias,
                   TensorRole role = TensorRole::Linear, bool may_defer = true) {
  Linear l;
  l.out = out;
  l.in = in;
  l.w = src.load_param({name + ".weight", {out, in}, role}, may_defer);
  if (bias) l.b = src.load({name + ".bias", {out}, TensorRole::Bias});
  return l;
}

std::vector<float> concat_rows(std::vector<float> a, const std::vector<float>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Qwen3-Next: per key-head group g, in_proj_qkvz rows are [q_g dk | k_g dk | v_g r*dv | z_g r*dv] and
// in_proj_ba rows are [b_g r | a_g r]; regroup them into Qwen3.5's [Q | K | V], Z, B, A.
void split_interleaved(const ModelConfig& c, const std::vector<float>& qkvz, const std::vector<float>& ba,
                       DeltaNetWeights& g) {
  const int64_t H = c.hidden_size, Hk = c.linear_num_key_heads, dk = c.linear_key_head_dim;
  const int64_t r = c.linear_num_value_heads / Hk, dv = c.linear_value_head_dim, grp = 2 * dk + 2 * r * dv;
  g.in_proj_qkv = {c.conv_dim(), H, {}, {}};
  g.in_proj_z = {c.value_dim(), H, {}, {}};
  g.in_proj_b = {c.linear_num_value_heads, H, {}, {}};
  g.in_proj_a = g.in_proj_b;
  if (qkvz.empty()) return;  // counting only
  g.in_proj_qkv.w = std::vector<float>(size_t(c.conv_dim() * H));
  g.in_proj_z.w = std::vector<float>(size_t(c.value_dim() * H));
  g.in_proj_b.w = std::vector<float>(size_t(c.linear_num_value_heads * H));
  g.in_proj_a.w = g.in_proj_b.w;
  auto copy_rows = [&](const std::vector<float>& src, int64_t src_row, std::vector<float>& dst, int64_t dst_row,
                       int64_t rows) {
    std::memcpy(&dst[size_t(dst_row * H)], &src[size_t(src_row * H)], size_t(rows * H) * 4);
  };
  for (int64_t k = 0; k < Hk; ++k) {
    const int64_t base = k * grp;
    copy_rows(qkvz, base, g.in_proj_qkv.w.host, k * dk, dk);
    copy_rows(qkvz, base + dk, g.in_proj_qkv.w.host, c.key_dim() + k * dk, dk);
    copy_rows(qkvz, base + 2 * dk, g.in_proj_qkv.w.host, 2 * c.key_dim() + k * r * dv, r * dv);
    copy_rows(qkvz, base + 2 * dk + r * dv, g.in_proj_z.w.host, k * r * dv, r * dv);
    copy_rows(ba, k * 2 * r, g.in_proj_b.w.host, k * r, r);
    copy_rows(ba, k * 2 * r + r, g.in_proj_a.w.host, k * r, r);
  }
}

}  // namespace

bool CountingSource::has(const std::string& name) const {
  return name.find("mlp.experts.gate_up_proj") == std::string::npos || fused_;
}

std::unique_ptr<WeightSource> checkpoint_source(const std::string& dir) { return std::make_unique<CheckpointSource>(dir); }
std::unique_ptr<WeightSource> dummy_source(uint64_t seed, bool fused_experts, bool defer) {
  return std::make_unique<DummySource>(seed, fused_experts, defer);
}
std::unique_ptr<WeightSource> fp8_quantizing_source(std::unique_ptr<WeightSource> inner, bool weights, bool lm_head,
                                                    const std::string& only) {
  return std::make_unique<QuantizingSource>(std::move(inner), weights, lm_head, only);
}

bool fp8_quantisable(const TensorSpec& spec) {
  if (spec.shape.size() < 2) return false;
  if (spec.role == TensorRole::RoutedExpert) return true;
  if (spec.role != TensorRole::Linear) return false;
  for (const char* keep : {"in_proj_a.", "in_proj_b.", "in_proj_ba.", "shared_expert_gate."})
    if (spec.name.find(keep) != std::string::npos) return false;
  return true;
}

ModelWeights load_weights(const ModelConfig& c, WeightSource& src, const std::function<void(Param&)>& place) {
  const std::string P = c.tensor_prefix;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const TensorRole norm_role = c.norm_zero_centred ? TensorRole::NormZeroCentred : TensorRole::NormPlain;
  ModelWeights w;
  w.embed = src.load_param({P + "embed_tokens.weight", {V, H}, TensorRole::Embedding}, true);
  w.final_norm = src.load({P + "norm.weight", {H}, norm_role});
  if (!c.tie_word_embeddings) {
    w.lm_head = src.load_param({"lm_head.weight", {V, H}, TensorRole::LmHead}, true);
  } else if (src.quantizes_lm_head()) {  // --fp8-lm-head, tied: an FP8 copy of the embedding
    if (w.embed.dummy) {  // deferred dummy: the same recipe, quantised on the device
      w.lm_head.numel = w.embed.numel;
      w.lm_head.dummy = w.embed.dummy;
      w.lm_head.fp8_rows = V;
      w.lm_head.fp8_cols = H;
    } else {
      MOEFOLD_CHECK(!w.embed.host.empty(), "--fp8-lm-head: the tied embedding has no host values");
      auto f = std::make_shared<Fp8Weight>(fp8_quantize(w.embed.host.data(), 1, V, H));
      w.lm_head = Param(fp8_dequantize(*f));
      w.lm_head.fp8 = std::move(f);
    }
  }
  w.layers.resize(size_t(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& L = w.layers[size_t(i)];
    const std::string lp = P + "layers." + std::to_string(i) + ".";
    L.input_norm = src.load({lp + "input_layernorm.weight", {H}, norm_role});
    L.post_attention_norm = src.load({lp + "post_attention_layernorm.weight", {H}, norm_role});
    if (c.layer_types[size_t(i)] == LayerType::LinearAttention) {
      DeltaNetWeights& g = L.gdn;
      const std::string ap = lp + "linear_attn.";
      const int64_t Hv = c.linear_num_value_heads;
      if (c.linear_fused_interleaved) {
        auto qkvz = src.load({ap + "in_proj_qkvz.weight", {c.conv_dim() + c.value_dim(), H}, TensorRole::Linear});
        auto ba = src.load({ap + "in_proj_ba.weight", {2 * Hv, H}, TensorRole::Linear});
        split_interleaved(c, qkvz, ba, g);
      } else {
        g.in_proj_qkv = make_linear(src, ap + "in_proj_qkv", c.conv_dim(), H, false);
        g.in_proj_z = make_linear(src, ap + "in_proj_z", c.value_dim(), H, false);
        g.in_proj_b = make_linear(src, ap + "in_proj_b", Hv, H, false);
        g.in_proj_a = make_linear(src, ap + "in_proj_a", Hv, H, false);
      }
      g.conv1d = src.load({ap + "conv1d.weight", {c.conv_dim(), 1, c.linear_conv_kernel_dim}, TensorRole::Conv});
      g.dt_bias = src.load({ap + "dt_bias", {Hv}, TensorRole::DtBias});
      g.A_log = src.load({ap + "A_log", {Hv}, TensorRole::ALog});
      g.norm = src.load({ap + "norm.weight", {c.linear_value_head_dim}, TensorRole::NormPlain});
      g.out_proj = make_linear(src, ap + "out_proj", H, c.value_dim(), false);
    } else if (c.mla.enabled()) {
      load_mla_weights(c, src, lp + "self_attn.", L.mla);
    } else {
      AttentionWeights& a = L.attn;
      const std::string ap = lp + "self_attn.";
      const int64_t kv = c.num_kv_heads * c.head_dim;
      a.q_proj = make_linear(src, ap + "q_proj", c.q_proj_rows(), H, c.attention_bias);
      a.k_proj = make_linear(src, ap + "k_proj", kv, H, c.attention_bias);
      a.v_proj = make_linear(src, ap + "v_proj", kv, H, c.attention_bias);
      a.o_proj = make_linear(src, ap + "o_proj", H, c.num_heads * c.head_dim, c.attention_bias);
      if (c.qk_norm) {
        a.q_norm = src.load({ap + "q_norm.weight", {c.head_dim}, norm_role});
        a.k_norm = src.load({ap + "k_norm.weight", {c.head_dim}, norm_role});
      }
      load_kv_scales(src, ap, c.num_kv_heads, a);
    }
    const std::string mp = lp + "mlp.";
    struct PlaceLayer {  // hands the finished layer to `place` before the next one is read
      const std::function<void(Param&)>& place;
      LayerWeights& layer;
      ~PlaceLayer() {
        if (place) for_each_param(layer, place);
      }
    } placer{place, L};
    if (c.layer_is_moe[size_t(i)]) {
      MoeWeights& m = L.moe;
      const int64_t E = c.num_experts, I = c.moe_intermediate_size;
      m.router = make_linear(src, mp + "gate", E, H, false, TensorRole::Router);
      if (c.grouped_routing.enabled)
        m.e_score_correction_bias = src.load({mp + "gate.e_score_correction_bias", {E}, TensorRole::Bias});
      if (src.has(mp + "experts.gate_up_proj")) {
        m.gate_up = src.load_param({mp + "experts.gate_up_proj", {E, 2 * I, H}, TensorRole::RoutedExpert}, true);
        m.down = src.load_param({mp + "experts.down_proj", {E, H, I}, TensorRole::RoutedExpert}, true);
      } else {
        // Per-expert tensors (each FP8 one with its own block scales) stacked into the fused layout.
        std::vector<float> gate_up, down;
        auto gu8 = std::make_shared<Fp8Weight>(), d8 = std::make_shared<Fp8Weight>();
        bool all_fp8 = true;
        for (int64_t e = 0; e < E; ++e) {
          const std::string ep = mp + "experts." + std::to_string(e) + ".";
          Param gp = src.load_param({ep + "gate_proj.weight", {I, H}, TensorRole::RoutedExpert}, false);
          Param up = src.load_param({ep + "up_proj.weight", {I, H}, TensorRole::RoutedExpert}, false);
          Param dp = src.load_param({ep + "down_proj.weight", {H, I}, TensorRole::RoutedExpert}, false);
          gate_up.insert(gate_up.end(), gp.host.begin(), gp.host.end());
          gate_up.insert(gate_up.end(), up.host.begin(), up.host.end());
          down.insert(down.end(), dp.host.begin(), dp.host.end());
          all_fp8 = all_fp8 && gp.fp8 && up.fp8 && dp.fp8;
          if (all_fp8) {
            fp8_append_rows(*gu8, *gp.fp8);
            fp8_append_rows(*gu8, *up.fp8);
            fp8_append_rows(*d8, *dp.fp8);
          }
        }
        m.gate_up = std::move(gate_up);
        m.down = std::move(down);
        if (all_fp8 && E > 0) {
          m.gate_up.fp8 = std::move(gu8);
          m.down.fp8 = std::move(d8);
        }
      }
      if (const int64_t Is = c.shared_expert_intermediate_size; Is > 0) {
        // DeepSeek: "shared_experts", always added (no gate); Qwen: "shared_expert" scaled by a sigmoid gate.
        const bool deepseek = c.family == Family::DeepseekV32;
        const std::string sp = mp + (deepseek ? "shared_experts." : "shared_expert.");
        auto gp = make_linear(src, sp + "gate_proj", Is, H, false, TensorRole::Linear, false);
        auto up = make_linear(src, sp + "up_proj", Is, H, false, TensorRole::Linear, false);
        m.shared_gate_up = {2 * Is, H, stack_rows(std::move(gp.w), up.w), {}};
        m.shared_down = make_linear(src, sp + "down_proj", H, Is, false);
        if (!deepseek) m.shared_expert_gate = make_linear(src, mp + "shared_expert_gate", 1, H, false);
      }
    } else {
      const int64_t I = c.intermediate_size;
      auto gp = make_linear(src, mp + "gate_proj", I, H, c.mlp_bias, TensorRole::Linear, false);
      auto up = make_linear(src, mp + "up_proj", I, H, c.mlp_bias, TensorRole::Linear, false);
      L.mlp.gate_up = {2 * I, H, stack_rows(std::move(gp.w), up.w), concat_rows(std::move(gp.b.host), up.b.host)};
      L.mlp.down = make_linear(src, mp + "down_proj", H, I, c.mlp_bias);
    }
  }
  {
    std::vector<std::string> skip;  // DeepSeek's MTP (next-token prediction) layers: not used yet
    for (int64_t i = 0; i < c.mla.num_nextn_predict_layers; ++i)
      skip.push_back(P + "layers." + std::to_string(c.num_layers + i) + ".");
    src.check_complete(skip);
  }
  if (place) {
    place(w.embed);
    place(w.final_norm);
    if (!w.lm_head.empty()) place(w.lm_head);
  }
  return w;
}

void for_each_param(LayerWeights& L, const std::function<void(Param&)>& fn) {
  for (Param* p : {&L.input_norm, &L.post_attention_norm, &L.attn.q_proj.w, &L.attn.q_proj.b, &L.attn.k_proj.w,
                   &L.attn.k_proj.b, &L.attn.v_proj.w, &L.attn.v_proj.b, &L.attn.o_proj.w, &L.attn.o_proj.b,
                   &L.attn.q_norm, &L.attn.k_norm, &L.gdn.in_proj_qkv.w, &L.gdn.in_proj_z.w, &L.gdn.in_proj_b.w,
                   &L.gdn.in_proj_a.w, &L.gdn.conv1d, &L.gdn.dt_bias, &L.gdn.A_log, &L.gdn.norm, &L.gdn.out_proj.w,
                   &L.moe.router.w, &L.moe.e_score_correction_bias, &L.moe.gate_up, &L.moe.down, &L.moe.shared_gate_up.w, &L.moe.shared_down.w,
                   &L.moe.shared_expert_gate.w, &L.mlp.gate_up.w, &L.mlp.gate_up.b, &L.mlp.down.w, &L.mlp.down.b})
    if (!p->empty()) fn(*p);
  for_each_param(L.mla, fn);
}

void for_each_param(ModelWeights& w, const std::function<void(Param&)>& fn) {
  for (auto& L : w.layers) for_each_param(L, fn);
  for (Param* p : {&w.embed, &w.final_norm, &w.lm_head})
    if (!p->empty()) fn(*p);
}

ParamCounts count_params(const ModelConfig& cfg) {
  if (cfg.deepseek_v4) {
    const Dsv4ParamCounts d = count_deepseek_v4_params(*cfg.deepseek_v4);
    return {d.total, d.active_per_token, d.routed_expert, d.embedding};
  }
  CountingSource src(cfg.family == Family::Qwen3_5Moe);
  load_weights(cfg, src);
  ParamCounts p;
  // ModelConfig's bounds keep these sums far below 2^63; the checks guard that promise, so a count is
  // never printed negative or wrapped.
  auto add = [](int64_t& acc, int64_t n) {
    if (__builtin_add_overflow(acc, n, &acc)) fail("parameter count overflows int64");
  };
  for (auto& s : src.specs) {
    int64_t n = 1;
    for (auto d : s.shape)
      if (d < 0 || __builtin_mul_overflow(n, d, &n)) fail("tensor '{}': element count overflows int64", s.name);
    add(p.total, n);
    if (s.role == TensorRole::RoutedExpert) add(p.routed_expert, n);
    if (s.role == TensorRole::Embedding) add(p.embedding, n);
  }
  const double active_frac = cfg.num_experts ? double(cfg.num_experts_per_tok) / double(cfg.num_experts) : 1.0;
  p.active_per_token = p.total - p.embedding - p.routed_expert + int64_t(double(p.routed_expert) * active_frac);
  // A tied lm_head reuses the embedding matrix, which is then read for every token.
  if (cfg.tie_word_embeddings) p.active_per_token += p.embedding;
  return p;
}

}  // namespace moefold
