// DeepSeek-V4 weights in the DeepSeek-native layout: one walk over the tensors the config implies,
// shared by the checkpoint reader, the dummy source and the parameter counter.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/deepseek_v4.h"
#include "models/memory_check.h"
#include "models/weight_loader.h"

namespace moefold {

namespace {

class Dsv4Reader {
 public:
  virtual ~Dsv4Reader() = default;
  virtual std::vector<float> f32(const TensorSpec& spec) = 0;
  virtual std::vector<int32_t> ids(const std::string& name, int64_t rows, int64_t cols, int64_t num_experts) = 0;
};

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

/// FP4 e2m1 code -> value (sign bit 3, then exponent 2 bits, mantissa 1 bit).
constexpr float kFp4[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

class CheckpointReader : public Dsv4Reader {
 public:
  explicit CheckpointReader(const std::string& dir) : dir_(dir), ckpt_(dir) {}

  const TensorView& get(const std::string& name, const std::vector<int64_t>& implied) {
    if (!ckpt_.has(name))
      fail("tensor '{}' (shape {} implied by config.json) is missing from the checkpoint in '{}'", name,
           shape_str(implied), dir_);
    used_.insert(name);
    return ckpt_.get(name);
  }

  std::vector<float> f32(const TensorSpec& spec) override {
    const TensorView& t = get(spec.name, spec.shape);
    const bool packed = (t.dtype == DType::I8 || t.dtype == DType::U8) && spec.shape.size() == 2;
    if (packed) return fp4(t, spec);
    if (t.shape != spec.shape)
      fail("tensor '{}' has shape {} in the checkpoint but config.json implies {}", spec.name, shape_str(t.shape),
           shape_str(spec.shape));
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F8_E4M3)
      fail("tensor '{}' has dtype {}; weights must be F32, BF16, F16, F8_E4M3 or FP4 packed in I8/U8", spec.name,
           dtype_name(t.dtype));
    std::vector<float> w = t.to_f32();
    if (t.dtype == DType::F8_E4M3) fp8_scale(t, w);
    return w;
  }

  std::vector<int32_t> ids(const std::string& name, int64_t rows, int64_t cols, int64_t E) override {
    const TensorView& t = get(name, {rows, cols});
    if (t.shape != std::vector<int64_t>{rows, cols})
      fail("tensor '{}' has shape {} in the checkpoint but config.json implies [{}, {}]", name, shape_str(t.shape),
           rows, cols);
    std::vector<int32_t> out(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      if (t.dtype == DType::I32) v = static_cast<const int32_t*>(t.data)[i];
      else if (t.dtype == DType::I64) v = static_cast<const int64_t*>(t.data)[i];
      else if (t.dtype == DType::U8) v = static_cast<const uint8_t*>(t.data)[i];
      else fail("tensor '{}' has dtype {}; expected I32, I64 or U8 expert ids", name, dtype_name(t.dtype));
      if (v < 0 || v >= E) fail("tensor '{}': expert id {} at element {} is outside [0, {})", name, v, i, E);
      out[i] = int32_t(v);
    }
    return out;
  }

  void check_all_used() const {
    for (auto& n : ckpt_.names())
      if (!used_.count(n) && n.rfind("mtp.", 0) != 0)
        fail("checkpoint in '{}' has tensor '{}' that config.json does not account for", dir_, n);
  }

 private:
  static std::string scale_name(const std::string& n) {
    const std::string suf = ".weight";
    return n.size() > suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0
               ? n.substr(0, n.size() - suf.size()) + ".scale"
               : n + ".scale";
  }
  /// FP8 e4m3 with one scale per 128 x 128 block (E8M0 or fp32): W = W8 * scale[i / 128, j / 128].
  void fp8_scale(const TensorView& t, std::vector<float>& w) {
    const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1, cols = t.shape.back(), blk = 128;
    const int64_t br = (rows + blk - 1) / blk, bc = (cols + blk - 1) / blk;
    std::string sn = scale_name(t.name);
    if (!ckpt_.has(sn)) {
      if (ckpt_.has(t.name + "_scale_inv")) sn = t.name + "_scale_inv";
      else fail("FP8 tensor '{}' has no block scale '{}'", t.name, sn);
    }
    const TensorView& sc = get(sn, {br, bc});
    if (sc.shape != std::vector<int64_t>{br, bc})
      fail("tensor '{}' has shape {} but 128 x 128 blocks over {} imply [{}, {}]", sn, shape_str(sc.shape),
           shape_str(t.shape), br, bc);
    std::vector<float> s = sc.to_f32();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) w[size_t(i * cols + j)] *= s[size_t((i / blk) * bc + j / blk)];
  }
  /// FP4 e2m1, two per byte (element 2c in the low nibble, 2c + 1 in the high one), one E8M0 scale
  /// per 32 consecutive elements of a row: stored [out, in / 2] with scale [out, in / 32].
  std::vector<float> fp4(const TensorView& t, const TensorSpec& spec) {
    const int64_t rows = spec.shape[0], cols = spec.shape[1];
    if (cols % 32 || t.shape != std::vector<int64_t>{rows, cols / 2})
      fail("FP4 tensor '{}' has shape {} but config.json implies {} (stored as [{}, {}] bytes)", spec.name,
           shape_str(t.shape), shape_str(spec.shape), rows, cols / 2);
    const std::string sn = scale_name(spec.name);
    const TensorView& sc = get(sn, {rows, cols / 32});
    if (sc.shape != std::vector<int64_t>{rows, cols / 32})
      fail("tensor '{}' has shape {} but per-32 FP4 scales over {} imply [{}, {}]", sn, shape_str(sc.shape),
           shape_str(spec.shape), rows, cols / 32);
    std::vector<float> s = sc.to_f32(), w(static_cast<size_t>(rows * cols));
    const auto* b = static_cast<const uint8_t*>(t.data);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const uint8_t byte = b[i * (cols / 2) + j / 2];
        w[size_t(i * cols + j)] = kFp4[j % 2 ? byte >> 4 : byte & 15] * s[size_t(i * (cols / 32) + j / 32)];
      }
    return w;
  }

  std::string dir_;
  Checkpoint ckpt_;
  std::set<std::string> used_;
};

class DummyReader : public Dsv4Reader {
 public:
  explicit DummyReader(uint64_t seed) : src_(dummy_source(seed, false)) {}
  std::vector<float> f32(const TensorSpec& spec) override { return src_->load(spec); }
  std::vector<int32_t> ids(const std::string&, int64_t rows, int64_t cols, int64_t E) override {
    std::vector<int32_t> out(static_cast<size_t>(rows * cols));
    for (int64_t v = 0; v < rows; ++v)
      for (int64_t j = 0; j < cols; ++j) out[size_t(v * cols + j)] = int32_t((v * cols + j) % E);
    return out;
  }

 private:
  std::unique_ptr<WeightSource> src_;
};

class CountingReader : public Dsv4Reader {
 public:
  std::vector<float> f32(const TensorSpec& spec) override {
    specs.push_back(spec);
    return {};
  }
  std::vector<int32_t> ids(const std::string&, int64_t, int64_t, int64_t) override { return {}; }
  std::vector<TensorSpec> specs;
};

Dsv4Weights walk(const DeepseekV4Config& c, Dsv4Reader& r) {
  const int64_t H = c.hidden_size, V = c.vocab_size, hc = c.hc_mult, mix = (2 + hc) * hc, D = c.head_dim;
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, g = c.o_groups;
  auto P = [&](const std::string& n, std::vector<int64_t> shape, TensorRole role) {
    return Param(r.f32({n, std::move(shape), role}));
  };
  auto lin = [&](const std::string& n, int64_t out, int64_t in, TensorRole role = TensorRole::Linear) {
    Linear l;
    l.out = out;
    l.in = in;
    l.w = P(n + ".weight", {out, in}, role);
    return l;
  };
  auto comp = [&](const std::string& p, int64_t m, int64_t dim, int64_t width) {
    Dsv4CompressorWeights w;
    w.wkv = lin(p + "wkv", width, H);
    w.wgate = lin(p + "wgate", width, H);
    w.ape = P(p + "ape", {m, width}, TensorRole::Bias);
    w.norm = P(p + "norm.weight", {dim}, TensorRole::NormPlain);
    return w;
  };
  Dsv4Weights w;
  w.embed = P("embed.weight", {V, H}, TensorRole::Embedding);
  w.layers.resize(size_t(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Dsv4LayerWeights& L = w.layers[size_t(i)];
    const std::string lp = "layers." + std::to_string(i) + ".";
    const int32_t ratio = c.compress_ratios[size_t(i)];
    L.attn_norm = P(lp + "attn_norm.weight", {H}, TensorRole::NormPlain);
    L.ffn_norm = P(lp + "ffn_norm.weight", {H}, TensorRole::NormPlain);
    L.hc_attn_fn = P(lp + "hc_attn_fn", {mix, hc * H}, TensorRole::Linear);
    L.hc_attn_base = P(lp + "hc_attn_base", {mix}, TensorRole::Bias);
    L.hc_attn_scale = P(lp + "hc_attn_scale", {3}, TensorRole::NormPlain);
    L.hc_ffn_fn = P(lp + "hc_ffn_fn", {mix, hc * H}, TensorRole::Linear);
    L.hc_ffn_base = P(lp + "hc_ffn_base", {mix}, TensorRole::Bias);
    L.hc_ffn_scale = P(lp + "hc_ffn_scale", {3}, TensorRole::NormPlain);
    const std::string ap = lp + "attn.";
    L.wq_a = lin(ap + "wq_a", c.q_lora_rank, H);
    L.q_norm = P(ap + "q_norm.weight", {c.q_lora_rank}, TensorRole::NormPlain);
    L.wq_b = lin(ap + "wq_b", c.num_heads * D, c.q_lora_rank);
    L.wkv = lin(ap + "wkv", D, H);
    L.kv_norm = P(ap + "kv_norm.weight", {D}, TensorRole::NormPlain);
    L.wo_a = lin(ap + "wo_a", g * c.o_lora_rank, c.num_heads * D / g);
    L.wo_b = lin(ap + "wo_b", H, g * c.o_lora_rank);
    L.attn_sink = P(ap + "attn_sink", {c.num_heads}, TensorRole::Bias);
    if (ratio > 0) L.comp = comp(ap + "compressor.", ratio, D, ratio == 4 ? 2 * D : D);
    if (ratio == 4) {
      const int64_t ih = c.index_n_heads, id = c.index_head_dim;
      L.index_comp = comp(ap + "indexer.compressor.", ratio, id, 2 * id);
      L.index_wq_b = lin(ap + "indexer.wq_b", ih * id, c.q_lora_rank);
      L.index_weights_proj = lin(ap + "indexer.weights_proj", ih, H);
    }
    const std::string fp = lp + "ffn.";
    L.gate = lin(fp + "gate", E, H, TensorRole::Router);
    if (c.is_hash_layer(i)) L.tid2eid = r.ids(fp + "gate.tid2eid", V, c.num_experts_per_tok, E);
    else L.gate_bias = P(fp + "gate.bias", {E}, TensorRole::Bias);
    std::vector<float> gate_up, down;
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = fp + "experts." + std::to_string(e) + ".";
      auto w1 = r.f32({ep + "w1.weight", {I, H}, TensorRole::RoutedExpert});
      auto w3 = r.f32({ep + "w3.weight", {I, H}, TensorRole::RoutedExpert});
      auto w2 = r.f32({ep + "w2.weight", {H, I}, TensorRole::RoutedExpert});
      gate_up.insert(gate_up.end(), w1.begin(), w1.end());
      gate_up.insert(gate_up.end(), w3.begin(), w3.end());
      down.insert(down.end(), w2.begin(), w2.end());
    }
    L.gate_up = Param(std::move(gate_up));
    L.down = Param(std::move(down));
    auto s1 = r.f32({fp + "shared_experts.w1.weight", {I, H}, TensorRole::Linear});
    auto s3 = r.f32({fp + "shared_experts.w3.weight", {I, H}, TensorRole::Linear});
    s1.insert(s1.end(), s3.begin(), s3.end());
    L.shared_gate_up = {2 * I, H, Param(std::move(s1)), {}};
    L.shared_down = lin(fp + "shared_experts.w2", H, I);
  }
  w.norm = P("norm.weight", {H}, TensorRole::NormPlain);
  w.hc_head_fn = P("hc_head_fn", {hc, hc * H}, TensorRole::Linear);
  w.hc_head_base = P("hc_head_base", {hc}, TensorRole::Bias);
  w.hc_head_scale = P("hc_head_scale", {1}, TensorRole::NormPlain);
  w.head = P("head.weight", {V, H}, TensorRole::LmHead);
  return w;
}

}  // namespace

Dsv4ParamCounts count_deepseek_v4_params(const DeepseekV4Config& cfg) {
  CountingReader r;
  walk(cfg, r);
  Dsv4ParamCounts p;
  for (auto& s : r.specs) {
    const int64_t n = numel_of(s.shape);
    p.total += n;
    if (s.role == TensorRole::RoutedExpert) p.routed_expert += n;
    if (s.role == TensorRole::Embedding) p.embedding += n;
  }
  p.active_per_token = p.total - p.embedding - p.routed_expert +
                       int64_t(double(p.routed_expert) * double(cfg.num_experts_per_tok) / double(cfg.num_experts));
  return p;
}

std::unique_ptr<DeepseekV4Model> load_deepseek_v4(const std::string& dir, bool dummy, uint64_t seed) {
  const std::string path = dir + "/config.json";
  std::ifstream f(path);
  if (!f) fail("no config.json in model directory '{}'", dir);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("'{}': malformed JSON: {}", path, e.what());
  }
  const std::string mt = j.is_object() ? j.value("model_type", std::string()) : std::string();
  if (mt != "deepseek_v4") fail("'{}': model_type '{}' is not deepseek_v4", path, mt);
  DeepseekV4Config cfg = DeepseekV4Config::from_json(j);
  check_memory_fits(count_deepseek_v4_params(cfg).total * 4, available_memory_bytes(),
                    fmt::format("model '{}' (deepseek_v4 fp32 weights)", dir), /*gpu_runs_it=*/false);
  Dsv4Weights w;
  if (dummy) {
    DummyReader r(seed);
    w = walk(cfg, r);
  } else {
    CheckpointReader r(dir);
    w = walk(cfg, r);
    r.check_all_used();
  }
  return std::make_unique<DeepseekV4Model>(std::move(cfg), std::move(w));
}

}  // namespace moefold
