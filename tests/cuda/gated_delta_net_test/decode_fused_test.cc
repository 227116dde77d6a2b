// gated_delta_net_test: gdn_decode_fused (conv step + delta rule + gated RMSNorm in one launch) against the
// three launches it replaces (causal_conv1d_silu_decode, gdn_recurrent_decode, gated_rms_norm), byte for
// byte: outputs, recurrent state pool and conv state pool, padding sequences' rows and slots untouched.
#include "cuda/gated_delta_net_test/gdn_test_util.h"
#include "ops/cuda/gated_rms_norm.h"

namespace gdn_test {
namespace {

struct FusedRun {
  std::vector<uint16_t> out, conv_pool;
  std::vector<float> pool;
};

/// One decode step of `live` of `cap` sequences over the in-projection layout [q | k | v | z | b | a] per row.
/// fused: gdn_decode_fused; else the three launches. Pools and outputs start from the same bytes.
FusedRun run(const GdnDims& d, int cap, int live, bool fused, uint64_t seed) {
  const int Hv = d.num_v_heads, dv = d.v_dim, K = kConvK;
  // The row width rounded up to 8 elements, as the executor's fused projection rows are (16-byte rows).
  const int64_t C = conv_dim(d), W = (C + int64_t(Hv) * dv + 2 * Hv + 7) / 8 * 8, nslots = cap + 2;
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = int32_t((3 * s + 1) % nslots);
  const auto proj = round_bf16(moefold::test::randn(size_t(cap * W), seed));
  const auto conv_w = round_bf16(moefold::test::randn(size_t(C * K), seed + 1, 0.5f));
  const auto norm_w = round_bf16(moefold::test::uniform(size_t(dv), seed + 2, 0.5f, 1.5f));
  const auto A_log = moefold::test::uniform(size_t(Hv), seed + 3, -3.0f, 1.0f);
  const auto dt_bias = moefold::test::uniform(size_t(Hv), seed + 4, -3.0f, 0.5f);
  const auto pool0 = make_pool(nslots, int64_t(Hv) * d.k_dim * dv, slice(slots, 0, size_t(live)), seed + 5);
  std::vector<uint16_t> cpool0 = to_bf16(moefold::test::randn(size_t(nslots * C * (K - 1)), seed + 6));
  for (int s = 0; s < nslots; ++s)  // slots no live sequence uses hold NaN bytes
    if (std::find(slots.begin(), slots.begin() + live, s) == slots.begin() + live)
      std::fill(cpool0.begin() + s * C * (K - 1), cpool0.begin() + (s + 1) * C * (K - 1), uint16_t(0xFFFF));
  Dev<uint16_t> dproj(to_bf16(proj)), dcw(to_bf16(conv_w)), dnw(to_bf16(norm_w)), dcpool(cpool0),
      dconv(size_t(cap * C)), dout(size_t(cap) * Hv * dv);
  Dev<float> dA(A_log), ddt(dt_bias), dpool(pool0);
  Dev<int32_t> dslots(slots), dns(std::vector<int32_t>{live});
  dconv.poison();
  dout.poison();
  const __nv_bfloat16* x = dproj.bf();
  const __nv_bfloat16 *z = x + C, *b = z + int64_t(Hv) * dv, *a = b + Hv;
  GdnArgs args{dconv.bf(), dconv.bf() + int64_t(d.num_k_heads) * d.k_dim, dconv.bf() + 2 * int64_t(d.num_k_heads) * d.k_dim,
               C, a, b, W, dA.p, ddt.p, dpool.p, dslots.p, dns.p, dout.bf(), cap};
  const float eps = 1e-6f;
  if (fused) {
    const moefold::cuda::GdnDecodeConv conv{x, W, dcw.bf(), dcpool.bf(), K};
    const moefold::cuda::GdnDecodeGatedNorm norm{z, W, dnw.bf(), eps};
    moefold::cuda::gdn_decode_fused(args, conv, norm, cap, d, nullptr);
  } else {
    moefold::cuda::causal_conv1d_silu_decode(x, dcw.bf(), dslots.p, dns.p, cap, dcpool.bf(), dconv.bf(), int(C), K,
                                             nullptr, W);
    moefold::cuda::gdn_recurrent_decode(args, cap, d, nullptr);
    moefold::cuda::gated_rms_norm(dout.bf(), z, dnw.bf(), dout.bf(), cap, Hv, dv, eps, dns.p, nullptr, W);
  }
  return {dout.down(), dcpool.down(), dpool.down()};
}

std::string case_str(const GdnDims& d, int cap, int live) {
  return dims_str(d) + ",cap=" + std::to_string(cap) + ",live=" + std::to_string(live);
}

// Whether gdn_decode_fused takes d at `cap` sequences (the layouts of run()).
bool supported(const GdnDims& d, int cap) {
  Dev<uint16_t> buf(256);
  Dev<int32_t> ns(1);
  const int64_t C = conv_dim(d);
  GdnArgs args{buf.bf(), buf.bf(), buf.bf(), C, buf.bf(), buf.bf(), 2 * d.num_v_heads, nullptr, nullptr,
               nullptr, ns.p, ns.p, buf.bf(), 0};
  const moefold::cuda::GdnDecodeConv conv{buf.bf(), C, buf.bf(), buf.bf(), kConvK};
  const moefold::cuda::GdnDecodeGatedNorm norm{buf.bf(), (C + int64_t(d.num_v_heads) * d.v_dim + 2 * d.num_v_heads + 7) / 8 * 8,
                                               buf.bf(), 1e-6f};
  return moefold::cuda::gdn_decode_fused_supported(args, conv, norm, cap, d);
}

}  // namespace

TEST(GdnDecodeFused, BitwiseEqualsThreeLaunches) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 4400;
  const std::vector<GdnDims> shapes{kReal, kSmall, kTc, GdnDims{4, 8, 64, 64}, GdnDims{2, 2, 128, 256},
                                    GdnDims{16, 64, 128, 128} /*397B: a cluster of 16 at 1 column a lane*/};
  for (const GdnDims& d : shapes)
    for (auto [cap, live] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{3, 3}, std::pair{8, 5}, std::pair{17, 16},
                             std::pair{4, 0}}) {
      const std::string shp = case_str(d, cap, live);
      if (!supported(d, cap)) {
        // Only the 397B shape at one column a lane (16 blocks a key head) may fall back.
        EXPECT_TRUE(contract_exact("gdn_decode_fused.supported", shp, d.num_v_heads == 64 ? 0 : 1));
        continue;
      }
      const FusedRun a = run(d, cap, live, false, ++seed), f = run(d, cap, live, true, seed);
      EXPECT_TRUE(contract_exact("gdn_decode_fused.out_bits", shp, byte_mismatches(a.out, f.out, 0, a.out.size())));
      EXPECT_TRUE(contract_exact("gdn_decode_fused.state_bits", shp, byte_mismatches(a.pool, f.pool, 0, a.pool.size())));
      EXPECT_TRUE(contract_exact("gdn_decode_fused.conv_state_bits", shp,
                                 byte_mismatches(a.conv_pool, f.conv_pool, 0, a.conv_pool.size())));
      size_t nan = 0;
      for (size_t i = 0; i < size_t(live) * d.num_v_heads * d.v_dim; ++i) nan += std::isnan(bf16_to_f32(f.out[i]));
      EXPECT_TRUE(contract_exact("gdn_decode_fused.live_rows_finite", shp, nan));
      EXPECT_TRUE(contract_exact("gdn_decode_fused.padding_rows", shp,
                                 unpoisoned(f.out, size_t(live) * d.num_v_heads * d.v_dim,
                                            size_t(cap - live) * d.num_v_heads * d.v_dim)));
    }
}

// Small enough for compute-sanitizer (memcheck / racecheck): the cluster exchange at 2 and 8 blocks.
TEST(GdnDecodeFused, SanitizeSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (const GdnDims& d : {kSmall, GdnDims{1, 2, 128, 128}}) {
    const FusedRun a = run(d, 2, 1, false, 99), f = run(d, 2, 1, true, 99);
    EXPECT_TRUE(contract_exact("gdn_decode_fused.sanitize", case_str(d, 2, 1),
                               byte_mismatches(a.out, f.out, 0, a.out.size()) +
                                   byte_mismatches(a.pool, f.pool, 0, a.pool.size())));
  }
}

}  // namespace gdn_test
