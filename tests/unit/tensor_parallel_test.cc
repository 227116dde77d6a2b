// Tensor and expert parallelism on the CPU backend (parallel/cpu_parallel_executor.h): every fixture
// family loaded once and run through the executor at TP 1 (the reference), TP 2 and 4, EP 2 and 4
// (experts sharded over the tensor-parallel ranks, both dispatch modes) and TP 4 x EP 2 (two ranks
// split each expert). Greedy tokens must equal TP 1's and every prompt position's logits must agree
// within fp32 tolerance: not bitwise, because a row-parallel projection sums the ranks' partial dot
// products (split at the shard boundary) where TP 1 sums one dot product, which rounds differently.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/fp8_block.h"
#include "models/load_model.h"
#include "parallel/cpu_parallel_executor.h"
#include "parallel/shard_plan.h"
#include "parallel/shard_weights.h"
#include "runtime/model_runner.h"
#include "fixture_util.h"

namespace moefold {
namespace {

constexpr int32_t kBlocks = 24, kBlockSize = 16, kSeqs = 2;

/// The fixture's model, loaded once per binary.
const Model& fixture_model(const std::string& fam, Quantization q = Quantization::None) {
  static std::map<std::pair<std::string, int>, std::unique_ptr<Model>> cache;
  auto& m = cache[{fam, int(q)}];
  if (!m) m = load_model((test::kFixtures / fam).string(), LoadFormat::Safetensors, 0, q);
  return *m;
}

struct Layout {
  std::string name;
  ParallelConfig p;
};

std::vector<Layout> layouts(bool moe) {
  std::vector<Layout> out = {{"tp2", {2, false, 0}}, {"tp4", {4, false, 0}}};
  if (moe) {
    out.push_back({"tp2_ep2", {2, true, 0}});
    out.push_back({"tp4_ep4", {4, true, 0}});
    out.push_back({"tp4_ep4_allgather", {4, true, 0, EpDispatch::AllGather}});
    out.push_back({"tp4_ep4_alltoall", {4, true, 0, EpDispatch::AllToAll}});
    out.push_back({"tp4_ep2", {4, true, 2}});
  }
  return out;
}

bool has_moe(const ModelConfig& c) {
  for (bool b : c.layer_is_moe)
    if (b) return true;
  return false;
}

std::unique_ptr<ModelRunner> runner_for(const Model& m, const ParallelConfig* p) {
  RunnerOptions opt{kBlocks, kBlockSize, kSeqs};
  if (!p) return std::make_unique<ModelRunner>(m, opt);
  return std::make_unique<ModelRunner>(make_cpu_parallel_executor(m, *p, kBlocks, kBlockSize, kSeqs), opt);
}

/// Logits of every position of `prompt` in one prefill step: [T * V].
std::vector<float> prompt_logits(ModelRunner& r, const std::vector<int32_t>& prompt) {
  const int32_t s = r.add_sequence(prompt);
  auto rows = r.step({{s, int32_t(prompt.size()), true}});
  r.release(s);
  std::vector<float> out;
  for (auto& row : rows) out.insert(out.end(), row.begin(), row.end());
  return out;
}

const std::vector<std::vector<int32_t>> kPrompts = {{1, 7, 42, 99, 3, 120, 17, 5, 64, 11, 23, 88, 2, 9, 31, 77, 15},
                                                    {4, 8, 15, 16, 23, 42}};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!std::isfinite(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

/// Tolerance on |logit - reference logit|: fp32 rounding of sums split differently, about 1e-7
/// relative per operation over a few dozen layers of operations, with a margin: 2e-5 of the largest
/// logit (a few hundred ulps at that magnitude; the fixtures differ by up to 5e-5 at logits of ~6).
double tolerance(const std::vector<float>& ref) { return 2e-5 * std::max(1.0, max_abs(ref)); }

class TensorParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallel, GreedyTokensEqualAndLogitsWithinFp32ToleranceOfTp1) {
  const std::string fam = GetParam();
  const Model& m = fixture_model(fam);
  const int64_t V = m.config().vocab_size;
  auto ref_runner = runner_for(m, nullptr);
  const auto ref_logits = prompt_logits(*ref_runner, kPrompts[0]);
  const auto ref_tokens = test::greedy_together(*ref_runner, kPrompts, {0, 1}, 6, V);
  for (const Layout& l : layouts(has_moe(m.config()))) {
    SCOPED_TRACE(fam + " " + l.name);
    auto r = runner_for(m, &l.p);
    const auto logits = prompt_logits(*r, kPrompts[0]);
    const double d = max_diff(logits, ref_logits), tol = tolerance(ref_logits);
    EXPECT_LE(d, tol) << "max |logit difference| " << d << " vs tolerance " << tol;
    std::printf("%-18s %-18s max |logit - TP 1| %.3g (tolerance %.3g)\n", fam.c_str(), l.name.c_str(), d, tol);
    EXPECT_EQ(test::greedy_together(*r, kPrompts, {0, 1}, 6, V), ref_tokens);
  }
}

TEST_P(TensorParallel, RepeatedStepsAreBitwiseDeterministic) {
  const Model& m = fixture_model(GetParam());
  const ParallelConfig p{4, has_moe(m.config()), 0};
  auto r = runner_for(m, &p);
  const auto a = prompt_logits(*r, kPrompts[0]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(prompt_logits(*r, kPrompts[0]), a) << "run " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallel, ::testing::ValuesIn(test::fixture_families()));

// The GPU's expert kernels take intermediates that are multiples of 64; a shard narrower than that
// is padded with zero columns (pad_expert_columns). The padded model computes the same function: the
// original values stay where they were, the new columns are zeros, and the logits agree with the
// unpadded model's within fp32 tolerance (the GEMMs' K blocking may differ), greedy tokens equal.
TEST(TensorParallel, ZeroPaddedExpertColumnsKeepTheFunction) {
  const Model& m = fixture_model("qwen3_5_moe");  // experts of 64 columns, padded to 96 and 128
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.moe_intermediate_size;
  const RankShard whole = plan_shard(c, {1, false, 0}, 0);
  auto ref_runner = runner_for(m, nullptr);
  const auto ref_logits = prompt_logits(*ref_runner, kPrompts[0]);
  const auto ref_tokens = test::greedy_together(*ref_runner, kPrompts, {0, 1}, 6, V);
  for (int64_t multiple : {96, 128}) {
    SCOPED_TRACE(multiple);
    ModelConfig pc = c;
    ModelWeights w = shard_weights(c, m.weights(), whole);
    pad_expert_columns(pc, w, multiple);
    const int64_t Ip = pc.moe_intermediate_size;
    ASSERT_EQ(Ip, multiple);
    size_t l = 0;
    while (!c.layer_is_moe[l]) ++l;
    const MoeWeights &a = m.weights().layers[l].moe, &b = w.layers[l].moe;
    ASSERT_EQ(b.gate_up.numel, c.num_experts * 2 * Ip * H);
    ASSERT_EQ(b.down.numel, c.num_experts * H * Ip);
    size_t moved = 0, nonzero_pad = 0;
    for (int64_t e = 0; e < c.num_experts; ++e)
      for (int64_t row = 0; row < 2 * Ip; ++row)
        for (int64_t h = 0; h < H; ++h) {
          const float got = b.gate_up.host[size_t((e * 2 * Ip + row) * H + h)];
          const int64_t half = row / Ip, r = row % Ip;
          if (r >= I) nonzero_pad += got != 0.0f;
          else moved += got != a.gate_up.host[size_t((e * 2 * I + half * I + r) * H + h)];
        }
    for (int64_t e = 0; e < c.num_experts; ++e)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Ip; ++i) {
          const float got = b.down.host[size_t((e * H + h) * Ip + i)];
          if (i >= I) nonzero_pad += got != 0.0f;
          else moved += got != a.down.host[size_t((e * H + h) * I + i)];
        }
    EXPECT_EQ(moved, 0u);
    EXPECT_EQ(nonzero_pad, 0u);
    Model padded(pc, std::move(w));
    auto r = runner_for(padded, nullptr);
    const auto logits = prompt_logits(*r, kPrompts[0]);
    EXPECT_LE(max_diff(logits, ref_logits), tolerance(ref_logits));
    EXPECT_EQ(test::greedy_together(*r, kPrompts, {0, 1}, 6, V), ref_tokens);
  }
  ModelConfig same = c;
  ModelWeights w = shard_weights(c, m.weights(), whole);
  pad_expert_columns(same, w, 64);  // already a multiple: unchanged
  EXPECT_EQ(same.moe_intermediate_size, I);
  EXPECT_THROW(pad_expert_columns(same, w, 0), Error);
}

// A vocabulary that the ranks do not divide (the last shard is short and padded in the all-gather)
// and projections with biases (a row-parallel bias is added once, by rank 0): the qwen3 and llama
// fixture configs changed so, with dummy weights.
TEST(TensorParallel, UnevenVocabularyAndBiasesMatchTp1) {
  for (auto [fam, vocab] : std::vector<std::pair<std::string, int>>{{"qwen3", 383}, {"llama", 385}}) {
    SCOPED_TRACE(fam);
    const auto dir = std::filesystem::temp_directory_path() / ("moefold_tp_" + fam + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ifstream in(test::kFixtures / fam / "config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["vocab_size"] = vocab;
    cfg["attention_bias"] = true;
    if (fam == "llama") cfg["mlp_bias"] = true;
    std::ofstream(dir / "config.json") << cfg.dump();
    auto m = load_model(dir.string(), LoadFormat::Dummy, 3);
    auto ref = runner_for(*m, nullptr);
    const auto ref_logits = prompt_logits(*ref, kPrompts[1]);
    for (int N : {2, 4}) {
      const ParallelConfig p{N, false, 0};
      auto r = runner_for(*m, &p);
      const auto logits = prompt_logits(*r, kPrompts[1]);
      ASSERT_EQ(logits.size(), ref_logits.size());
      EXPECT_LE(max_diff(logits, ref_logits), tolerance(ref_logits)) << "TP " << N;
    }
    std::filesystem::remove_all(dir);
  }
}

// DeepSeek-V3.2 past index_topk (24 in the fixture): the replicated lightning indexer keeps the same
// keys on every rank while the MLA heads split.
TEST(TensorParallel, DeepseekV32BeyondTheIndexerTopkMatchesTp1) {
  const Model& m = fixture_model("deepseek_v32");
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % 128);
  auto ref = runner_for(m, nullptr);
  const auto ref_logits = prompt_logits(*ref, prompt);
  for (const ParallelConfig& p : {ParallelConfig{2, false, 0}, ParallelConfig{4, true, 0}}) {
    auto r = runner_for(m, &p);
    EXPECT_LE(max_diff(prompt_logits(*r, prompt), ref_logits), tolerance(ref_logits)) << "TP " << p.tensor_parallel_size;
  }
}

TEST(TensorParallelPlan, HeadsSplitOrReplicateWithTheirGroups) {
  const ModelConfig c = fixture_model("qwen3_next").config();  // 4 q / 2 kv heads, DeltaNet 2 key / 4 value
  for (int r = 0; r < 4; ++r) {
    const RankShard s = plan_shard(c, {4, false, 0}, r);
    EXPECT_EQ(s.q_heads.begin, r);
    EXPECT_EQ(s.q_heads.count, 1);
    EXPECT_EQ(s.kv_heads.begin, r / 2);  // replicated: 2 ranks per kv head
    EXPECT_EQ(s.kv_heads.count, 1);
    EXPECT_EQ(s.v_heads.begin, r);
    EXPECT_EQ(s.k_heads.begin, r / 2);
    EXPECT_EQ(s.vocab.begin, 96 * r);
    EXPECT_EQ(s.expert_cols.count, c.moe_intermediate_size / 4);
    const ModelConfig l = local_config(c, s);
    EXPECT_EQ(l.num_kv_heads, 1);  // the KV cache of a rank holds its heads only
    EXPECT_EQ(l.conv_dim(), 2 * c.linear_key_head_dim + c.linear_value_head_dim);
  }
  const RankShard s2 = plan_shard(c, {2, false, 0}, 1);
  EXPECT_EQ(s2.kv_heads.begin, 1);  // split: one kv head per rank
  EXPECT_EQ(s2.k_heads.begin, 1);
  const RankShard e = plan_shard(c, {4, true, 2}, 3);  // TP 4 x EP 2: experts 8..15, half of each
  EXPECT_EQ(e.ep_rank, 1);
  EXPECT_EQ(e.experts.begin, c.num_experts / 2);
  EXPECT_EQ(e.expert_cols.begin, c.moe_intermediate_size / 2);
}

void expect_error_containing(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(TensorParallelPlan, SizesThatDoNotDivideFailWithAClearError) {
  const Model& m = fixture_model("qwen3_5_moe");
  expect_error_containing([&] { make_cpu_parallel_executor(m, {8, false, 0}, 8, 16, 1); },
                          "tensor parallel size 8 does not divide the 4 attention heads");
  expect_error_containing([&] { make_cpu_parallel_executor(m, {3, false, 0}, 8, 16, 1); },
                          "tensor parallel size 3 does not divide");
  expect_error_containing([&] { plan_shard(m.config(), {4, true, 3}, 0); }, "must divide --tensor-parallel-size 4");
  expect_error_containing([&] { plan_shard(m.config(), {2, false, 2}, 0); }, "needs --enable-expert-parallel");
  expect_error_containing([&] { plan_shard(m.config(), {0, false, 0}, 0); }, "--tensor-parallel-size 0");
}

TEST(ExpertParallel, EachRankComputesOnlyItsExpertsPairs) {
  const Model& m = fixture_model("qwen3_moe");  // no shared expert, every layer MoE
  const ModelConfig& c = m.config();
  int64_t moe_layers = 0;
  for (bool b : c.layer_is_moe) moe_layers += b;
  for (EpDispatch d : {EpDispatch::AllToAll, EpDispatch::AllGather}) {
    const ParallelConfig p{4, true, 0, d};
    auto e = make_cpu_parallel_executor(m, p, kBlocks, kBlockSize, kSeqs);
    ModelRunner r(std::move(e), {kBlocks, kBlockSize, kSeqs});
    prompt_logits(r, kPrompts[0]);
    const auto load = expert_load_per_rank(r.executor());
    ASSERT_EQ(load.size(), 4u);
    int64_t total = 0;
    for (int64_t n : load) total += n;
    EXPECT_EQ(total, int64_t(kPrompts[0].size()) * c.num_experts_per_tok * moe_layers);
  }
  EXPECT_TRUE(expert_load_per_rank(ModelRunner(m, {kBlocks, kBlockSize, kSeqs}).executor()).empty());
}

// FP8: the qwen3_5_moe fixture quantised at load (128 x 128 blocks); its experts are 64 wide and its
// o_proj / out_proj 128 wide, so TP 2 and 4 cut shards of 64 and 32 columns inside one scale block.
TEST(TensorParallelFp8, ShardsInsideAScaleBlockTakeItsScale) {
  const Model& m = fixture_model("qwen3_5_moe", Quantization::Fp8);
  const ModelConfig& c = m.config();
  for (int N : {2, 4}) {
    for (int r = 0; r < N; ++r) {
      const RankShard s = plan_shard(c, {N, false, 0}, r);
      const ModelWeights w = shard_weights(c, m.weights(), s);
      for (size_t l = 0; l < w.layers.size(); ++l) {
        const Param& down = w.layers[l].moe.down;  // [E, H, 64 / N]: columns cut inside block 0
        ASSERT_TRUE(down.fp8) << "layer " << l;
        EXPECT_EQ(fp8_dequantize(*down.fp8), down.host);
        const Param& src = m.weights().layers[l].moe.down;
        EXPECT_EQ(down.fp8->scale[0], src.fp8->scale[0]);  // the shared block's scale
        const Linear& o = c.layer_types[l] == LayerType::FullAttention ? w.layers[l].attn.o_proj : w.layers[l].gdn.out_proj;
        ASSERT_TRUE(o.w.fp8);
        EXPECT_EQ(fp8_dequantize(*o.w.fp8), o.w.host);
      }
    }
  }
  auto ref = runner_for(m, nullptr);
  const auto ref_logits = prompt_logits(*ref, kPrompts[0]);
  for (int N : {2, 4}) {
    const ParallelConfig p{N, false, 0};
    auto r = runner_for(m, &p);
    EXPECT_LE(max_diff(prompt_logits(*r, kPrompts[0]), ref_logits), tolerance(ref_logits)) << "TP " << N;
  }
}

// The FP8 checkpoints of tests/fixtures/fp8 (scripts/make_fp8_fixtures.py, run by scripts/test.sh
// before CTest): per-expert and fused experts, bf16 and f32 scales, every shard cutting a scale block.
TEST(TensorParallelFp8, Fp8CheckpointsGiveTp1TokensAtTp2Tp4AndEp4) {
  const auto dir = test::kFixtures / "fp8";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " is missing: run scripts/make_fp8_fixtures.py";
  for (const char* name : {"qwen3_5_moe_per_expert_bf16", "qwen3_moe_fused_bf16", "qwen3_moe_per_expert_f32"}) {
    SCOPED_TRACE(name);
    const Model& m = fixture_model(std::string("fp8/") + name);
    ASSERT_TRUE(m.weights().layers[0].moe.down.fp8);
    const int64_t V = m.config().vocab_size;
    auto ref = runner_for(m, nullptr);
    const auto ref_logits = prompt_logits(*ref, kPrompts[0]);
    const auto ref_tokens = test::greedy_together(*ref, kPrompts, {0, 1}, 4, V);
    for (const ParallelConfig& p : {ParallelConfig{2, false, 0}, ParallelConfig{4, false, 0}, ParallelConfig{4, true, 0}}) {
      auto r = runner_for(m, &p);
      EXPECT_LE(max_diff(prompt_logits(*r, kPrompts[0]), ref_logits), tolerance(ref_logits))
          << "TP " << p.tensor_parallel_size << " EP " << p.ep_size();
      EXPECT_EQ(test::greedy_together(*r, kPrompts, {0, 1}, 4, V), ref_tokens);
    }
  }
}

TEST(Fp8Slice, ColumnSlicesInsideOneBlockEqualTheSlicedDequantisation) {
  const int64_t rows = 5, cols = 300;
  std::vector<float> w(size_t(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * float(i)) * (1.0f + float(i % 128) / 16.0f);
  const Fp8Weight q = fp8_quantize(w.data(), 1, rows, cols);
  const std::vector<float> deq = fp8_dequantize(q);
  for (auto [c0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 64}, {64, 64}, {32, 32}, {96, 32}, {128, 128},
                                                                {160, 32}, {256, 44}, {128, 172}, {0, 300}}) {
    SCOPED_TRACE(std::to_string(c0) + "+" + std::to_string(n));
    ASSERT_TRUE(fp8_cols_sliceable(cols, c0, n));
    const Fp8Weight s = fp8_slice_cols(q, c0, n);
    std::vector<float> ref;
    for (int64_t r = 0; r < rows; ++r) ref.insert(ref.end(), deq.begin() + r * cols + c0, deq.begin() + r * cols + c0 + n);
    EXPECT_EQ(fp8_dequantize(s), ref);
  }
  EXPECT_FALSE(fp8_cols_sliceable(cols, 64, 128));  // would straddle blocks 0 and 1
  EXPECT_THROW(fp8_slice_cols(q, 64, 128), Error);
  const Fp8Weight rs = fp8_slice_rows(q, 2, 3);
  EXPECT_EQ(fp8_dequantize(rs), std::vector<float>(deq.begin() + 2 * cols, deq.end()));
  EXPECT_THROW(fp8_slice_rows(q, 4, 2), Error);
}

}  // namespace
}  // namespace moefold
