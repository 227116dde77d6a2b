// End-to-end invariants of the batched CPU forward on dummy-weight models of every family:
// a prompt prefilled in pieces equals one whole prefill, and sequences run together in one batch
// (mixed prefill and decode rows) equal the same sequences run alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/load_model.h"
#include "runtime/model_runner.h"
#include "test_util.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

json tiny_config(const std::string& family) {
  if (family == "deepseek_v32")  // MLA + lightning indexer (index_topk 40 < the 130-token prompts), grouped routing
    return {{"model_type", family}, {"vocab_size", 97}, {"hidden_size", 48}, {"num_hidden_layers", 3},
            {"num_attention_heads", 4}, {"q_lora_rank", 24}, {"kv_lora_rank", 16}, {"qk_nope_head_dim", 8},
            {"qk_rope_head_dim", 4}, {"v_head_dim", 8}, {"index_n_heads", 16}, {"index_head_dim", 8},
            {"index_topk", 40}, {"n_routed_experts", 8}, {"num_experts_per_tok", 2}, {"n_group", 4},
            {"topk_group", 2}, {"moe_intermediate_size", 16}, {"n_shared_experts", 1}, {"intermediate_size", 64},
            {"first_k_dense_replace", 1}, {"routed_scaling_factor", 2.5}, {"max_position_embeddings", 4096},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 32},
                              {"mscale", 1.0}, {"mscale_all_dim", 1.0}}}};
  json c = {{"vocab_size", 97}, {"hidden_size", 48}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"head_dim", 16}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096},
            {"intermediate_size", 64}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0}};
  if (family == "qwen3_5_moe" || family == "qwen3_next") {
    c["layer_types"] = {"linear_attention", "full_attention", "linear_attention", "full_attention"};
    c["linear_num_key_heads"] = 2;
    c["linear_num_value_heads"] = 4;
    c["linear_key_head_dim"] = 8;
    c["linear_value_head_dim"] = 12;
    c["linear_conv_kernel_dim"] = 4;
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}};
    c["shared_expert_intermediate_size"] = 24;
  }
  if (family != "qwen3" && family != "llama") {
    c["num_experts"] = 8;
    c["num_experts_per_tok"] = 2;
    c["moe_intermediate_size"] = 16;
    c["norm_topk_prob"] = true;
  }
  if (family == "qwen3_5_moe") return {{"model_type", family}, {"text_config", c}};
  c["model_type"] = family;
  return c;
}

std::string write_model_dir(const std::string& family) {
  fs::path dir = fs::temp_directory_path() / ("moefold_tiny_" + family + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << tiny_config(family).dump(2);
  return dir.string();
}

std::vector<int32_t> prompt(int n, int seed) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 31 + seed * 7 + 3) % 97;
  return p;
}

class ModelInvariants : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelInvariants, ChunkedPrefillThenDecodeEqualsWholePrefill) {
  auto model = load_model(write_model_dir(GetParam()), LoadFormat::Dummy, 1);
  const int T = 130;
  auto ids = prompt(T, 1);
  ModelRunner whole_runner(*model, {32, 16, 1});
  int32_t s = whole_runner.add_sequence(ids);
  auto whole = whole_runner.step({{s, T, true}})[0];
  const int64_t V = model->config().vocab_size;
  double maxref = 0;
  for (float v : whole) maxref = std::max(maxref, double(std::fabs(v)));
  for (int split : {1, 63, 64, 65}) {
    ModelRunner r(*model, {32, 16, 1});
    int32_t q = r.add_sequence(ids);
    std::vector<float> got = r.step({{q, split, true}})[0];
    // The rest: one more prefill chunk of 5 tokens, then decode token by token.
    int pos = split;
    if (pos + 5 <= T) {
      auto part = r.step({{q, 5, true}})[0];
      got.insert(got.end(), part.begin(), part.end());
      pos += 5;
    }
    for (; pos < T; ++pos) {
      auto part = r.step({{q, 1, true}})[0];
      got.insert(got.end(), part.begin(), part.end());
    }
    ASSERT_EQ(got.size(), size_t(T * V));
    double maxdiff = 0;
    for (size_t i = 0; i < got.size(); ++i) maxdiff = std::max(maxdiff, double(std::fabs(got[i] - whole[i])));
    EXPECT_LE(maxdiff, 1e-3 * maxref) << GetParam() << " split " << split;
  }
}

TEST_P(ModelInvariants, BatchedMixedPrefillAndDecodeEqualsAlone) {
  auto model = load_model(write_model_dir(GetParam()), LoadFormat::Dummy, 2);
  const std::vector<int> lens = {1, 17, 64, 5};
  const int gen = 6;
  auto argmax = [](const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); };
  // Alone: greedy per sequence.
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < lens.size(); ++i) {
    ModelRunner r(*model, {64, 16, 1});
    int32_t s = r.add_sequence(prompt(lens[i], int(i)));
    std::vector<int32_t> out;
    auto l = r.step({{s, lens[i], false}})[0];
    for (int g = 0; g < gen; ++g) {
      out.push_back(argmax(l));
      r.append_token(s, out.back());
      l = r.step({{s, 1, false}})[0];
    }
    alone.push_back(out);
  }
  // Together: sequences arrive one step apart, so prefill chunks and decode rows share steps.
  ModelRunner r(*model, {64, 16, 4});
  std::vector<int32_t> ids(lens.size(), -1);
  std::vector<std::vector<int32_t>> together(lens.size());
  for (int step = 0; step < int(lens.size()) + gen + 1; ++step) {
    std::vector<ModelRunner::Work> work;
    std::vector<size_t> who;
    for (size_t i = 0; i < lens.size(); ++i) {
      if (int(i) == step) {
        ids[i] = r.add_sequence(prompt(lens[i], int(i)));
        work.push_back({ids[i], lens[i], false});
        who.push_back(i);
      } else if (ids[i] >= 0 && together[i].size() < size_t(gen)) {
        work.push_back({ids[i], 1, false});
        who.push_back(i);
      }
    }
    if (work.empty()) continue;
    auto out = r.step(work);
    for (size_t w = 0; w < work.size(); ++w) {
      size_t i = who[w];
      if (together[i].size() < size_t(gen)) {
        together[i].push_back(argmax(out[w]));
        r.append_token(ids[i], together[i].back());
      }
    }
  }
  for (size_t i = 0; i < lens.size(); ++i) EXPECT_EQ(together[i], alone[i]) << GetParam() << " seq " << i;
}

TEST_P(ModelInvariants, DummyWeightsGiveFiniteVariedLogits) {
  auto model = load_model(write_model_dir(GetParam()), LoadFormat::Dummy, 3);
  ModelRunner r(*model, {32, 16, 1});
  int32_t s = r.add_sequence(prompt(40, 5));
  auto l = r.step({{s, 40, true}})[0];
  double mean = 0, var = 0;
  for (float v : l) {
    ASSERT_TRUE(std::isfinite(v));
    mean += v;
  }
  mean /= double(l.size());
  for (float v : l) var += (v - mean) * (v - mean);
  EXPECT_GT(std::sqrt(var / double(l.size())), 0.1);
}

/// Logits of every row of a 21-token prompt prefilled by a fresh runner with `rc` set.
std::vector<float> prefill_logits_with_routing(const Model& model, RoutingControl rc) {
  ModelRunner r(model, {32, 16, 1});
  r.executor().set_routing(rc);
  int32_t s = r.add_sequence(prompt(21, 2));
  return r.step({{s, 21, true}})[0];
}

// Routing capture and replay: replaying the experts a forward chose gives bit-identical logits, the
// capture holds one [rows x top_k] list per MoE layer, and a malformed replay is rejected.
TEST_P(ModelInvariants, RoutingReplayOfCapturedExpertsIsExact) {
  auto model = load_model(write_model_dir(GetParam()), LoadFormat::Dummy, 3);
  const ModelConfig& c = model->config();
  const int64_t moe_layers = std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true);
  auto run = [&](RoutingControl rc) { return prefill_logits_with_routing(*model, rc); };
  RoutedExperts captured;
  auto plain = run({nullptr, &captured});
  ASSERT_EQ(captured.layers.size(), size_t(moe_layers));
  for (const auto& l : captured.layers) {
    ASSERT_EQ(l.size(), size_t(21 * c.num_experts_per_tok));
    for (int32_t e : l) EXPECT_TRUE(e >= 0 && e < c.num_experts);
  }
  EXPECT_EQ(run({&captured, nullptr}), plain);
  if (moe_layers == 0) return;
  // Replaying other experts changes the output; a replay of the wrong size is an error.
  RoutedExperts other = captured;
  for (auto& l : other.layers)
    for (auto& e : l) e = int32_t((e + 1) % c.num_experts);
  EXPECT_GT(test::rel_err(run({&other, nullptr}), plain), 1e-3);
  other.layers.back().pop_back();
  EXPECT_THROW(run({&other, nullptr}), Error);
}

// Replay and capture may name the same object (replay a routing and record what was used): the
// replayed experts are read before the capture writes, so the forward equals a plain replay.
TEST_P(ModelInvariants, RoutingReplayAndCaptureIntoTheSameObject) {
  auto model = load_model(write_model_dir(GetParam()), LoadFormat::Dummy, 3);
  auto run = [&](RoutingControl rc) { return prefill_logits_with_routing(*model, rc); };
  RoutedExperts captured;
  const auto plain = run({nullptr, &captured});
  RoutedExperts both = captured;
  EXPECT_EQ(run({&both, &both}), plain);
  EXPECT_EQ(both.layers, captured.layers);
  EXPECT_EQ(both.top_k, captured.top_k);
}

// A replayed expert id outside [0, E) is rejected before the forward changes anything: the same
// runner then computes the step as if the failed one had never run (DeltaNet states included).
TEST_P(ModelInvariants, BadReplayedExpertIdFailsBeforeAnyStateChanges) {
  auto model = load_model(write_model_dir(GetParam()), LoadFormat::Dummy, 3);
  const ModelConfig& c = model->config();
  const int64_t moe_layers = std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true);
  if (moe_layers == 0) GTEST_SKIP() << "no MoE layer";
  const int32_t T = 21;
  RoutedExperts bad;
  bad.top_k = int32_t(c.num_experts_per_tok);
  bad.layers.assign(size_t(moe_layers), std::vector<int32_t>(size_t(T * c.num_experts_per_tok)));
  for (auto& l : bad.layers)
    for (size_t j = 0; j < l.size(); ++j) l[j] = int32_t(j % size_t(c.num_experts_per_tok));
  bad.layers.back().back() = int32_t(c.num_experts);  // only the last MoE layer is wrong
  ModelRunner r(*model, {32, 16, 1});
  int32_t s = r.add_sequence(prompt(T, 2));
  r.executor().set_routing({&bad, nullptr});
  EXPECT_THROW(r.step({{s, T, true}}), Error);
  r.executor().set_routing({});
  const auto retried = r.step({{s, T, true}})[0];
  ModelRunner fresh(*model, {32, 16, 1});
  int32_t f = fresh.add_sequence(prompt(T, 2));
  EXPECT_EQ(retried, fresh.step({{f, T, true}})[0]);
}

INSTANTIATE_TEST_SUITE_P(Families, ModelInvariants,
                         ::testing::Values("qwen3_5_moe", "qwen3_next", "qwen3_moe", "qwen3", "llama", "deepseek_v32"));

TEST(ModelRunner, OutOfPagesFailsCleanlyAndLeavesStateUnchanged) {
  auto model = load_model(write_model_dir("qwen3"), LoadFormat::Dummy, 1);
  ModelRunner r(*model, {2, 16, 2});
  int32_t s = r.add_sequence(prompt(40, 1));
  EXPECT_THROW(r.step({{s, 40, false}}), Error);
  EXPECT_EQ(r.free_blocks(), 2);
  EXPECT_EQ(r.sequence(s).num_computed, 0);
  EXPECT_NO_THROW(r.step({{s, 32, false}}));
  r.release(s);
  EXPECT_EQ(r.free_blocks(), 2);
  EXPECT_EQ(r.free_slots(), 2);
  EXPECT_THROW(r.add_sequence({}), Error);
}

}  // namespace
