// DeepSeek-V3.2 (deepseek_v32) end to end on the CPU: the tiny fixture (tests/fixtures/deepseek_v32,
// scripts/make_deepseek_v32_fixtures.py; its logits against transformers are FixtureReference's) run
// in chunks and decode steps equals the whole forward; the indexer really drops tokens; the real
// config's published totals; damaged and unsupported variants fail with a clear message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "models/load_model.h"
#include "models/weight_loader.h"
#include "runtime/model_runner.h"
#include "fixture_util.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture = test::kFixtures / "deepseek_v32";
const fs::path kRealConfig = test::kSourceDir / "configs" / "deepseek-v3.2";

json fixture_config() {
  std::ifstream f(kFixture / "config.json");
  return json::parse(f);
}

/// The fixture's 70-token prompt followed by its 16 greedy tokens.
std::vector<int32_t> long_sequence() {
  auto ref = test::fixture_reference("deepseek_v32");
  for (auto& p : ref["prompts"])
    if (p["ids"].size() == 70) {
      auto ids = p["ids"].get<std::vector<int32_t>>();
      for (auto t : p["greedy"]) ids.push_back(t.get<int32_t>());
      return ids;
    }
  ADD_FAILURE() << "fixture has no 70-token prompt";
  return {};
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

TEST(DeepseekV32, ChunkedPrefillAndDecodeEqualTheWholeForward) {
  auto model = load_model(kFixture.string(), LoadFormat::Safetensors);
  auto ids = long_sequence();
  const int T = int(ids.size());
  const int64_t V = model->config().vocab_size;
  ASSERT_GT(T, model->config().mla.index_topk + 40) << "the indexer must drop tokens";
  ModelRunner whole_runner(*model, {16, 16, 1});
  int32_t s = whole_runner.add_sequence(ids);
  auto whole = whole_runner.step({{s, T, true}})[0];
  const double maxref = max_abs(whole);
  for (int split : {1, 63, 64, 65}) {
    ModelRunner r(*model, {16, 16, 1});
    int32_t q = r.add_sequence(ids);
    std::vector<float> got = r.step({{q, split, true}})[0];
    int pos = split;
    const int chunk = 7;  // one more prefill chunk over a page boundary, then decode steps
    auto part = r.step({{q, chunk, true}})[0];
    got.insert(got.end(), part.begin(), part.end());
    for (pos += chunk; pos < T; ++pos) {
      part = r.step({{q, 1, true}})[0];
      got.insert(got.end(), part.begin(), part.end());
    }
    ASSERT_EQ(got.size(), size_t(T) * size_t(V));
    double maxdiff = 0;
    for (size_t i = 0; i < got.size(); ++i) maxdiff = std::max(maxdiff, double(std::fabs(got[i] - whole[i])));
    EXPECT_LE(maxdiff, 1e-4 * maxref) << "split " << split;
  }
}

TEST(DeepseekV32, TheIndexerDropsTokensAndThatChangesTheOutput) {
  // Same weights with index_topk above every context: dense MLA. The last rows must differ clearly,
  // the rows whose context fits in index_topk must not.
  fs::path dense = fs::temp_directory_path() / ("moefold_dsv32_dense_" + std::to_string(::getpid()));
  fs::remove_all(dense);
  fs::create_directories(dense);
  for (auto& e : fs::directory_iterator(kFixture)) fs::copy(e.path(), dense / e.path().filename());
  json c = fixture_config();
  const int64_t topk = c["index_topk"];
  c["index_topk"] = 4096;
  std::ofstream(dense / "config.json") << c.dump();
  auto sparse_model = load_model(kFixture.string(), LoadFormat::Safetensors);
  auto dense_model = load_model(dense.string(), LoadFormat::Safetensors);
  auto ids = long_sequence();
  const int T = int(ids.size());
  const int64_t V = sparse_model->config().vocab_size;
  ModelRunner a(*sparse_model, {16, 16, 1}), b(*dense_model, {16, 16, 1});
  auto la = a.step({{a.add_sequence(ids), T, true}})[0];
  auto lb = b.step({{b.add_sequence(ids), T, true}})[0];
  double early = 0, late = 0;
  for (int t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      const double d = std::fabs(la[size_t(t * V + v)] - lb[size_t(t * V + v)]);
      (t < topk ? early : late) = std::max(t < topk ? early : late, d);
    }
  EXPECT_EQ(early, 0.0);
  EXPECT_GT(late, 1e-2 * max_abs(la));
  fs::remove_all(dense);
}

TEST(DeepseekV32, RealConfigGivesThePublishedShape) {
  ModelConfig c = ModelConfig::from_dir(kRealConfig.string());
  EXPECT_EQ(c.family, Family::DeepseekV32);
  EXPECT_EQ(c.num_layers, 61);
  EXPECT_EQ(std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true), 58);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.mla.index_topk, 2048);
  EXPECT_EQ(c.grouped_routing.n_group, 8);
  EXPECT_EQ(c.grouped_routing.topk_group, 4);
  EXPECT_DOUBLE_EQ(c.grouped_routing.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.shared_expert_intermediate_size, 2048);
  const double m = 0.1 * std::log(40.0) + 1;  // YaRN mscale(40, mscale_all_dim 1)
  EXPECT_NEAR(c.mla.softmax_scale, m * m / std::sqrt(192.0), 1e-12);
  ParamCounts p = count_params(c);
  // Published: 671 B without the MTP layer (685 B with it), 37 B active per token.
  EXPECT_NEAR(double(p.total) / 1e9, 671.9, 0.1);
  EXPECT_NEAR(double(p.active_per_token) / 1e9, 37.5, 0.1);
  // Latent 512 + rope key 64 + indexer key 128 per token and layer, bf16.
  EXPECT_EQ(c.kv_bytes_per_token(2), 61 * (512 + 64 + 128) * 2);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(DeepseekV32, UnsupportedOrDamagedConfigsFailClearly) {
  auto with = [](const char* key, json v) {
    json c = fixture_config();
    if (v.is_null() && std::string(key) != "q_lora_rank") c.erase(key);
    else c[key] = v;
    return error_of([&] { ModelConfig::from_json(c); });
  };
  EXPECT_NE(with("topk_method", "greedy").find("topk_method 'greedy' is not supported"), std::string::npos);
  EXPECT_NE(with("scoring_func", "softmax").find("scoring_func 'softmax'"), std::string::npos);
  EXPECT_NE(with("q_lora_rank", nullptr).find("q_lora_rank"), std::string::npos);
  EXPECT_NE(with("n_group", 3).find("not a multiple of n_group"), std::string::npos);
  EXPECT_NE(with("topk_group", 5).find("topk_group"), std::string::npos);
  EXPECT_NE(with("index_head_dim", 4).find("index_head_dim"), std::string::npos);  // below qk_rope_head_dim
  EXPECT_NE(with("qk_rope_head_dim", 7).find("must be even"), std::string::npos);
  EXPECT_NE(with("kv_lora_rank", nullptr).find("'kv_lora_rank' is missing"), std::string::npos);
  EXPECT_NE(with("index_topk", nullptr).find("'index_topk' is missing"), std::string::npos);
  EXPECT_NE(with("rope_scaling", json{{"type", "longrope"}, {"factor", 2}}).find("rope_type 'longrope'"), std::string::npos);
  EXPECT_NE(with("quantization_config", json{{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}})
                .find("weight_block_size"),
            std::string::npos);
  EXPECT_NE(with("quantization_config", json{{"quant_method", "awq"}}).find("not supported"), std::string::npos);
  EXPECT_NE(with("hidden_act", "gelu").find("hidden_act"), std::string::npos);
  json v3 = fixture_config();
  v3["model_type"] = "deepseek_v3";
  EXPECT_NE(error_of([&] { ModelConfig::from_json(v3); }).find("unknown model_type 'deepseek_v3'"), std::string::npos);
}

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& name)
      : path(fs::temp_directory_path() / ("moefold_dsv32_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
    std::ofstream(path / "config.json") << fixture_config().dump();
  }
  ~TmpDir() { fs::remove_all(path); }
};

/// Writes every tensor the fixture config implies (bf16, 0x3c3c), minus `drop`, plus `extra`.
void write_checkpoint(const TmpDir& d, const std::string& drop, const std::string& extra = "") {
  auto cfg = ModelConfig::from_dir(d.path.string());
  CountingSource counter(false);
  load_weights(cfg, counter);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorView v;
    v.name = name;
    v.dtype = DType::BF16;
    v.shape = std::move(shape);
    storage.emplace_back(size_t(v.numel()) * 2, uint8_t(0x3c));
    v.data = storage.back().data();
    v.nbytes = storage.back().size();
    views.push_back(v);
  };
  storage.reserve(counter.specs.size() + 2);
  for (auto& s : counter.specs)
    if (s.name != drop) add(s.name, s.shape);
  add("model.layers.3.self_attn.q_a_proj.weight", {32, 64});  // the MTP layer: skipped, not an error
  if (!extra.empty()) add(extra, {4});
  write_safetensors((d.path / "model.safetensors").string(), views);
}

TEST(DeepseekV32, CheckpointErrorsNameTheTensor) {
  {
    TmpDir d("ok");
    write_checkpoint(d, "");
    EXPECT_NO_THROW(load_model(d.path.string(), LoadFormat::Safetensors));
  }
  {
    TmpDir d("noindexer");
    write_checkpoint(d, "model.layers.1.self_attn.indexer.k_norm.bias");
    auto msg = error_of([&] { load_model(d.path.string(), LoadFormat::Safetensors); });
    EXPECT_NE(msg.find("model.layers.1.self_attn.indexer.k_norm.bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  }
  {
    TmpDir d("nobias");
    write_checkpoint(d, "model.layers.2.mlp.gate.e_score_correction_bias");
    auto msg = error_of([&] { load_model(d.path.string(), LoadFormat::Safetensors); });
    EXPECT_NE(msg.find("e_score_correction_bias"), std::string::npos) << msg;
  }
  {
    TmpDir d("extra");
    write_checkpoint(d, "", "model.layers.1.self_attn.indexer.unknown");
    auto msg = error_of([&] { load_model(d.path.string(), LoadFormat::Safetensors); });
    EXPECT_NE(msg.find("does not account for"), std::string::npos) << msg;
  }
}

TEST(DeepseekV32, DummyWeightsAtTheFixtureShapeGiveFiniteVariedLogits) {
  auto model = load_model(kFixture.string(), LoadFormat::Dummy, 7);
  auto ids = long_sequence();
  ModelRunner r(*model, {16, 16, 1});
  auto l = r.step({{r.add_sequence(ids), int32_t(ids.size()), false}})[0];
  for (float x : l) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(max_abs(l), 0.0);
  EXPECT_NE(*std::max_element(l.begin(), l.end()), *std::min_element(l.begin(), l.end()));
}

}  // namespace
