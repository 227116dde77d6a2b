// Checkpoint loading: every way a model directory can be wrong gives one clear Error (and a non-zero
// exit from the CLI), never a crash; dummy weights and checkpoints share one layout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "models/load_model.h"
#include "models/weight_loader.h"
#include "fixture_util.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

json llama_config() {
  return {{"model_type", "llama"},  {"vocab_size", 11},          {"hidden_size", 8},  {"num_hidden_layers", 1},
          {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"intermediate_size", 12}, {"tie_word_embeddings", true}};
}

struct Dir {
  fs::path path;
  explicit Dir(const std::string& name) : path(fs::temp_directory_path() / ("moefold_loader_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  void write_config(const json& j) const { std::ofstream(path / "config.json") << j.dump(); }
};

// Writes every tensor the config implies (bf16 ones), optionally dropping or reshaping one.
void write_checkpoint(const Dir& d, const ModelConfig& cfg, const std::string& drop = "",
                      const std::string& reshape = "", DType dtype = DType::BF16) {
  CountingSource counter(false);
  load_weights(cfg, counter);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  for (auto& s : counter.specs) {
    if (s.name == drop) continue;
    TensorView v;
    v.name = s.name;
    v.dtype = dtype;
    v.shape = s.shape;
    if (s.name == reshape) v.shape.back() += 1;
    storage.emplace_back(size_t(v.numel()) * dtype_size(dtype), uint8_t(0x3c));
    v.data = storage.back().data();
    v.nbytes = storage.back().size();
    views.push_back(v);
  }
  write_safetensors((d.path / "model.safetensors").string(), views);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Loader, LoadsAWellFormedCheckpoint) {
  Dir d("ok");
  d.write_config(llama_config());
  auto cfg = ModelConfig::from_dir(d.path.string());
  write_checkpoint(d, cfg);
  auto m = load_model(d.path.string(), LoadFormat::Safetensors);
  EXPECT_EQ(m->config().vocab_size, 11);
}

TEST(Loader, MissingTensorNamesItAndItsShape) {
  Dir d("missing");
  d.write_config(llama_config());
  auto cfg = ModelConfig::from_dir(d.path.string());
  write_checkpoint(d, cfg, "model.layers.0.mlp.up_proj.weight");
  auto msg = error_of([&] { load_model(d.path.string(), LoadFormat::Safetensors); });
  EXPECT_NE(msg.find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[12, 8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(Loader, MisShapedTensorNamesBothShapes) {
  Dir d("shape");
  d.write_config(llama_config());
  auto cfg = ModelConfig::from_dir(d.path.string());
  write_checkpoint(d, cfg, "", "model.layers.0.self_attn.k_proj.weight");
  auto msg = error_of([&] { load_model(d.path.string(), LoadFormat::Safetensors); });
  EXPECT_NE(msg.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 9]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 8]"), std::string::npos) << msg;
}

TEST(Loader, WrongDtypeIsRejected) {
  Dir d("dtype");
  d.write_config(llama_config());
  auto cfg = ModelConfig::from_dir(d.path.string());
  write_checkpoint(d, cfg, "", "", DType::I32);
  auto msg = error_of([&] { load_model(d.path.string(), LoadFormat::Safetensors); });
  EXPECT_NE(msg.find("dtype I32"), std::string::npos) << msg;
  // A dtype safetensors knows but moefold does not.
  std::ofstream(d.path / "model.safetensors", std::ios::binary | std::ios::trunc);
  std::string h = R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  uint64_t n = h.size();
  std::ofstream f(d.path / "model.safetensors", std::ios::binary);
  f.write(reinterpret_cast<char*>(&n), 8);
  f << h << std::string(8, '\0');
  f.close();
  msg = error_of([&] { Checkpoint c(d.path.string()); });
  EXPECT_NE(msg.find("unsupported safetensors dtype 'F64'"), std::string::npos) << msg;
}

TEST(Loader, TruncatedAndMalformedFilesAreRejected) {
  Dir d("trunc");
  d.write_config(llama_config());
  auto cfg = ModelConfig::from_dir(d.path.string());
  write_checkpoint(d, cfg);
  auto file = d.path / "model.safetensors";
  auto size = fs::file_size(file);
  // Truncated header: keep only a part of the JSON.
  fs::resize_file(file, 40);
  auto msg = error_of([&] { Checkpoint c(d.path.string()); });
  EXPECT_NE(msg.find("truncated safetensors header"), std::string::npos) << msg;
  // Truncated data: header intact, tensor bytes cut.
  write_checkpoint(d, cfg);
  fs::resize_file(file, size - 10);
  msg = error_of([&] { Checkpoint c(d.path.string()); });
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  // Too short for the length field; garbage JSON.
  fs::resize_file(file, 3);
  EXPECT_NE(error_of([&] { Checkpoint c(d.path.string()); }).find("too short"), std::string::npos);
  {
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    uint64_t n = 5;
    f.write(reinterpret_cast<char*>(&n), 8);
    f << "{bad}";
  }
  EXPECT_NE(error_of([&] { Checkpoint c(d.path.string()); }).find("malformed"), std::string::npos);
}

TEST(Loader, ConfigErrors) {
  auto msg = error_of([] { ModelConfig::from_json({{"model_type", "gpt_oss"}}); });
  EXPECT_NE(msg.find("unknown model_type 'gpt_oss'"), std::string::npos) << msg;
  json c = llama_config();
  c.erase("hidden_size");
  msg = error_of([&] { ModelConfig::from_json(c); });
  EXPECT_NE(msg.find("'hidden_size'"), std::string::npos) << msg;
  c = llama_config();
  c["num_hidden_layers"] = "two";
  msg = error_of([&] { ModelConfig::from_json(c); });
  EXPECT_NE(msg.find("field 'num_hidden_layers' must be an integer, not \"two\""), std::string::npos) << msg;
  EXPECT_NE(error_of([] { ModelConfig::from_dir("/nonexistent/dir"); }).find("no config.json"), std::string::npos);
}

TEST(Loader, Qwen36ShapeFacts) {
  auto cfg = ModelConfig::from_dir((moefold::test::kSourceDir / "configs" / "qwen3.6-35b-a3b").string());
  EXPECT_EQ(cfg.family, Family::Qwen3_5Moe);
  EXPECT_EQ(cfg.tensor_prefix, "model.language_model.");
  EXPECT_EQ(cfg.num_layers_of(LayerType::FullAttention), 10);
  EXPECT_EQ(cfg.rotary_dim, 64);
  EXPECT_EQ(cfg.eos_token_ids, (std::vector<int32_t>{248046, 248044}));
  auto p = count_params(cfg);
  EXPECT_NEAR(double(p.total) / 1e9, 34.66, 0.005);
  EXPECT_NEAR(double(p.active_per_token) / 1e9, 2.95, 0.01);
  EXPECT_EQ(cfg.kv_bytes_per_token(2), 20 * 1024);
  EXPECT_EQ(cfg.deltanet_state_bytes_per_seq(2), 30 * (3 * 8192 * 2 + 32 * 128 * 128 * 4));
}

int run(const std::string& args, std::string* err) {
  std::string cmd = std::string(MOEFOLD_BINARY) + " " + args + " 2>/tmp/moefold_cli_err";
  int rc = std::system(cmd.c_str());
  std::ifstream f("/tmp/moefold_cli_err");
  err->assign(std::istreambuf_iterator<char>(f), {});
  return rc;
}

TEST(Cli, ErrorsExitNonZeroWithOneMessage) {
  Dir d("cli");
  d.write_config(llama_config());
  auto cfg = ModelConfig::from_dir(d.path.string());
  write_checkpoint(d, cfg, "model.norm.weight");
  std::string err;
  EXPECT_NE(run("generate --model " + d.path.string() + " --prompt-ids 1,2", &err), 0);
  EXPECT_NE(err.find("error: tensor 'model.norm.weight'"), std::string::npos) << err;
  d.write_config({{"model_type", "mamba"}});
  EXPECT_NE(run("inspect --model " + d.path.string(), &err), 0);
  EXPECT_NE(err.find("unknown model_type 'mamba'"), std::string::npos) << err;
  EXPECT_NE(run("logits --model " + d.path.string() + " --prompt-ids 1,x --out /tmp/x.npy", &err), 0);
  EXPECT_NE(err.find("error:"), std::string::npos) << err;
  EXPECT_NE(run("generate --model /nonexistent/model --prompt hi", &err), 0);
  EXPECT_NE(err.find("not a model directory"), std::string::npos) << err;
  EXPECT_NE(run("generate --model " + d.path.string() + " --prompt-ids 1,2,", &err), 0);
  EXPECT_NE(err.find("trailing comma"), std::string::npos) << err;
  EXPECT_NE(run("generate --model " + d.path.string() + " --prompt-ids 1 --output xml", &err), 0);
  EXPECT_NE(run("generate --model " + d.path.string() + " --prompt-ids 1 --max-tokens 0", &err), 0);
  EXPECT_NE(run("serve --model " + d.path.string() + " --port 70000", &err), 0);
  EXPECT_NE(err.find("65535"), std::string::npos) << err;
}

}  // namespace

namespace {

TEST(Loader, BlockScaledFp8IsDequantised) {
  Dir d("fp8");
  json c = llama_config();
  c["hidden_size"] = 130;  // two column blocks of 128, a partial last one
  c["head_dim"] = 16;
  c["intermediate_size"] = 260;
  c["num_attention_heads"] = 2;
  c["num_key_value_heads"] = 2;
  d.write_config(c);
  auto cfg = ModelConfig::from_dir(d.path.string());
  CountingSource counter(false);
  load_weights(cfg, counter);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  std::vector<float> expected_gate;
  for (auto& s : counter.specs) {
    TensorView v;
    v.name = s.name;
    v.shape = s.shape;
    const bool quant = s.name.find("mlp.gate_proj") != std::string::npos;
    v.dtype = quant ? DType::F8_E4M3 : DType::BF16;
    storage.emplace_back(size_t(v.numel()) * dtype_size(v.dtype));
    for (size_t i = 0; i < storage.back().size(); ++i) storage.back()[i] = quant ? uint8_t(0x30 + i % 7) : 0x3c;
    v.data = storage.back().data();
    v.nbytes = storage.back().size();
    views.push_back(v);
    if (quant) {
      // scale_inv [ceil(260/128), ceil(130/128)] = [3, 2], bf16
      TensorView sc{s.name.substr(0, s.name.size()) + "_scale_inv", DType::BF16, {3, 2}, nullptr, 12};
      storage.emplace_back(12);
      auto* p = reinterpret_cast<uint16_t*>(storage.back().data());
      for (int i = 0; i < 6; ++i) p[i] = f32_to_bf16(0.5f * float(i + 1));
      sc.data = storage.back().data();
      views.push_back(sc);
      for (int64_t i = 0; i < 260; ++i)
        for (int64_t j = 0; j < 130; ++j)
          expected_gate.push_back(f8e4m3_to_f32(uint8_t(0x30 + (i * 130 + j) % 7)) * 0.5f * float((i / 128) * 2 + j / 128 + 1));
    }
  }
  write_safetensors((d.path / "model.safetensors").string(), views);
  auto src = checkpoint_source(d.path.string());
  auto w = load_weights(cfg, *src);
  std::vector<float> gate(w.layers[0].mlp.gate_up.w.host.begin(), w.layers[0].mlp.gate_up.w.host.begin() + 260 * 130);
  EXPECT_EQ(gate, expected_gate);
}

}  // namespace

// A deferred dummy tensor (DummyRecipe, generated later on a device) holds exactly the values the
// materialised one does; small tensors and roles that are not one scale times u are never deferred.
TEST(Loader, DeferredDummyTensorsEqualMaterialisedOnes) {
  auto eager = dummy_source(9, true, false), lazy = dummy_source(9, true, true);
  for (TensorRole role : {TensorRole::Embedding, TensorRole::LmHead, TensorRole::Linear, TensorRole::Router,
                          TensorRole::RoutedExpert}) {
    const TensorSpec spec{"model.layers.3.mlp.experts.gate_up_proj", {4, 96, 256}, role};
    const std::vector<float> want = eager->load(spec);
    Param p = lazy->load_param(spec, true);
    ASSERT_TRUE(p.dummy.has_value());
    EXPECT_TRUE(p.host.empty());
    EXPECT_EQ(p.numel, int64_t(want.size()));
    size_t mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i) mismatches += dummy_value(*p.dummy, int64_t(i)) != want[i];
    EXPECT_EQ(mismatches, 0u);
    EXPECT_FALSE(lazy->load_param(spec, false).dummy.has_value());  // the caller needs host values
  }
  EXPECT_FALSE(lazy->load_param({"x.weight", {16, 16}, TensorRole::Linear}, true).dummy.has_value());   // small
  EXPECT_FALSE(lazy->load_param({"n.weight", {512, 256}, TensorRole::NormPlain}, true).dummy.has_value());
  EXPECT_FALSE(eager->load_param({"y.weight", {512, 256}, TensorRole::Linear}, true).dummy.has_value());
}
