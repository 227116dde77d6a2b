// Where FP8 accuracy could go wrong on the CPU side, each against an independent reference:
// the e4m3 rounding (f32_to_f8e4m3) against a brute-force nearest-value search over the 254 finite
// codes written from the format's definition; the block quantiser at SmolLM2's awkward width (576 =
// 4.5 blocks: a partial edge block), zero blocks and bf16-rounded scales; the 1 x 128 activation
// quantisation of the W8A8 emulation (Model::set_emulate_fp8_activations) against the ideal chain's;
// and that --quantization fp8 leaves a tied embedding (and so the lm_head) unquantised.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/fp8_block.h"
#include "fixture_util.h"
#include "models/load_model.h"
#include "ops/cpu/fp8_ideal.h"
#include "ops/cpu/moe.h"
#include "runtime/model_runner.h"

using namespace moefold;

namespace {

/// float8_e4m3fn from its definition: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
/// subnormal (m * 2^-9); S.1111.111 is NaN (no infinities).
double e4m3_definition(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (code & 0x80) ? -mag : mag;
}

/// The reference rounding: the non-negative code 0 .. 0x7e whose value is nearest |x| (ties: the even
/// code, i.e. the even mantissa), saturating at 448, with x's sign; NaN -> 0x7f.
uint8_t nearest_even_reference(float x) {
  if (std::isnan(x)) return 0x7f;
  const double a = std::fabs(double(x));
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(e4m3_definition(c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | uint8_t(best);
}

TEST(Fp8Rounding, DecodingFollowsTheDefinition) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f8e4m3_to_f32(uint8_t(c)))) << c;
      continue;
    }
    EXPECT_EQ(double(f8e4m3_to_f32(uint8_t(c))), e4m3_definition(c)) << c;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), 0x1p-9f);  // smallest subnormal
}

// Every value, every midpoint between neighbours and one ulp either side (where round-to-nearest-even
// is decided), every finite bf16 (the checkpoints' weights), saturation, and 100k random magnitudes
// over the whole range (subnormals included).
TEST(Fp8Rounding, QuantiserIsRoundToNearestEvenSaturating) {
  std::vector<float> xs;
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = float(e4m3_definition(c)), hi = float(e4m3_definition(c + 1));
    const float mid = float((double(lo) + double(hi)) / 2);  // exact in fp32
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = bf16_to_f32(uint16_t(b));
    if (std::isfinite(v)) xs.push_back(v);
  }
  for (float v : {448.0f, 447.99f, 448.01f, 463.9f, 464.0f, 1e30f, -1e30f, INFINITY, -INFINITY, 0.0f, -0.0f})
    xs.push_back(v);
  std::mt19937 g(7);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(-14.0f, 6.5f);
  for (int i = 0; i < 100000; ++i) xs.push_back(nd(g) * std::exp(ud(g)));
  size_t bad = 0;
  for (float x : xs) {
    const uint8_t got = f32_to_f8e4m3(x), want = nearest_even_reference(x);
    if (got != want && bad++ < 5) ADD_FAILURE() << "x = " << x << ": got " << int(got) << ", want " << int(want);
  }
  EXPECT_EQ(bad, 0u) << "of " << xs.size();
  EXPECT_EQ(f32_to_f8e4m3(std::nanf("")) & 0x7f, 0x7f);
}

// [300, 576] = 3 x 4.5 blocks: the edge blocks are 44 rows and 64 columns; block (1, 2) is all zero
// (scale 1, codes 0); each block's largest magnitude becomes +-448 exactly and every element is the
// reference rounding of w / scale with scale = amax / 448 in fp32.
TEST(Fp8Rounding, BlocksAt576ColumnsPartialAndZero) {
  const int64_t R = 300, C = 576;
  std::mt19937 g(11);
  std::normal_distribution<float> nd;
  std::vector<float> w(size_t(R * C));
  for (auto& v : w) v = nd(g) * 0.02f;
  for (int64_t r = 128; r < 256; ++r)
    for (int64_t c = 256; c < 384; ++c) w[size_t(r * C + c)] = 0.0f;
  w[size_t(299 * C + 575)] = -0.5f;  // the corner block's max (a partial block in both dims)
  const Fp8Weight q = fp8_quantize(w.data(), 1, R, C);
  ASSERT_EQ(q.col_blocks(), 5);
  for (int64_t br = 0; br < 3; ++br)
    for (int64_t bc = 0; bc < 5; ++bc) {
      float amax = 0;
      for (int64_t r = br * 128; r < std::min<int64_t>(R, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min<int64_t>(C, bc * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(w[size_t(r * C + c)]));
      const float s = amax > 0 ? amax / 448.0f : 1.0f;
      bool has_448 = amax == 0;
      for (int64_t r = br * 128; r < std::min<int64_t>(R, br * 128 + 128); ++r) {
        ASSERT_EQ(q.scale[size_t(r * 5 + bc)], s) << br << " " << bc;
        for (int64_t c = bc * 128; c < std::min<int64_t>(C, bc * 128 + 128); ++c) {
          const uint8_t code = q.q[size_t(r * C + c)];
          ASSERT_EQ(code, nearest_even_reference(w[size_t(r * C + c)] / s)) << r << " " << c;
          has_448 |= (code & 0x7f) == 0x7e;
        }
      }
      EXPECT_TRUE(has_448) << "block " << br << " " << bc << " does not reach 448";
    }
  EXPECT_EQ(q.value(299, 575), -0.5f);
  EXPECT_EQ(q.value(200, 300), 0.0f);
}

// The W8A8 emulation's activation quantisation (fp32 result) equals the ideal chain's (fp64) up to the
// one fp32 rounding of f8 * scale, per token and 128 columns, the last block of 576 partial.
TEST(Fp8Activations, FakeQuantisationEqualsTheIdealChains) {
  const int64_t T = 5, K = 576;
  std::mt19937 g(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(T * K));
  for (auto& v : x) v = nd(g);
  x[3 * K + 600 - 128] = 0.0f;
  for (int64_t k = 128; k < 256; ++k) x[size_t(2 * K + k)] = 0.0f;  // a zero block: stays zero
  x[size_t(4 * K + 575)] = 40.0f;                                   // an outlier in a partial block
  const std::vector<double> ideal = cpu::fp8_quantize_activations(x.data(), T, K);
  std::vector<float> got = x;
  fp8_fake_quantize_activations(got.data(), T, K);
  size_t changed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], float(ideal[i])) << i;
    changed += got[i] != x[i];
  }
  EXPECT_GT(changed, got.size() / 2);  // it did quantise
  EXPECT_EQ(got[size_t(4 * K + 575)], 40.0f);
  EXPECT_EQ(got[size_t(2 * K + 130)], 0.0f);
}

std::vector<float> logits_of(const Model& m) {
  const std::vector<int32_t> ids = {1, 7, 42, 99, 3, 250, 17, 5};
  ModelRunner r(m, {8, 16, 1});
  const int32_t s = r.add_sequence(ids);
  return r.step({{s, int32_t(ids.size()), true}})[0];
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(e / n);
}

// The emulation touches only projections whose weight is FP8: a bf16 model's logits stay bitwise the
// same; an FP8 one's move by FP8 activation rounding (more than 0, far less than the signal).
TEST(Fp8Activations, EmulationQuantisesTheInputsOfFp8ProjectionsOnly) {
  const std::string dir = (test::kFixtures / "qwen3").string();
  auto plain = load_model(dir, LoadFormat::Safetensors);
  const auto l_plain = logits_of(*plain);
  plain->set_emulate_fp8_activations(true);
  EXPECT_EQ(logits_of(*plain), l_plain);
  auto fp8 = load_model(dir, LoadFormat::Safetensors, 0, Quantization::Fp8);
  const auto w8a16 = logits_of(*fp8);
  fp8->set_emulate_fp8_activations(true);
  const auto w8a8 = logits_of(*fp8);
  EXPECT_GT(rel(w8a8, w8a16), 1e-4);
  EXPECT_LT(rel(w8a8, w8a16), 0.1);
}

// The routed experts' W8A8 emulation (moe_experts with fp8_act, fp32 sums, no bf16 rounding) equals the
// ideal W8A8 chain (x and act quantised per 128 columns, fp64 sums) up to fp32 rounding, with partial
// scale blocks (H 192, I 320) and expert 0 and E-1 among the routed ones.
TEST(Fp8Activations, ExpertEmulationEqualsTheIdealW8A8Chain) {
  const int64_t T = 7, E = 6, k = 2, H = 192, I = 320;
  std::mt19937 g(11);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(T * H)), wgu(size_t(E * 2 * I * H)), wdn(size_t(E * H * I));
  for (auto& v : x) v = nd(g);
  for (auto& v : wgu) v = nd(g) * 0.07f;
  for (auto& v : wdn) v = nd(g) * 0.05f;
  const Fp8Weight gu = fp8_quantize(wgu.data(), E, 2 * I, H), dn = fp8_quantize(wdn.data(), E, H, I);
  const std::vector<float> gud = fp8_dequantize(gu), dnd = fp8_dequantize(dn);
  std::vector<int32_t> ids(size_t(T * k));
  std::vector<float> wts(size_t(T * k));
  for (int64_t i = 0; i < T * k; ++i) {
    ids[size_t(i)] = int32_t((i * 5) % E);  // 0, 5, 4, 3, 2, 1, 0, ...: every expert, 0 and E-1 included
    wts[size_t(i)] = 0.25f + 0.5f * float(i % 2);
  }
  std::vector<float> w8a8(size_t(T * H), 0.0f), w8a16(size_t(T * H), 0.0f);
  cpu::moe_experts(x.data(), gud.data(), dnd.data(), ids.data(), wts.data(), w8a8.data(), T, H, I, E, k, false, true);
  cpu::moe_experts(x.data(), gud.data(), dnd.data(), ids.data(), wts.data(), w8a16.data(), T, H, I, E, k, false, false);
  const cpu::MoeIdealStages a8 = cpu::moe_fp8_ideal(x.data(), T, ids.data(), wts.data(), k, gu, dn, E, H, I, true);
  const cpu::MoeIdealStages a16 = cpu::moe_fp8_ideal(x.data(), T, ids.data(), wts.data(), k, gu, dn, E, H, I, false);
  EXPECT_LT(cpu::rel_err(w8a8.data(), a8.out.data(), w8a8.size()), 1e-5);
  EXPECT_LT(cpu::rel_err(w8a16.data(), a16.out.data(), w8a16.size()), 1e-5);
  EXPECT_GT(cpu::rel_err(w8a8.data(), a16.out.data(), w8a8.size()), 1e-2);  // the activations' own rounding
}

// The two switches are independent: experts only moves an FP8 MoE model's logits, and differently from
// dense only; both together is the one-argument form.
TEST(Fp8Activations, ExpertAndDenseEmulationAreSeparateSwitches) {
  auto m = load_model((test::kFixtures / "qwen3_moe").string(), LoadFormat::Safetensors, 0, Quantization::Fp8);
  const auto base = logits_of(*m);
  m->set_emulate_fp8_activations(false, true);
  const auto experts = logits_of(*m);
  m->set_emulate_fp8_activations(true, false);
  const auto dense = logits_of(*m);
  m->set_emulate_fp8_activations(true);
  const auto both = logits_of(*m);
  m->set_emulate_fp8_activations(true, true);
  EXPECT_EQ(logits_of(*m), both);
  EXPECT_GT(rel(experts, base), 1e-4);
  EXPECT_GT(rel(dense, base), 1e-4);
  EXPECT_GT(rel(both, experts), 1e-4);
  EXPECT_GT(rel(both, dense), 1e-4);
}

// SmolLM2 ties its lm_head to the embedding: -q fp8 quantises the projections only; the embedding
// (and so the tied lm_head) stays as the checkpoint has it unless --fp8-lm-head, as the releases keep
// embeddings and lm_head in bf16.
TEST(Fp8Loader, QuantizationFp8LeavesATiedEmbeddingAndLmHeadUnquantised) {
  const std::string dir = (test::kFixtures / "qwen3").string();
  const ModelConfig cfg = ModelConfig::from_dir(dir);
  ASSERT_TRUE(cfg.tie_word_embeddings);
  auto src = make_weight_source(dir, cfg, LoadFormat::Safetensors, 0, Quantization::Fp8);
  const ModelWeights w = load_weights(cfg, *src);
  auto plain_src = checkpoint_source(dir);
  const ModelWeights p = load_weights(cfg, *plain_src);
  EXPECT_FALSE(w.embed.fp8);
  EXPECT_EQ(w.embed.host, p.embed.host);
  EXPECT_FALSE(w.lm_head.fp8);
  EXPECT_TRUE(w.lm_head.host.empty());  // tied: the forward uses the (unquantised) embedding
  for (const LayerWeights& L : w.layers) {
    EXPECT_TRUE(L.attn.q_proj.w.fp8 && L.attn.k_proj.w.fp8 && L.attn.v_proj.w.fp8 && L.attn.o_proj.w.fp8);
    EXPECT_TRUE(L.mlp.gate_up.w.fp8 && L.mlp.down.w.fp8);
    EXPECT_FALSE(L.input_norm.fp8);
  }
}

}  // namespace
