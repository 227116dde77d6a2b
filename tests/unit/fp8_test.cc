// Block-scaled FP8 weights on the CPU: the format (core/fp8_block.h), quantisation at load
// (--quantization fp8), and the FP8 checkpoints of tests/fixtures/fp8 (scripts/make_fp8_fixtures.py,
// released layout: per-expert and fused experts, bf16 and fp32 scales) against an independent
// dequantisation written as a plain F32 checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_block.h"
#include "io/safetensors.h"
#include "models/fp8_probe.h"
#include "models/load_model.h"
#include "ops/cpu/fp8_ideal.h"
#include "models/weight_loader.h"
#include "runtime/model_runner.h"
#include "fixture_util.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kFp8 = test::kFixtures / "fp8";
const std::vector<std::pair<std::string, std::string>> kFp8Fixtures = {
    {"qwen3_5_moe_per_expert_bf16", "qwen3_5_moe"},
    {"qwen3_5_moe_fused_f32", "qwen3_5_moe"},
    {"qwen3_moe_per_expert_f32", "qwen3_moe"},
    {"qwen3_moe_fused_bf16", "qwen3_moe"}};
const std::vector<int32_t> kPrompt = {1, 7, 42, 99, 3, 250, 17, 5, 64, 128, 11};

/// The FP8 fixtures are generated (scripts/test.sh runs scripts/make_fp8_fixtures.py before CTest).
#define REQUIRE_FP8_FIXTURES()                                                                              \
  do {                                                                                                      \
    if (!fs::is_directory(kFp8)) GTEST_SKIP() << kFp8 << " is missing: run python3 scripts/make_fp8_fixtures.py"; \
  } while (0)

std::vector<float> prompt_logits(const Model& m) {
  ModelRunner r(m, {8, 16, 1});
  int32_t s = r.add_sequence(kPrompt);
  return r.step({{s, int32_t(kPrompt.size()), true}})[0];
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

/// Writes `src` dequantised by the definition (W8[i, j] * scale_inv[i / 128, j / 128] per matrix, in
/// fp64 then rounded to fp32) as an F32 checkpoint without quantization_config: the reference the
/// loader's own dequantisation is compared with.
fs::path write_dequantised(const fs::path& src) {
  const fs::path out = fs::temp_directory_path() / ("moefold_fp8_deq_" + src.filename().string() + "_" +
                                                    std::to_string(::getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  json cfg = json::parse(std::ifstream(src / "config.json"));
  cfg.erase("quantization_config");
  std::ofstream(out / "config.json") << cfg.dump();
  Checkpoint ck(src.string());
  std::vector<std::vector<float>> store;
  std::vector<TensorView> views;
  for (const std::string& n : ck.names()) {
    if (n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0) continue;
    const TensorView& t = ck.get(n);
    std::vector<float> v = t.to_f32();
    if (t.dtype == DType::F8_E4M3) {
      const std::vector<float> s = ck.get(n + "_scale_inv").to_f32();
      const int64_t R = t.shape[t.shape.size() - 2], C = t.shape.back();
      const int64_t bc = (C + 127) / 128, br = (R + 127) / 128;
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t m = i / (R * C), r = (i / C) % R, c = i % C;
        v[size_t(i)] = float(double(v[size_t(i)]) * double(s[size_t((m * br + r / 128) * bc + c / 128)]));
      }
    }
    store.push_back(std::move(v));
    views.push_back({n, DType::F32, t.shape, store.back().data(), store.back().size() * 4});
  }
  write_safetensors((out / "model.safetensors").string(), views);
  return out;
}

TEST(Fp8Block, QuantiseFollowsTheBlockDefinitionWithPartialBlocks) {
  const int64_t mats = 2, R = 200, C = 300;  // blocks 2 x 3 per matrix, the last ones partial
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  std::vector<float> w(size_t(mats * R * C));
  for (auto& x : w) x = nd(g) * 0.05f;
  w[size_t(5 * C + 260)] = 3.0f;  // an outlier in block (0, 2) of matrix 0
  const Fp8Weight q = fp8_quantize(w.data(), mats, R, C);
  ASSERT_EQ(q.rows, mats * R);
  ASSERT_EQ(q.col_blocks(), 3);
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t br = 0; br < 2; ++br)
      for (int64_t bc = 0; bc < 3; ++bc) {
        float amax = 0;
        for (int64_t r = br * 128; r < std::min<int64_t>(R, br * 128 + 128); ++r)
          for (int64_t c = bc * 128; c < std::min<int64_t>(C, bc * 128 + 128); ++c)
            amax = std::max(amax, std::fabs(w[size_t((m * R + r) * C + c)]));
        for (int64_t r = br * 128; r < std::min<int64_t>(R, br * 128 + 128); ++r)
          ASSERT_EQ(q.scale[size_t((m * R + r) * 3 + bc)], amax / 448.0f) << m << " " << br << " " << bc;
      }
  EXPECT_EQ(q.value(5, 260), 3.0f);  // the block's max maps to 448 exactly
  const std::vector<float> d = fp8_dequantize(q);
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float x = w[size_t(r * C + c)], s = q.scale[size_t(r * 3 + c / 128)];
      // Round to nearest e4m3 of x / s: within half a step (3 mantissa bits; subnormal step 2^-9).
      const float t = std::fabs(x / s), step = t >= 0.015625f ? std::ldexp(1.0f, std::ilogb(t) - 3) : 0x1p-9f;
      ASSERT_LE(std::fabs(d[size_t(r * C + c)] - x), 0.5f * step * s * 1.0001f) << r << " " << c;
      ASSERT_EQ(q.q[size_t(r * C + c)], f32_to_f8e4m3(x / s));
    }
}

TEST(Fp8Block, FromBlocksExpandsEachBlockToItsRows) {
  const int64_t R = 130, C = 260;  // 2 x 3 blocks
  std::vector<uint8_t> codes(size_t(R * C));
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(0x30 + i % 11);
  std::vector<float> bs = {1, 2, 3, 4, 5, 6};
  const Fp8Weight w = fp8_from_blocks(codes.data(), bs.data(), 1, R, C);
  EXPECT_EQ(w.value(0, 0), f8e4m3_to_f32(codes[0]) * 1.0f);
  EXPECT_EQ(w.value(129, 259), f8e4m3_to_f32(codes[size_t(129 * C + 259)]) * 6.0f);
  EXPECT_EQ(w.value(127, 128), f8e4m3_to_f32(codes[size_t(127 * C + 128)]) * 2.0f);
  EXPECT_EQ(w.value(128, 127), f8e4m3_to_f32(codes[size_t(128 * C + 127)]) * 4.0f);
  Fp8Weight a;
  fp8_append_rows(a, w);
  fp8_append_rows(a, w);
  EXPECT_EQ(a.rows, 2 * R);
  EXPECT_EQ(a.value(R + 129, 259), w.value(129, 259));
  Fp8Weight narrow = fp8_from_blocks(codes.data(), bs.data(), 1, 1, 100);
  EXPECT_THROW(fp8_append_rows(a, narrow), Error);
}

TEST(Fp8Block, NonFiniteWeightIsRefused) {
  std::vector<float> w(256, 1.0f);
  w[7] = NAN;
  EXPECT_THROW(fp8_quantize(w.data(), 1, 2, 128), Error);
}

class Fp8Fixture : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

// The loader's dequantisation equals the definition exactly (same fp32 products), so the logits of the
// FP8 checkpoint equal those of its dequantised F32 copy bit for bit; both are near the bf16 original.
TEST_P(Fp8Fixture, LoadsAndEqualsItsDequantisedCheckpoint) {
  REQUIRE_FP8_FIXTURES();
  const fs::path dir = kFp8 / GetParam().first;
  ASSERT_EQ(ModelConfig::from_dir(dir.string()).quant_method, "fp8");
  auto fp8 = load_model(dir.string(), LoadFormat::Safetensors);
  const fs::path deq = write_dequantised(dir);
  auto ref = load_model(deq.string(), LoadFormat::Safetensors);
  auto bf16 = load_model((test::kFixtures / GetParam().second).string(), LoadFormat::Safetensors);
  const auto a = prompt_logits(*fp8), b = prompt_logits(*ref), c = prompt_logits(*bf16);
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, e2 = 0, c2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i]));
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    e2 += double(a[i] - c[i]) * double(a[i] - c[i]);
    c2 += double(c[i]) * double(c[i]);
  }
  EXPECT_LE(diff, 1e-6 * max_abs(b)) << GetParam().first;
  // Random tiny weights lose ~2.6% (rms) to e4m3; through 4-6 layers with top-k routing the logits
  // move by about 10-30% (rms): a sanity bound that a wrong scale or block index fails by far.
  const double rel = std::sqrt(e2 / c2);
  std::printf("%s: FP8 vs bf16 logits rel err %.4f\n", GetParam().first.c_str(), rel);
  EXPECT_GT(rel, 0.0) << "the FP8 weights should differ from bf16";
  EXPECT_LE(rel, 0.5) << GetParam().first << ": FP8 logits far from the bf16 model's";
  fs::remove_all(deq);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8Fixture, ::testing::ValuesIn(kFp8Fixtures),
                         [](const auto& info) { return info.param.first; });

// Which tensors arrive FP8: the released set (experts, attention / DeltaNet / shared-expert projections),
// not embeddings, lm_head, norms, the router, shared_expert_gate or in_proj_a / in_proj_b.
TEST(Fp8Loader, ReleasedModulesStayFp8OrBf16) {
  REQUIRE_FP8_FIXTURES();
  const std::string dir = (kFp8 / "qwen3_5_moe_per_expert_bf16").string();
  const ModelConfig cfg = ModelConfig::from_dir(dir);
  auto src = checkpoint_source(dir);
  ModelWeights w = load_weights(cfg, *src);
  EXPECT_FALSE(w.embed.fp8);
  EXPECT_FALSE(w.lm_head.fp8);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& L = w.layers[i];
    EXPECT_TRUE(L.moe.gate_up.fp8 && L.moe.down.fp8) << "layer " << i;
    EXPECT_EQ(L.moe.gate_up.fp8->rows, cfg.num_experts * 2 * cfg.moe_intermediate_size);
    EXPECT_TRUE(L.moe.shared_gate_up.w.fp8 && L.moe.shared_down.w.fp8);
    EXPECT_FALSE(L.moe.router.w.fp8);
    EXPECT_FALSE(L.moe.shared_expert_gate.w.fp8);
    if (cfg.layer_types[i] == LayerType::LinearAttention) {
      EXPECT_TRUE(L.gdn.in_proj_qkv.w.fp8 && L.gdn.in_proj_z.w.fp8 && L.gdn.out_proj.w.fp8);
      EXPECT_FALSE(L.gdn.in_proj_a.w.fp8 || L.gdn.in_proj_b.w.fp8);
    } else {
      EXPECT_TRUE(L.attn.q_proj.w.fp8 && L.attn.k_proj.w.fp8 && L.attn.v_proj.w.fp8 && L.attn.o_proj.w.fp8);
    }
  }
}

// --quantization fp8 on the bf16 fixture gives exactly the script's fused fp32-scale FP8 checkpoint
// (same blocks, scale = max|block| / 448 in fp32, round to nearest even), so both logits agree bitwise.
TEST(Fp8Loader, QuantizationFlagEqualsTheScriptsCheckpoint) {
  REQUIRE_FP8_FIXTURES();
  auto quantised = load_model((test::kFixtures / "qwen3_5_moe").string(), LoadFormat::Safetensors, 0,
                              Quantization::Fp8);
  auto script = load_model((kFp8 / "qwen3_5_moe_fused_f32").string(), LoadFormat::Safetensors);
  EXPECT_EQ(prompt_logits(*quantised), prompt_logits(*script));
}

TEST(Fp8Loader, QuantizationFlagQuantisesDummyWeights) {
  const std::string dir = (test::kFixtures / "qwen3_5_moe").string();
  const ModelConfig cfg = ModelConfig::from_dir(dir);
  // Materialised (the CPU backend): quantised on the host.
  auto src = make_weight_source(dir, cfg, LoadFormat::Dummy, 5, Quantization::Fp8, false);
  ModelWeights w = load_weights(cfg, *src);
  ASSERT_TRUE(w.layers[0].moe.gate_up.fp8);
  EXPECT_FALSE(w.layers[0].moe.gate_up.dummy);
  EXPECT_EQ(w.layers[0].moe.gate_up.host, fp8_dequantize(*w.layers[0].moe.gate_up.fp8));
  EXPECT_FALSE(w.layers[0].moe.router.w.fp8);
  EXPECT_THROW(parse_quantization("int4"), Error);
  // Deferred (an executor generating dummy weights on its device): the recipe stays, marked for FP8 with
  // its matrix shape ([E, 2I, H] experts: 2I x H matrices), for the device to quantise (same bits:
  // tests/cuda/fp8_kernels_test.cc, Fp8Quantize.DummyOnTheDeviceEqualsTheHost).
  auto dsrc = make_weight_source(dir, cfg, LoadFormat::Dummy, 5, Quantization::Fp8, true);
  ModelWeights d = load_weights(cfg, *dsrc);
  const Param& gu = d.layers[0].moe.gate_up;
  ASSERT_TRUE(gu.dummy);
  EXPECT_FALSE(gu.fp8);
  EXPECT_EQ(gu.fp8_rows, 2 * cfg.moe_intermediate_size);
  EXPECT_EQ(gu.fp8_cols, cfg.hidden_size);
  EXPECT_EQ(d.layers[0].moe.router.w.fp8_cols, 0);  // not quantised
}

// --fp8-lm-head: an untied lm_head arrives FP8 (the other weights as they were); a tied one becomes an
// FP8 copy of the embedding, which itself stays unquantised.
TEST(Fp8Loader, Fp8LmHeadUntiedAndTied) {
  {
    const std::string dir = (test::kFixtures / "qwen3_5_moe").string();
    const ModelConfig cfg = ModelConfig::from_dir(dir);
    auto src = make_weight_source(dir, cfg, LoadFormat::Safetensors, 0, Quantization::None, false, true);
    ModelWeights w = load_weights(cfg, *src);
    ASSERT_TRUE(w.lm_head.fp8);
    EXPECT_EQ(w.lm_head.host, fp8_dequantize(*w.lm_head.fp8));
    EXPECT_FALSE(w.embed.fp8);
    EXPECT_FALSE(w.layers[0].moe.gate_up.fp8);
    auto plain = checkpoint_source(dir);
    ModelWeights p = load_weights(cfg, *plain);
    EXPECT_EQ(w.lm_head.fp8->q, fp8_quantize(p.lm_head.data(), 1, cfg.vocab_size, cfg.hidden_size).q);
  }
  {
    const std::string dir = (test::kFixtures / "qwen3").string();
    const ModelConfig cfg = ModelConfig::from_dir(dir);
    ASSERT_TRUE(cfg.tie_word_embeddings);
    auto src = make_weight_source(dir, cfg, LoadFormat::Safetensors, 0, Quantization::None, false, true);
    ModelWeights w = load_weights(cfg, *src);
    ASSERT_TRUE(w.lm_head.fp8);
    EXPECT_FALSE(w.embed.fp8);
    const Fp8Weight want = fp8_quantize(w.embed.data(), 1, cfg.vocab_size, cfg.hidden_size);
    EXPECT_EQ(w.lm_head.fp8->q, want.q);
    EXPECT_EQ(w.lm_head.fp8->scale, want.scale);
    // The model runs with it: logits move by FP8 rounding, not more.
    auto fp8 = load_model(dir, LoadFormat::Safetensors, 0, Quantization::None, true);
    auto ref = load_model(dir, LoadFormat::Safetensors);
    const auto a = prompt_logits(*fp8), b = prompt_logits(*ref);
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    EXPECT_GT(num, 0.0);
    EXPECT_LT(std::sqrt(num / den), 0.1);
  }
}

// The drift command's attribution filter: only the tensors whose name holds the string are quantised.
TEST(Fp8Loader, OnlyFilterQuantisesTheNamedTensors) {
  const std::string dir = (test::kFixtures / "qwen3_5_moe").string();
  const ModelConfig cfg = ModelConfig::from_dir(dir);
  auto src = fp8_quantizing_source(checkpoint_source(dir), true, false, "layers.1.");
  ModelWeights w = load_weights(cfg, *src);
  for (size_t i = 0; i < w.layers.size(); ++i) EXPECT_EQ(bool(w.layers[i].moe.gate_up.fp8), i == 1) << i;
  EXPECT_TRUE(w.layers[1].attn.q_proj.w.fp8);
  EXPECT_FALSE(w.lm_head.fp8);
  // Comma-separated parts: any of them (a mixed-precision option: these tensors FP8, the rest not).
  auto src2 = fp8_quantizing_source(checkpoint_source(dir), true, false, "self_attn.q_proj.,mlp.experts.");
  ModelWeights w2 = load_weights(cfg, *src2);
  for (const LayerWeights& L : w2.layers) {
    EXPECT_TRUE(L.moe.gate_up.fp8 && L.moe.down.fp8);
    EXPECT_FALSE(L.moe.shared_gate_up.w.fp8);
    EXPECT_FALSE(L.attn.k_proj.w.fp8 || L.attn.o_proj.w.fp8);
  }
  EXPECT_TRUE(w2.layers[1].attn.q_proj.w.fp8);
}

json fp8_config(json q) {
  json c = json::parse(std::ifstream(kFp8 / "qwen3_5_moe_per_expert_bf16" / "config.json"));
  c["quantization_config"] = std::move(q);
  return c;
}

TEST(Fp8Config, UnsupportedQuantizationConfigsFailWithTheirName) {
  REQUIRE_FP8_FIXTURES();
  auto msg = [](const json& c) {
    try {
      ModelConfig::from_json(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(fp8_config({{"quant_method", "awq"}})).find("'awq' is not supported"), std::string::npos);
  EXPECT_NE(msg(fp8_config({{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}})).find("[64,64]"),
            std::string::npos);
  EXPECT_NE(msg(fp8_config({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"activation_scheme", "static"}}))
                .find("'static'"),
            std::string::npos);
  EXPECT_EQ(ModelConfig::from_json(fp8_config({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}})).quant_method,
            "fp8");
}

// An F8_E4M3 tensor without its scales fails naming both.
TEST(Fp8Loader, MissingScaleInvFailsNamingIt) {
  REQUIRE_FP8_FIXTURES();
  const fs::path src = kFp8 / "qwen3_moe_per_expert_f32";
  const fs::path out = fs::temp_directory_path() / ("moefold_fp8_noscale_" + std::to_string(::getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  fs::copy_file(src / "config.json", out / "config.json");
  Checkpoint ck(src.string());
  std::vector<TensorView> views;
  const std::string victim = "model.layers.0.self_attn.o_proj.weight_scale_inv";
  for (const std::string& n : ck.names())
    if (n != victim) views.push_back(ck.get(n));
  write_safetensors((out / "model.safetensors").string(), views);
  try {
    load_model(out.string(), LoadFormat::Safetensors);
    ADD_FAILURE() << "loaded without " << victim;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
  }
  fs::remove_all(out);
}

}  // namespace

namespace {

TEST(Fp8Ideal, LinearIsTheExactProductOfTheQuantisedWeights) {
  const int64_t T = 3, K = 300, N = 130;
  std::vector<float> w(size_t(N * K)), x(size_t(T * K));
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  for (auto& v : w) v = nd(g);
  for (auto& v : x) v = nd(g);
  const Fp8Weight q = fp8_quantize(w.data(), 1, N, K);
  const auto y = cpu::fp8_linear_ideal(x.data(), T, q, false);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      long double s = 0;
      for (int64_t k = 0; k < K; ++k)  // the exact product f8 * scale (not its fp32 rounding, Fp8Weight::value)
        s += (long double)f8e4m3_to_f32(q.q[size_t(n * K + k)]) * q.scale[size_t(n * 3 + k / 128)] * x[size_t(t * K + k)];
      ASSERT_NEAR(y[size_t(t * N + n)], double(s), 1e-12 * (1 + std::fabs(double(s))));
    }
  // With 1 x 128 activation quantisation the result moves by about e4m3's precision, no more.
  const auto y8 = cpu::fp8_linear_ideal(x.data(), T, q, true);
  const double e = cpu::rel_err(y8.data(), y.data(), y.size());
  EXPECT_GT(e, 1e-3);
  EXPECT_LT(e, 0.05);
}

TEST(Fp8Ideal, ActivationBlocksAreOneTokenBy128) {
  std::vector<float> x(2 * 200, 0.01f);
  x[5] = 4.48f;          // token 0, block 0: scale 0.01
  x[200 + 150] = -8.96f;  // token 1, block 1: scale 0.02
  const auto q = cpu::fp8_quantize_activations(x.data(), 2, 200);
  EXPECT_DOUBLE_EQ(q[5], double(4.48f / 448.0f) * 448.0);
  EXPECT_DOUBLE_EQ(q[200 + 150], -double(8.96f / 448.0f) * 448.0);
  EXPECT_NEAR(q[130], 0.01, 0.01 / 16);   // token 0, block 1: its own scale (0.01 / 448)
  EXPECT_NEAR(q[200 + 10], 0.01, 0.01 / 16);
}

// On the CPU the tested chain is the fp32 one over the same dequantised weights: the ideal chain up to
// fp32 rounding; the FP8-activation variant of the ideal chain differs by FP8 rounding.
TEST(Fp8Probe, CpuChainIsTheIdealChainUpToFp32Rounding) {
  auto model = load_model((test::kFixtures / "qwen3_5_moe").string(), LoadFormat::Safetensors, 0, Quantization::Fp8);
  const ProbeReport r = probe_moe_layer(*model, kPrompt, -1, moe_stages_cpu, "cpu");
  EXPECT_EQ(r.layer, 0);
  for (double e : {r.gemms, r.per_slot, r.combine, r.layer_out}) EXPECT_LT(e, 1e-5);
  for (double e : {r.a8_gemms, r.a8_per_slot, r.a8_combine}) {
    EXPECT_GT(e, 1e-3);
    EXPECT_LT(e, 0.1);
  }
  for (double e : {r.vs_a8_gemms, r.vs_a8_per_slot, r.vs_a8_combine}) {  // the W8A16 chain vs the W8A8 ideal
    EXPECT_GT(e, 1e-3);
    EXPECT_LT(e, 0.1);
  }
  auto plain = load_model((test::kFixtures / "qwen3_5_moe").string(), LoadFormat::Safetensors);
  EXPECT_THROW(probe_moe_layer(*plain, kPrompt, -1, moe_stages_cpu, "cpu"), Error);
  EXPECT_THROW(probe_moe_layer(*model, kPrompt, 99, moe_stages_cpu, "cpu"), Error);
}

// The CPU's W8A8 chain (activations quantised 1 x 128 before each expert GEMM) is the ideal W8A8 chain
// up to fp32 rounding, and as far from the W8A16 one as that ideal chain is.
TEST(Fp8Probe, CpuW8A8ChainIsTheIdealW8A8Chain) {
  auto model = load_model((test::kFixtures / "qwen3_5_moe").string(), LoadFormat::Safetensors, 0, Quantization::Fp8);
  const ProbeReport r = probe_moe_layer(*model, kPrompt, -1, moe_stages_cpu_w8a8, "cpu W8A8");
  for (double e : {r.vs_a8_gemms, r.vs_a8_per_slot, r.vs_a8_combine}) EXPECT_LT(e, 1e-5);
  EXPECT_NEAR(r.combine, r.a8_combine, 1e-5);
  EXPECT_GT(r.combine, 1e-3);
}

}  // namespace
