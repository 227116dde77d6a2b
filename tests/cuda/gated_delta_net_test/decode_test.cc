// gated_delta_net_test: the recurrent decode step (every kernel variant, live counts of the graph
// buckets) against one CPU step per sequence; host-side argument checks.
#include "cuda/gated_delta_net_test/gdn_test_util.h"

namespace gdn_test {

// Recurrent decode of `live` sequences in capacity live+3 against one CPU step per sequence.
void decode_case(const GdnDims& d, int live, uint64_t seed) {
  const int cap = live + 3, nslots = 2 * cap + 1;
  const Problem P(d, cap, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = 2 * cap - 2 * s;  // distinct, reversed, with gaps
  const auto pool0 = make_pool(nslots, se, slice(slots, 0, size_t(live)), seed + 5);
  DevProblem dp(P);
  Dev<float> dpool(pool0);
  Dev<uint16_t> dout(size_t(cap * orow));
  Dev<int32_t> dslots(slots), dns(std::vector<int32_t>{live});
  dout.poison();
  moefold::cuda::gdn_recurrent_decode(dp.args(0, dpool.p, dslots.p, dns.p, dout.p), cap, d, nullptr);
  const auto out = dout.down();
  const auto pool = dpool.down();
  std::vector<float> oref(size_t(live * orow)), pref = pool0, st_gpu, st_ref;
  for (int s = 0; s < live; ++s) {
    P.reference(s, 1, pref.data() + slots[size_t(s)] * se, oref.data() + s * orow);
    const auto a = slice(pool, size_t(slots[size_t(s)] * se), size_t(se));
    const auto b = slice(pref, size_t(slots[size_t(s)] * se), size_t(se));
    st_gpu.insert(st_gpu.end(), a.begin(), a.end());
    st_ref.insert(st_ref.end(), b.begin(), b.end());
  }
  size_t pad = unpoisoned(out, size_t(live * orow), size_t((cap - live) * orow));
  for (int s = 0; s < nslots; ++s)
    if (std::find(slots.begin(), slots.begin() + live, s) == slots.begin() + live)
      pad += byte_mismatches(pool, pool0, size_t(s * se), size_t(se));
  const std::string shape = dims_str(d) + ",batch=" + std::to_string(live) + ",cap=" + std::to_string(cap);
  EXPECT_TRUE(contract("gdn_decode.out", shape, rel_err(from_bf16(slice(out, 0, size_t(live * orow))), oref), kTolBf16));
  EXPECT_TRUE(contract("gdn_decode.state", shape, rel_err(st_gpu, st_ref), kTolState));
  EXPECT_TRUE(contract_exact("gdn_decode.padding", shape, pad));
  Dev<float> dpool2(pool0);
  Dev<uint16_t> dout2(size_t(live * orow));
  dout2.poison();
  moefold::cuda::gdn_recurrent_decode(dp.args(0, dpool2.p, dslots.p, dns.p, dout2.p), live, d, nullptr);
  EXPECT_TRUE(contract_exact("gdn_decode.unpadded_equal", shape,
                             byte_mismatches(out, dout2.down(), 0, size_t(live * orow)) +
                                 byte_mismatches(pool, dpool2.down(), 0, pool.size())));
}

namespace {

// The decode kernels (detail::gdn_recurrent_decode_variant) that can run `d`: 0 (the former kernel) and
// 1 / 2 / 4 value columns a lane where dk and dv allow them.
std::vector<int> decode_variants(const GdnDims& d) {
  std::vector<int> v{0, 1};
  for (int c : {2, 4})
    if (d.k_dim <= 128 && d.v_dim % (32 * c) == 0) v.push_back(c);
  return v;
}

// Decode at capacity `cap`, at each live count of `lives`: every kernel variant gives the former
// kernel's bits (outputs and states); padding rows of out stay poisoned and the slots of padding
// sequences and unused slots keep their bytes; one sequence run alone (capacity 1) equals its row in the
// batch bit for bit; the first rows match the CPU.
void decode_live_case(const GdnDims& d, int cap, const std::vector<int>& lives, uint64_t seed) {
  const int nslots = cap + 2;
  const Problem P(d, cap, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = cap - s;  // reversed; slots 0 and cap + 1 unused
  const auto pool0 = make_pool(nslots, se, slots, seed + 5);
  DevProblem dp(P);
  Dev<float> dpool(pool0);
  Dev<uint16_t> dout(size_t(cap * orow));
  Dev<int32_t> dslots(slots), dns(std::vector<int32_t>{cap});
  const std::vector<int> variants = decode_variants(d);
  for (int L : lives) {
    const std::string shape = dims_str(d) + ",cap=" + std::to_string(cap) + ",live=" + std::to_string(L);
    dns.up(std::vector<int32_t>{L});
    std::vector<uint16_t> out_ref;
    std::vector<float> pool_ref;
    for (int v : variants) {
      dpool.up(pool0);
      dout.poison();
      moefold::cuda::detail::gdn_recurrent_decode_variant(dp.args(0, dpool.p, dslots.p, dns.p, dout.p), cap, d, v,
                                                          nullptr);
      auto out = dout.down();
      auto pool = dpool.down();
      size_t pad = unpoisoned(out, size_t(L * orow), size_t((cap - L) * orow));
      for (int s = 0; s < nslots; ++s)
        if (std::find(slots.begin(), slots.begin() + L, s) == slots.begin() + L)
          pad += byte_mismatches(pool, pool0, size_t(s * se), size_t(se));
      EXPECT_TRUE(contract_exact("gdn_decode_live.padding", shape + ",variant=" + std::to_string(v), pad));
      if (v == 0) {
        out_ref = std::move(out);
        pool_ref = std::move(pool);
        continue;
      }
      EXPECT_TRUE(contract_exact("gdn_decode_live.variant_eq_former", shape + ",variant=" + std::to_string(v),
                                 byte_mismatches(out, out_ref, 0, out.size()) +
                                     byte_mismatches(pool, pool_ref, 0, pool.size())));
    }
    // One sequence alone (capacity 1, the automatic kernel) == its row in the batch.
    for (int t : {0, L - 1}) {
      Dev<float> dp1(pool0);
      Dev<uint16_t> do1(static_cast<size_t>(orow));
      Dev<int32_t> ds1(std::vector<int32_t>{slots[size_t(t)]}), dn1(std::vector<int32_t>{1});
      do1.poison();
      moefold::cuda::gdn_recurrent_decode(dp.args(t, dp1.p, ds1.p, dn1.p, do1.p, nullptr, false), 1, d, nullptr);
      const auto o1 = do1.down();
      const auto p1 = dp1.down();
      const size_t sl = size_t(slots[size_t(t)]);
      size_t mis = 0;
      for (int64_t e = 0; e < orow; ++e) mis += o1[size_t(e)] != out_ref[size_t(t * orow + e)];
      mis += byte_mismatches(p1, pool_ref, sl * se, size_t(se));
      EXPECT_TRUE(contract_exact("gdn_decode_live.one_row_eq_batch_row", shape + ",row=" + std::to_string(t), mis));
    }
    // The first two live rows against the CPU.
    for (int t = 0; t < std::min(L, 2); ++t) {
      std::vector<float> sref = slice(pool0, size_t(slots[size_t(t)] * se), size_t(se)), oref(static_cast<size_t>(orow));
      P.reference(t, 1, sref.data(), oref.data());
      const auto o = slice(out_ref, size_t(t * orow), size_t(orow));
      EXPECT_TRUE(contract("gdn_decode_live.out_vs_cpu", shape + ",row=" + std::to_string(t),
                           rel_err(from_bf16(o), oref), kTolBf16));
      EXPECT_TRUE(contract("gdn_decode_live.state_vs_cpu", shape + ",row=" + std::to_string(t),
                           rel_err(slice(pool_ref, size_t(slots[size_t(t)] * se), size_t(se)), sref), kTolState));
    }
  }
}

}  // namespace
}  // namespace gdn_test

using namespace gdn_test;  // NOLINT(google-build-using-namespace): the helpers above

TEST(GdnDecode, BatchesSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (int b : {1, 17}) decode_case(kSmall, b, 601 + uint64_t(b));
}

TEST(GdnDecode, Batches) {
  MOEFOLD_REQUIRE_GPU();
  for (int b : {1, 17, 64}) {
    decode_case(kSmall, b, 611 + uint64_t(b));
    decode_case(kReal, b, 621 + uint64_t(b));
  }
}

// Bucket 16 at 1, 2, 3, 7, 15, 16, 3 and bucket 128 at 1, 9, 33, 64, 113, 114, 127, 128, 2 (the decode
// graphs' buckets replayed at changing live counts), every kernel variant, the 35B shape and small ones.
TEST(GdnDecode, LiveCountsAllVariantsSmall) {
  MOEFOLD_REQUIRE_GPU();
  decode_live_case(kSmall, 16, {1, 2, 3, 7, 15, 16, 3}, 641);
  decode_live_case(GdnDims{2, 4, 32, 16}, 5, {5, 1}, 643);
}
TEST(GdnDecode, LiveCountsAllVariants) {
  MOEFOLD_REQUIRE_GPU();
  decode_live_case(kReal, 16, {1, 2, 3, 7, 15, 16, 3}, 651);
  // Bucket 128 with the 35B head sizes but 4 value heads (the grid's head axis does not change the paths;
  // the pool stays small enough to compare on the host).
  decode_live_case(GdnDims{2, 4, 128, 128}, 128, {1, 9, 33, 64, 113, 114, 127, 128, 2}, 652);
  decode_live_case(GdnDims{1, 2, 256, 64}, 7, {7, 2}, 653);  // dk 256: 32 rows a warp
  decode_live_case(GdnDims{2, 4, 128, 64}, 9, {9, 4}, 654);  // dv 64: 4 columns a lane do not fit
}

TEST(GdnArgs, RejectsBadShapes) {
  // Host-side argument checks run before any CUDA call: no GPU needed.
  GdnArgs a{};
  EXPECT_THROW(moefold::cuda::gdn_recurrent_decode(a, 1, kSmall, nullptr), moefold::Error);
  EXPECT_THROW(moefold::cuda::causal_conv1d_silu_decode(nullptr, nullptr, nullptr, nullptr, 1, nullptr, nullptr, 8, 4,
                                                        nullptr),
               moefold::Error);
}
