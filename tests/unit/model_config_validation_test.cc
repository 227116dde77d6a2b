// config.json validation (issue 11, item 2): every size and ratio ModelConfig reads is checked with a
// message naming the field, so that no config can crash the CLI (SIGFPE from a zero head count),
// allocate a negative-size vector, or make `moefold inspect` print a negative or wrapped count.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "fixture_util.h"
#include "core/error.h"
#include "io/model_config.h"
#include "models/weight_loader.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

json fixture(const std::string& family) {
  std::ifstream f(moefold::test::kSourceDir.string() + "/tests/fixtures/" + family + "/config.json");
  return json::parse(f);
}

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Each case: a field change on a fixture and the text the error must contain.
struct Case {
  std::string family;
  std::function<void(json&)> edit;
  std::string expect;
};

std::vector<Case> bad_cases() {
  return {
      {"qwen3_5_moe_text", [](json& j) { j["num_attention_heads"] = 0; }, "'num_attention_heads' = 0 is out of range"},
      {"qwen3_5_moe_text", [](json& j) { j["num_key_value_heads"] = 0; }, "'num_key_value_heads' = 0 is out of range"},
      {"qwen3_5_moe_text", [](json& j) { j["num_key_value_heads"] = 3; }, "not a multiple of num_key_value_heads 3"},
      {"qwen3_5_moe_text", [](json& j) { j["linear_num_key_heads"] = 0; }, "'linear_num_key_heads' = 0"},
      {"qwen3_5_moe_text", [](json& j) { j["linear_num_value_heads"] = -4; }, "'linear_num_value_heads' = -4"},
      {"qwen3_5_moe_text",
       [](json& j) {
         j.erase("layer_types");
         j["full_attention_interval"] = 0;
       },
       "'full_attention_interval' = 0"},
      {"llama",
       [](json& j) {
         j.erase("head_dim");
         j["hidden_size"] = INT64_MIN;
         j["num_attention_heads"] = -1;
       },
       "'hidden_size' = -9223372036854775808 is out of range"},
      {"llama", [](json& j) { j["num_hidden_layers"] = -2; }, "'num_hidden_layers' = -2 is out of range"},
      {"llama", [](json& j) { j["num_hidden_layers"] = 0; }, "'num_hidden_layers' = 0 is out of range"},
      {"llama", [](json& j) { j["vocab_size"] = -1; }, "'vocab_size' = -1 is out of range"},
      {"llama", [](json& j) { j["hidden_size"] = 0; }, "'hidden_size' = 0 is out of range"},
      {"llama", [](json& j) { j["hidden_size"] = 128.5; }, "'hidden_size' must be an integer, not 128.5"},
      {"llama", [](json& j) { j["vocab_size"] = "many"; }, "'vocab_size' must be an integer"},
      {"llama", [](json& j) { j["vocab_size"] = uint64_t(1) << 63; }, "'vocab_size' = 9223372036854775808 is out of range"},
      {"llama", [](json& j) { j["vocab_size"] = int64_t(1) << 40; }, "'vocab_size' = 1099511627776 is out of range"},
      {"llama", [](json& j) { j["head_dim"] = 0; }, "'head_dim' = 0"},
      {"llama", [](json& j) { j["tie_word_embeddings"] = "yes"; }, "'tie_word_embeddings' must be true or false"},
      {"llama", [](json& j) { j["rms_norm_eps"] = "small"; }, "'rms_norm_eps' must be a number"},
      {"llama", [](json& j) { j["intermediate_size"] = -8; }, "'intermediate_size' = -8"},
      {"llama", [](json& j) { j["eos_token_id"] = "</s>"; }, "'eos_token_id' must hold token ids"},
      {"llama", [](json& j) { j["max_position_embeddings"] = 0; }, "'max_position_embeddings' = 0"},
      {"qwen3_moe", [](json& j) { j["num_experts_per_tok"] = 0; }, "'num_experts_per_tok' = 0 is out of range [1, "},
      {"qwen3_moe",
       [](json& j) { j["num_experts_per_tok"] = j["num_experts"].get<int64_t>() + 1; },
       "'num_experts_per_tok'"},
      {"qwen3_moe", [](json& j) { j["num_experts"] = 0; }, "'num_experts' = 0"},
      {"qwen3_moe", [](json& j) { j["decoder_sparse_step"] = 0; }, "'decoder_sparse_step' = 0"},
      {"qwen3_moe", [](json& j) { j["mlp_only_layers"] = {99}; }, "mlp_only_layers entry 99"},
      {"qwen3_moe", [](json& j) { j["moe_intermediate_size"] = -1; }, "'moe_intermediate_size' = -1"},
      {"qwen3_next", [](json& j) { j["layer_types"] = "full_attention"; }, "'layer_types' must be a list"},
      {"qwen3_next", [](json& j) { j["linear_conv_kernel_dim"] = 0; }, "'linear_conv_kernel_dim' = 0"},
      {"qwen3_next", [](json& j) { j["linear_key_head_dim"] = 1.5; }, "'linear_key_head_dim' must be an integer"},
  };
}

TEST(ModelConfigValidation, EveryBadSizeNamesItsField) {
  for (const Case& c : bad_cases()) {
    json j = fixture(c.family);
    c.edit(j);
    std::string msg = error_of(j);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.family << ": expected '" << c.expect << "', got '" << msg << "'";
  }
}

TEST(ModelConfigValidation, FixturesStillParse) {
  for (const char* f : {"llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"})
    EXPECT_EQ(error_of(fixture(f)), "") << f;
}

TEST(ModelConfigValidation, LargestAllowedSizesCountWithoutOverflow) {
  // Every bound at its maximum (dense, so the walk stays short): counts stay positive and exact.
  json j = {{"model_type", "qwen3"},          {"vocab_size", 1 << 24},          {"hidden_size", 1 << 16},
            {"num_hidden_layers", 1024},      {"num_attention_heads", 1024},    {"num_key_value_heads", 1024},
            {"head_dim", 4096},               {"intermediate_size", 1 << 20}};
  ModelConfig c = ModelConfig::from_json(j);
  ParamCounts p = count_params(c);
  EXPECT_GT(p.total, int64_t(1) << 50);
  EXPECT_GT(p.active_per_token, 0);
  EXPECT_GT(c.kv_bytes_per_token(2), 0);
}

/// Runs `moefold inspect` on a config; returns the exit status (-1 if killed by a signal) and stderr.
int inspect(const json& config, std::string* err, std::string* out) {
  fs::path dir = fs::temp_directory_path() / ("moefold_cfgval_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump();
  std::string cmd = std::string(MOEFOLD_BINARY) + " inspect --json --model " + dir.string() + " >" +
                    (dir / "out").string() + " 2>" + (dir / "err").string();
  int rc = std::system(cmd.c_str());
  std::ifstream e(dir / "err"), o(dir / "out");
  err->assign(std::istreambuf_iterator<char>(e), {});
  out->assign(std::istreambuf_iterator<char>(o), {});
  fs::remove_all(dir);
  // The shell reports a child killed by signal N as exit status 128 + N.
  if (!WIFEXITED(rc) || WEXITSTATUS(rc) > 128) return -1;
  return WEXITSTATUS(rc);
}

TEST(ModelConfigValidation, InspectExitsNonZeroWithTheFieldInsteadOfCrashing) {
  for (const Case& c : bad_cases()) {
    json j = fixture(c.family);
    c.edit(j);
    std::string err, out;
    EXPECT_EQ(inspect(j, &err, &out), 1) << c.expect << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
    EXPECT_EQ(out, "") << c.expect;
  }
}

TEST(ModelConfigValidation, InspectCountsAreNeverNegative) {
  json j = fixture("qwen3_5_moe_text");
  std::string err, out;
  ASSERT_EQ(inspect(j, &err, &out), 0) << err;
  json r = json::parse(out);
  for (const char* k : {"total_params", "active_params_per_token", "routed_expert_params",
                        "kv_cache_bytes_per_token_bf16", "deltanet_state_bytes_per_seq"})
    EXPECT_GT(r[k].get<int64_t>(), 0) << k;
}

}  // namespace
