// The FP8 KV cache (--kv-cache-dtype fp8): the e4m3 store / load contract (round to nearest even,
// saturation, NaN), page stores that depend only on each token's own K/V, attention over FP8 pages
// against an fp64 reference over the dequantised cache (tight) and against fp32 pages (loose), the
// pool capacity per byte, the flag's names and refusals, and the checkpoint's k_scale / v_scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <unistd.h>

#include "core/error.h"
#include "fixture_util.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "models/load_model.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/kv_quant.h"
#include "runtime/kv_cache.h"
#include "test_util.h"

using namespace moefold;
using namespace moefold::cpu;
using moefold::test::randn;
using moefold::test::rel_err;

namespace {

const float* T() { return kv_fp8_table(); }

TEST(KvFp8Quant, EveryFiniteByteRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(T()[b])) << b;
      continue;
    }
    bool sat = false;
    EXPECT_EQ(kv_fp8_store(T()[b], 1.0f, &sat), uint8_t(b)) << "byte " << b << " value " << T()[b];
    EXPECT_FALSE(sat) << b;
  }
  EXPECT_EQ(T()[0x7e], 448.0f);
  EXPECT_EQ(T()[0x01], std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::signbit(T()[0x80]));
}

TEST(KvFp8Quant, RoundsToNearestEvenBetweenEveryPairOfNeighbours) {
  for (int i = 0; i < 0x7e; ++i) {  // positive neighbours i, i + 1 (subnormals, normals, up to 448)
    const float a = T()[i], b = T()[i + 1], mid = 0.5f * (a + b);  // exact in fp32
    const uint8_t even = uint8_t((i & 1) == 0 ? i : i + 1);
    EXPECT_EQ(kv_fp8_store(mid, 1.0f), even) << "tie between " << a << " and " << b;
    EXPECT_EQ(kv_fp8_store(-mid, 1.0f), uint8_t(even | 0x80)) << "tie between " << -a << " and " << -b;
    EXPECT_EQ(kv_fp8_store(std::nextafter(mid, 0.0f), 1.0f), uint8_t(i)) << a;
    EXPECT_EQ(kv_fp8_store(std::nextafter(mid, 1000.0f), 1.0f), uint8_t(i + 1)) << b;
  }
}

TEST(KvFp8Quant, SaturatesCountsAndKeepsNaN) {
  bool sat = false;
  EXPECT_EQ(kv_fp8_store(448.0f, 1.0f, &sat), 0x7e);
  EXPECT_FALSE(sat);
  for (float x : {std::nextafter(448.0f, 1e9f), 464.0f, 1e30f, INFINITY}) {
    sat = false;
    EXPECT_EQ(kv_fp8_store(x, 1.0f, &sat), 0x7e) << x;
    EXPECT_TRUE(sat) << x;
    sat = false;
    EXPECT_EQ(kv_fp8_store(-x, 1.0f, &sat), 0xfe) << -x;
    EXPECT_TRUE(sat) << -x;
  }
  sat = false;
  EXPECT_EQ(kv_fp8_store(NAN, 1.0f, &sat), 0x7f);
  EXPECT_FALSE(sat);
  EXPECT_TRUE(std::isnan(kv_fp8_load(0x7f, 0.5f)));
  EXPECT_TRUE(std::isnan(kv_fp8_load(0xff, 0.5f)));
  // With a scale: the bound is 448 * scale.
  sat = false;
  EXPECT_EQ(kv_fp8_store(448.0f * 0.25f, 0.25f, &sat), 0x7e);
  EXPECT_FALSE(sat);
  EXPECT_EQ(kv_fp8_store(113.0f, 0.25f, &sat), 0x7e);
  EXPECT_TRUE(sat);
}

TEST(KvFp8Quant, ScaleIsOneDivisionOnStoreAndOneMultiplyOnLoad) {
  const auto x = randn(4096, 3, 2.0f);
  for (float s : {0.037f, 1.0f, 3.5f})
    for (float v : x) {
      const uint8_t q = kv_fp8_store(v, s);
      EXPECT_EQ(q, kv_fp8_store(v / s, 1.0f));
      EXPECT_EQ(kv_fp8_load(q, s), T()[q] * s);
      // nearest: no other byte is closer to v / s
      EXPECT_LE(std::fabs(T()[q] - v / s), std::fabs(v / s) * 0.0625f + std::ldexp(1.0f, -10)) << v << " " << s;
    }
}

/// Pages of `elem` for `blocks` pages of `bs` tokens, Hkv heads of D.
struct Pages {
  std::vector<uint8_t> k, v;
  std::vector<float> ks, vs;
  KvPages view;
  Pages(KvElem e, int64_t blocks, int64_t bs, int64_t Hkv, int64_t D, std::vector<float> k_scale = {},
        std::vector<float> v_scale = {})
      : k(size_t(blocks * bs * Hkv * D) * size_t(kv_elem_bytes(e)), 0xAB),  // poisoned
        v(k.size(), 0xAB),
        ks(k_scale.empty() ? std::vector<float>(size_t(Hkv), 1.0f) : k_scale),
        vs(v_scale.empty() ? std::vector<float>(size_t(Hkv), 1.0f) : v_scale) {
    view.elem = e, view.k = k.data(), view.v = v.data(), view.k_scale = ks.data(), view.v_scale = vs.data();
    view.block_size = bs, view.num_kv_heads = Hkv, view.head_dim = D;
  }
  /// The dequantised value of element `i` of k or v pages.
  float value(bool is_v, size_t i) const {
    const auto& b = is_v ? v : k;
    const int64_t g = int64_t(i) / view.head_dim % view.num_kv_heads;
    switch (view.elem) {
      case KvElem::F32: { float f; std::memcpy(&f, &b[i * 4], 4); return f; }
      case KvElem::BF16: { uint16_t h; std::memcpy(&h, &b[i * 2], 2); return bf16_to_f32(h); }
      case KvElem::F8E4M3: return kv_fp8_load(b[i], (is_v ? vs : ks)[size_t(g)]);
    }
    return NAN;
  }
};

TEST(KvFp8Pages, StoreDependsOnlyOnEachTokensOwnKv) {
  const int64_t Hkv = 2, D = 16, bs = 8, total = 29, kv_dim = Hkv * D;
  const std::vector<int32_t> table = {3, 0, 5, 1};
  const auto k = randn(size_t(total * kv_dim), 11, 3.0f), v = randn(size_t(total * kv_dim), 12, 0.5f);
  Pages whole(KvElem::F8E4M3, 6, bs, Hkv, D, {0.05f, 0.5f}, {0.01f, 2.0f});
  Pages pieces = whole;
  pieces.view.k = pieces.k.data(), pieces.view.v = pieces.v.data();
  pieces.view.k_scale = pieces.ks.data(), pieces.view.v_scale = pieces.vs.data();
  EXPECT_EQ(kv_cache_write(k.data(), v.data(), whole.view, table.data(), 0, total), 0);
  for (auto [start, n] : {std::pair<int64_t, int64_t>{0, 1}, {1, 5}, {6, 17}, {23, 6}})
    kv_cache_write(&k[size_t(start * kv_dim)], &v[size_t(start * kv_dim)], pieces.view, table.data(), start, n);
  EXPECT_EQ(whole.k, pieces.k);
  EXPECT_EQ(whole.v, pieces.v);
  // Each stored byte is e4m3(x / its head's scale); pages nobody wrote stay untouched.
  for (int64_t p = 0; p < total; ++p)
    for (int64_t e = 0; e < kv_dim; ++e) {
      const size_t at = size_t((table[size_t(p / bs)] * bs + p % bs) * kv_dim + e);
      EXPECT_EQ(whole.k[at], kv_fp8_store(k[size_t(p * kv_dim + e)], whole.ks[size_t(e / D)]));
      EXPECT_EQ(whole.v[at], kv_fp8_store(v[size_t(p * kv_dim + e)], whole.vs[size_t(e / D)]));
    }
  for (size_t i = size_t(2 * bs * kv_dim); i < size_t(3 * bs * kv_dim); ++i) EXPECT_EQ(whole.k[i], 0xAB);  // page 2
}

TEST(KvFp8Pages, SaturatedElementsAreCounted) {
  const int64_t Hkv = 2, D = 4, kv_dim = Hkv * D;
  Pages p(KvElem::F8E4M3, 1, 4, Hkv, D, {1.0f, 0.5f}, {1.0f, 1.0f});
  std::vector<float> k(size_t(kv_dim), 1.0f), v(size_t(kv_dim), 1.0f);
  k[0] = 500.0f;            // head 0, scale 1: saturates
  k[D] = 300.0f;            // head 1, scale 0.5: 600 saturates
  k[D + 1] = 200.0f;        // 400 fits
  v[1] = -INFINITY;         // saturates
  v[2] = NAN;               // stored as NaN, not counted
  const int32_t table = 0;
  EXPECT_EQ(kv_cache_write(k.data(), v.data(), p.view, &table, 0, 1), 3);
  EXPECT_EQ(p.k[0], 0x7e);
  EXPECT_EQ(p.v[1], 0xfe);
  EXPECT_EQ(p.v[2], 0x7f);
  Pages bad(KvElem::F8E4M3, 1, 4, Hkv, D, {1.0f, 0.0f});
  EXPECT_THROW(kv_cache_write(k.data(), v.data(), bad.view, &table, 0, 1), Error);
}

/// fp64 causal attention over the dequantised pages of one sequence.
std::vector<double> reference(const std::vector<float>& q, const Pages& pg, const std::vector<int32_t>& table,
                              int64_t total, int64_t Hq, float scale) {
  const int64_t Hkv = pg.view.num_kv_heads, D = pg.view.head_dim, bs = pg.view.block_size, kv_dim = Hkv * D;
  std::vector<double> ref(size_t(total * Hq * D));
  auto at = [&](int64_t p, int64_t g, int64_t d) { return size_t((table[size_t(p / bs)] * bs + p % bs) * kv_dim + g * D + d); };
  for (int64_t i = 0; i < total; ++i)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      std::vector<double> s(size_t(i + 1));
      double m = -1e300, den = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += double(q[size_t((i * Hq + h) * D + d)]) * pg.value(false, at(j, g, d));
        s[size_t(j)] = acc * scale;
        m = std::max(m, s[size_t(j)]);
      }
      for (auto& e : s) den += (e = std::exp(e - m));
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t j = 0; j <= i; ++j) acc += s[size_t(j)] / den * pg.value(true, at(j, g, d));
        ref[size_t((i * Hq + h) * D + d)] = acc;
      }
    }
  return ref;
}

/// Writes and attends in pieces (a prefill chunk, a continuation, then decode rows) over `pg`.
std::vector<float> attend(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                          Pages& pg, const std::vector<int32_t>& table, int64_t total, int64_t Hq, float scale) {
  const int64_t kv_dim = pg.view.num_kv_heads * pg.view.head_dim, D = pg.view.head_dim;
  auto out = test::poisoned(size_t(total * Hq * D));
  std::vector<std::pair<int64_t, int64_t>> pieces = {{0, 37}, {37, 30}};
  for (int64_t p = 67; p < total; ++p) pieces.push_back({p, 1});
  for (auto [start, n] : pieces) {
    kv_cache_write(&k[size_t(start * kv_dim)], &v[size_t(start * kv_dim)], pg.view, table.data(), start, n);
    paged_attention(&q[size_t(start * Hq * D)], pg.view, table.data(), start, n, Hq, scale, &out[size_t(start * Hq * D)]);
  }
  return out;
}

TEST(KvFp8Attention, MatchesFp64OverTheDequantisedCacheAndFp32PagesLoosely) {
  const int64_t Hq = 6, Hkv = 2, D = 32, bs = 16, total = 70, kv_dim = Hkv * D;
  const std::vector<int32_t> table = {5, 0, 3, 7, 1};
  const auto q = randn(size_t(total * Hq * D), 8), k = randn(size_t(total * kv_dim), 9, 2.0f),
             v = randn(size_t(total * kv_dim), 10, 0.7f);
  const float scale = 1.0f / std::sqrt(float(D));
  Pages f32(KvElem::F32, 8, bs, Hkv, D), b16(KvElem::BF16, 8, bs, Hkv, D),
      f8(KvElem::F8E4M3, 8, bs, Hkv, D, {0.02f, 1.0f}, {0.005f, 0.25f});
  const auto o32 = attend(q, k, v, f32, table, total, Hq, scale);
  const auto o16 = attend(q, k, v, b16, table, total, Hq, scale);
  const auto o8 = attend(q, k, v, f8, table, total, Hq, scale);
  EXPECT_LT(rel_err(o8, reference(q, f8, table, total, Hq, scale)), 1e-5);   // the attention itself: fp32 exact-ish
  EXPECT_LT(rel_err(o16, reference(q, b16, table, total, Hq, scale)), 1e-5);
  const double e8 = rel_err(o8, o32), e16 = rel_err(o16, o32);
  EXPECT_LT(e16, 1e-2);
  EXPECT_LT(e8, 8e-2);  // e4m3's 3 mantissa bits: ~2-4% per element, averaged by the softmax
  EXPECT_GT(e8, e16);   // and it really quantised
  std::printf("attention vs fp32 pages: bf16 %.2e, fp8 %.2e\n", e16, e8);
}

TEST(KvFp8Attention, NaNInTheCachePropagatesToTheOutput) {
  const int64_t Hq = 2, Hkv = 1, D = 8, bs = 4;
  Pages f8(KvElem::F8E4M3, 2, bs, Hkv, D);
  auto k = randn(size_t(3 * D), 1), v = randn(size_t(3 * D), 2), q = randn(size_t(3 * Hq * D), 3);
  v[size_t(D + 2)] = NAN;  // token 1
  const std::vector<int32_t> table = {1, 0};
  kv_cache_write(k.data(), v.data(), f8.view, table.data(), 0, 3);
  std::vector<float> out(size_t(3 * Hq * D), 0.0f);
  paged_attention(q.data(), f8.view, table.data(), 0, 3, Hq, 0.3f, out.data());
  EXPECT_FALSE(std::isnan(out[2]));        // row 0 sees only token 0
  EXPECT_TRUE(std::isnan(out[size_t(Hq * D + 2)]));  // row 1 reads the NaN
}

const ModelConfig& qwen3() {
  static const ModelConfig c = ModelConfig::from_dir((test::kFixtures / "qwen3").string());
  return c;
}

TEST(KvCacheDtype, NamesAndRefusals) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), KvCacheDtype::Auto);
  EXPECT_EQ(parse_kv_cache_dtype(""), KvCacheDtype::Auto);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16"), KvCacheDtype::BFloat16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KvCacheDtype::Fp8E4m3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), KvCacheDtype::Fp8E4m3);
  EXPECT_THROW(parse_kv_cache_dtype("fp8_e5m2"), Error);
  EXPECT_EQ(kv_elem_for(KvCacheDtype::Auto, false), KvElem::F32);
  EXPECT_EQ(kv_elem_for(KvCacheDtype::Auto, true), KvElem::BF16);
  EXPECT_EQ(kv_elem_for(KvCacheDtype::Fp8E4m3, true), KvElem::F8E4M3);
  EXPECT_NO_THROW(check_kv_cache_dtype(qwen3(), KvCacheDtype::Fp8E4m3, "cpu"));
  const ModelConfig mla = ModelConfig::from_dir((test::kFixtures / "deepseek_v32").string());
  EXPECT_NO_THROW(check_kv_cache_dtype(mla, KvCacheDtype::Auto, "cpu"));
  try {
    check_kv_cache_dtype(mla, KvCacheDtype::Fp8E4m3, "cpu");
    ADD_FAILURE() << "MLA took fp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MLA"), std::string::npos) << e.what();
  }
  EXPECT_THROW(KvCache(mla, 2, 16, KvElem::F8E4M3), Error);
}

TEST(KvCacheDtype, Fp8HoldsTwiceTheTokensOfBf16) {
  const ModelConfig& c = qwen3();
  const int64_t mem = int64_t(48) << 20;
  const int64_t p32 = kv_pages_for_memory(c, KvElem::F32, mem, 16), p16 = kv_pages_for_memory(c, KvElem::BF16, mem, 16),
                p8 = kv_pages_for_memory(c, KvElem::F8E4M3, mem, 16);
  EXPECT_GT(p32, 0);
  EXPECT_EQ(p16, 2 * p32);
  EXPECT_EQ(p8, 2 * p16);
  // The pool's bytes per page follow the element.
  KvCache a(c, 10, 16, KvElem::BF16), b(c, 10, 16, KvElem::F8E4M3);
  for (size_t l = 0; l < a.k.size(); ++l) {
    EXPECT_EQ(a.k_narrow[l].size(), size_t(10 * 16 * c.num_kv_heads * c.head_dim * 2));
    EXPECT_EQ(b.k_narrow[l].size(), a.k_narrow[l].size() / 2);
    EXPECT_EQ(b.v_narrow[l].size(), b.k_narrow[l].size());
    EXPECT_TRUE(b.k[l].empty());
  }
}

/// A copy of the qwen3 fixture (links) plus `extra` tensors in a second safetensors file.
std::string fixture_with(const std::string& name, const std::vector<std::pair<std::string, std::vector<float>>>& extra,
                         const std::vector<std::vector<int64_t>>& shapes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("moefold_kv_scales_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::create_symlink(test::kFixtures / "qwen3" / f, dir / f);
  std::vector<TensorView> t;
  for (size_t i = 0; i < extra.size(); ++i)
    t.push_back({extra[i].first, DType::F32, shapes[i], extra[i].second.data(), extra[i].second.size() * 4});
  write_safetensors((dir / "kv_scales.safetensors").string(), t);
  return dir.string();
}

TEST(KvCacheScales, CheckpointScalesLoadPerLayerAndHead) {
  const ModelConfig& c = qwen3();
  ASSERT_EQ(c.num_kv_heads, 2);
  std::vector<std::pair<std::string, std::vector<float>>> extra;
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = c.tensor_prefix + "layers." + std::to_string(l) + ".self_attn.";
    if (l == 0) {  // ModelOpt's names, per head
      extra.push_back({p + "k_proj.k_scale", {0.5f, 0.25f}}), shapes.push_back({2});
      extra.push_back({p + "v_proj.v_scale", {0.125f, 2.0f}}), shapes.push_back({2});
    } else if (l == 1) {  // the deprecated one scale for both
      extra.push_back({p + "kv_scale", {0.75f}}), shapes.push_back({});
    } else {  // compressed-tensors: scalars
      extra.push_back({p + "k_scale", {float(l)}}), shapes.push_back({});
      extra.push_back({p + "v_scale", {0.5f * float(l)}}), shapes.push_back({1});
    }
  }
  const std::string dir = fixture_with("ok", extra, shapes);
  auto m = load_model(dir, LoadFormat::Safetensors);
  const auto& L = m->weights().layers;
  EXPECT_EQ(L[0].attn.k_scale, (std::vector<float>{0.5f, 0.25f}));
  EXPECT_EQ(L[0].attn.v_scale, (std::vector<float>{0.125f, 2.0f}));
  EXPECT_EQ(L[1].attn.k_scale, (std::vector<float>{0.75f, 0.75f}));
  EXPECT_EQ(L[1].attn.v_scale, (std::vector<float>{0.75f, 0.75f}));
  EXPECT_EQ(L[3].attn.k_scale, (std::vector<float>{3.0f, 3.0f}));
  EXPECT_EQ(L[3].attn.v_scale, (std::vector<float>{1.5f, 1.5f}));
  // The scales reach the pages: fp8 logits with them differ from fp8 logits with 1.
  auto plain = load_model((test::kFixtures / "qwen3").string(), LoadFormat::Safetensors);
  EXPECT_TRUE(plain->weights().layers[0].attn.k_scale.empty());
  const std::vector<int32_t> ids = {3, 17, 99, 5, 42, 7, 8, 250};
  auto logits = [&](const Model& model) {
    RunnerOptions ro{4, 16, 1};
    ro.kv_cache_dtype = KvCacheDtype::Fp8E4m3;
    ModelRunner r(model, ro);
    const int32_t s = r.add_sequence(ids);
    return r.step({{s, int32_t(ids.size()), true}})[0];
  };
  const auto a = logits(*m), b = logits(*plain);
  EXPECT_NE(a, b);
  EXPECT_LT(rel_err(a, b), 0.2);  // the same model, other rounding
  std::filesystem::remove_all(dir);
}

TEST(KvCacheScales, BadScalesAreRefused) {
  const ModelConfig& c = qwen3();
  const std::string p0 = c.tensor_prefix + "layers.0.self_attn.";
  const std::string zero = fixture_with("zero", {{p0 + "k_scale", {0.0f}}, {p0 + "v_scale", {1.0f}}}, {{}, {}});
  EXPECT_THROW(load_model(zero, LoadFormat::Safetensors), Error);
  const std::string shape = fixture_with("shape", {{p0 + "k_scale", {1, 1, 1}}, {p0 + "v_scale", {1.0f}}}, {{3}, {}});
  EXPECT_THROW(load_model(shape, LoadFormat::Safetensors), Error);
  const std::string only_k = fixture_with("only_k", {{p0 + "k_scale", {1.0f}}}, {{}});
  EXPECT_THROW(load_model(only_k, LoadFormat::Safetensors), Error);
  for (const auto& d : {zero, shape, only_k}) std::filesystem::remove_all(d);
}

}  // namespace
