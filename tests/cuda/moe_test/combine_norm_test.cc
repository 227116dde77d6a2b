// The next layer's input norm in the combine's epilogue (moe_combine's `next`, cuda::MoeNextNorm):
// out and x = rms_norm(out) bitwise equal to the combine followed by cuda::rms_norm, for the fused
// kernel (H <= 2048, H % 8 == 0) and the fallback (a separate norm launch); x may alias the gate's x;
// padding rows of out and x untouched; x within bf16 rounding of an fp64 norm of out.
#include "cuda/moe_test/moe_test_util.h"
#include "ops/cuda/elementwise.h"

namespace moefold::cuda::moe_test {
namespace {

struct NormCase {
  int k, H, T, cap;
  bool residual, shared, gate, zero_centred, alias;
};

struct NormRun {
  std::vector<uint16_t> out, x;  // all cap rows
};

/// fused = false: moe_combine, then rms_norm into a separate buffer; true: moe_combine with `next`
/// (the fused kernel where moe_combine_norm_fused allows it). Padding rows of every input are poisoned;
/// the x buffer starts as the gate's x (so padding rows must keep those bytes).
NormRun run(const NormCase& c, bool fused, uint64_t seed) {
  const MoeShape shape{c.cap, 64, c.k, c.H, 64};
  const size_t H = size_t(c.H), P = size_t(c.cap) * c.k;
  std::vector<uint16_t> yh, xh, sh, rh, gh, wh;
  rand_bf16(P * H, seed, 1.0f, yh, nullptr);
  rand_bf16(size_t(c.cap) * H, seed + 1, 1.0f, xh, nullptr);
  rand_bf16(size_t(c.cap) * H, seed + 2, 0.5f, sh, nullptr);
  rand_bf16(size_t(c.cap) * H, seed + 3, 1.0f, rh, nullptr);
  rand_bf16(H, seed + 4, 2.0f / std::sqrt(float(H)), gh, nullptr);
  rand_bf16(H, seed + 6, 0.8f, wh, nullptr);
  std::vector<float> wts = test::uniform(P, seed + 5, 0.0f, 0.3f);
  const uint16_t garbage[3] = {0x7FC0, 0x7F7F, 0xFF80};
  for (size_t i = size_t(c.T) * H; i < size_t(c.cap) * H; ++i) xh[i] = sh[i] = rh[i] = garbage[i % 3];
  for (size_t i = size_t(c.T) * c.k * H; i < P * H; ++i) yh[i] = garbage[i % 3];
  for (size_t i = size_t(c.T) * c.k; i < P; ++i) wts[i] = NAN;
  DevBuf wsm(moe_workspace_bytes(shape)), d_w(P * 4), d_x(xh.size() * 2), d_xn(xh.size() * 2), d_s(sh.size() * 2),
      d_r(rh.size() * 2), d_g(H * 2), d_nw(H * 2), d_out(size_t(c.cap) * H * 2), d_rows(4);
  MoeWorkspace ws = moe_workspace_bind(wsm.p, wsm.bytes, shape);
  upload(ws.y, yh), upload(d_w.p, wts), upload(d_x.p, xh), upload(d_xn.p, xh), upload(d_s.p, sh);
  upload(d_r.p, rh), upload(d_g.p, gh), upload(d_nw.p, wh);
  upload(d_rows.p, std::vector<int32_t>{c.T});
  MOEFOLD_CUDA_CHECK(cudaMemset(d_out.p, 0xFF, d_out.bytes));
  const auto* x = d_x.as<__nv_bfloat16>();
  __nv_bfloat16* xn = c.alias ? d_x.as<__nv_bfloat16>() : d_xn.as<__nv_bfloat16>();
  const float eps = 1e-6f;
  auto combine = [&](const MoeNextNorm* next) {
    moe_combine(d_w.as<float>(), ws, c.shared ? d_s.as<__nv_bfloat16>() : nullptr,
                c.gate ? d_g.as<__nv_bfloat16>() : nullptr, x, c.residual ? d_r.as<__nv_bfloat16>() : nullptr,
                d_rows.as<int32_t>(), shape, d_out.as<__nv_bfloat16>(), nullptr, next);
  };
  if (fused) {
    const MoeNextNorm next{d_nw.as<__nv_bfloat16>(), xn, eps, c.zero_centred};
    combine(&next);
  } else {
    combine(nullptr);
    rms_norm(d_out.as<__nv_bfloat16>(), d_nw.as<__nv_bfloat16>(), xn, c.cap, c.H, eps,
             c.zero_centred ? NormKind::ZeroCentred : NormKind::Plain, d_rows.as<int32_t>(), nullptr);
  }
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  return {download<uint16_t>(d_out.p, size_t(c.cap) * H), download<uint16_t>(xn, size_t(c.cap) * H)};
}

/// fp64 norm of the live rows of out with weight w (the values the fused kernel wrote out).
double norm_err(const NormCase& c, const NormRun& r, uint64_t seed) {
  std::vector<uint16_t> wh;
  rand_bf16(size_t(c.H), seed + 6, 0.8f, wh, nullptr);
  std::vector<float> got, ref;
  for (int t = 0; t < c.T; ++t) {
    double ss = 0;
    for (int h = 0; h < c.H; ++h) {
      const double v = bf16_to_f32(r.out[size_t(t) * c.H + h]);
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / c.H + 1e-6);
    for (int h = 0; h < c.H; ++h) {
      const double w = bf16_to_f32(wh[h]);
      ref.push_back(float(bf16_to_f32(r.out[size_t(t) * c.H + h]) * inv * (c.zero_centred ? 1.0 + w : w)));
      got.push_back(bf16_to_f32(r.x[size_t(t) * c.H + h]));
    }
  }
  return rel_err(got, ref);
}

}  // namespace

TEST(MoeCombineNorm, BitwiseEqualsCombineThenNorm) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 9100;
  std::vector<NormCase> cases;
  for (int H : {2048, 1024, 1152, 256, 128, 4096 /*fallback: a separate norm*/, 2176 /*fallback: the two-pass combine*/})
    for (auto [T, cap] : {std::pair{1, 1}, std::pair{5, 9}, std::pair{17, 20}, std::pair{128, 128}, std::pair{0, 3}})
      for (int flags = 0; flags < 4; ++flags)
        cases.push_back({H == 1152 ? 4 : 8, H, T, cap, (flags & 1) != 0, true, (flags & 1) != 0, (flags & 2) != 0,
                         (flags & 2) == 0});
  cases.push_back({8, 2048, 4100, 4100, true, true, true, true, true});
  cases.push_back({8, 2048, 3, 9000, true, true, true, false, false});  // two-pass combine: fallback
  for (const NormCase& c : cases) {
    const MoeShape shape{c.cap, 64, c.k, c.H, 64};
    const bool expect_fused = c.H % 8 == 0 && c.H <= 2048 && c.cap <= 8192;
    DevBuf probe(256);
    const MoeNextNorm next{probe.as<__nv_bfloat16>(), probe.as<__nv_bfloat16>(), 1e-6f, false};
    const std::string shp = fmt::format("k={},H={},T={},cap={},res={},gate={},zc={},alias={}", c.k, c.H, c.T, c.cap,
                                        int(c.residual), int(c.gate), int(c.zero_centred), int(c.alias));
    EXPECT_TRUE(contract_exact("moe_combine_norm_fused_when_expected", shp,
                               moe_combine_norm_fused(shape, probe.as<__nv_bfloat16>(), next) == expect_fused ? 0 : 1));
    const NormRun a = run(c, false, ++seed), b = run(c, true, seed);
    size_t mis_out = 0, mis_x = 0;
    for (size_t i = 0; i < a.out.size(); ++i) mis_out += a.out[i] != b.out[i];
    for (size_t i = 0; i < a.x.size(); ++i) mis_x += a.x[i] != b.x[i];
    EXPECT_TRUE(contract_exact("moe_combine_norm_out_bits", shp, mis_out));
    EXPECT_TRUE(contract_exact("moe_combine_norm_x_bits_incl_padding", shp, mis_x));
    if (c.T > 0) EXPECT_TRUE(contract("moe_combine_norm_x_vs_fp64", shp, norm_err(c, b, seed), 1e-2));
  }
}

// The fused switch off: moe_combine with `next` launches the norm separately, with the same bits.
TEST(MoeCombineNorm, SwitchOffGivesSameBits) {
  MOEFOLD_REQUIRE_GPU();
  const NormCase c{8, 2048, 7, 16, true, true, true, true, true};
  const NormRun a = run(c, true, 77);
  moe_detail::set_combine_norm_fused(false);
  const NormRun b = run(c, true, 77);
  moe_detail::set_combine_norm_fused(true);
  EXPECT_TRUE(contract_exact("moe_combine_norm_switch_off_bits", "H=2048,T=7", a.out == b.out && a.x == b.x ? 0 : 1));
}

}  // namespace moefold::cuda::moe_test
