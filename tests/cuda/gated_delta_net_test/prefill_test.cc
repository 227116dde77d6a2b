// gated_delta_net_test: the chunked delta-rule prefill (scalar and tensor-core paths, every variant,
// splits, snapshots, chunked == recurrent) against the CPU recurrence.
#include "cuda/gated_delta_net_test/gdn_test_util.h"

namespace gdn_test {
namespace {

// Chunked prefill of several sequences in one launch (capacity lens+2 sequences, rows+5 rows), random
// initial states in distinct non-identity slots, against the CPU recurrence per sequence.
void prefill_case(const GdnDims& d, const std::vector<int>& lens, uint64_t seed) {
  const int S = int(lens.size()), cap = S + 2;
  const auto cu = cu_of(lens);
  const int rows = cu[size_t(S)], cap_rows = rows + 5;
  const Problem P(d, cap_rows, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  const int nslots = 2 * cap + 1;
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = nslots - 1 - 2 * s;
  const auto pool0 = make_pool(nslots, se, slice(slots, 0, size_t(S)), seed + 5);

  DevProblem dp(P);
  Dev<float> dpool(pool0);
  Dev<uint16_t> dout(size_t(cap_rows * orow));
  Dev<int32_t> dcu(cu_padded(lens, cap, cap_rows)), dslots(slots), dns(std::vector<int32_t>{S});
  dout.poison();
  moefold::cuda::gdn_chunked_prefill(dp.args(0, dpool.p, dslots.p, dns.p, dout.p), dcu.p, cap, nullptr, nullptr, 0, d,
                                     nullptr);
  const auto out = dout.down();
  const auto pool = dpool.down();

  std::vector<float> oref(size_t(rows * orow)), pref = pool0;
  for (int s = 0; s < S; ++s)
    P.reference(cu[size_t(s)], lens[size_t(s)], pref.data() + slots[size_t(s)] * se,
                oref.data() + cu[size_t(s)] * orow);
  std::vector<float> st_gpu, st_ref;
  for (int s = 0; s < S; ++s) {
    const auto a = slice(pool, size_t(slots[size_t(s)] * se), size_t(se));
    const auto b = slice(pref, size_t(slots[size_t(s)] * se), size_t(se));
    st_gpu.insert(st_gpu.end(), a.begin(), a.end());
    st_ref.insert(st_ref.end(), b.begin(), b.end());
  }
  size_t pad_slots = 0;
  for (int s = 0; s < nslots; ++s)
    if (std::find(slots.begin(), slots.begin() + S, s) == slots.begin() + S)
      pad_slots += byte_mismatches(pool, pool0, size_t(s * se), size_t(se));
  const std::string shape = dims_str(d) + ",lens=" + lens_str(lens) + ",cap_seqs=" + std::to_string(cap);
  EXPECT_TRUE(contract("gdn_prefill.out", shape, rel_err(from_bf16(slice(out, 0, size_t(rows * orow))), oref), kTolBf16));
  EXPECT_TRUE(contract("gdn_prefill.state", shape, rel_err(st_gpu, st_ref), kTolState));
  EXPECT_TRUE(contract_exact("gdn_prefill.padding", shape,
                             pad_slots + unpoisoned(out, size_t(rows * orow), size_t((cap_rows - rows) * orow))));
  // Unpadded run (capacity = live) gives the same bytes.
  Dev<float> dpool2(pool0);
  Dev<uint16_t> dout2(size_t(rows * orow));
  Dev<int32_t> dcu2(cu);
  dout2.poison();
  moefold::cuda::gdn_chunked_prefill(dp.args(0, dpool2.p, dslots.p, dns.p, dout2.p), dcu2.p, S, nullptr, nullptr, 0,
                                     d, nullptr);
  EXPECT_TRUE(contract_exact("gdn_prefill.unpadded_equal", shape,
                             byte_mismatches(out, dout2.down(), 0, size_t(rows * orow)) +
                                 byte_mismatches(pool, dpool2.down(), 0, pool.size())));
}

// GPU chunked prefill of T tokens == the GPU recurrent decode step run T times.
void chunked_vs_recurrent_case(const GdnDims& d, int T, uint64_t seed) {
  const Problem P(d, T, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  const std::vector<int32_t> slot0{0};
  const auto pool0 = make_pool(1, se, slot0, seed + 5);
  DevProblem dp(P);
  Dev<float> dpa(pool0), dpb(pool0);
  Dev<uint16_t> oa(size_t(T * orow)), ob(size_t(T * orow));
  Dev<int32_t> dcu(std::vector<int32_t>{0, T}), dslots(slot0), dns(std::vector<int32_t>{1});
  oa.poison();
  ob.poison();
  moefold::cuda::gdn_chunked_prefill(dp.args(0, dpa.p, dslots.p, dns.p, oa.p), dcu.p, 1, nullptr, nullptr, 0, d,
                                     nullptr);
  for (int t = 0; t < T; ++t)
    moefold::cuda::gdn_recurrent_decode(dp.args(t, dpb.p, dslots.p, dns.p, ob.p), 1, d, nullptr);
  const std::string shape = dims_str(d) + ",T=" + std::to_string(T);
  EXPECT_TRUE(contract("gdn_chunked_vs_steps.out", shape, rel_err(from_bf16(oa.down()), from_bf16(ob.down())), kTolBf16));
  EXPECT_TRUE(contract("gdn_chunked_vs_steps.state", shape, rel_err(dpa.down(), dpb.down()), kTolState));
}

// Conv + delta rule over T tokens in one launch == two launches split at n (conv and delta state carried).
void split_case(const GdnDims& d, int T, int n, uint64_t seed) {
  const Problem P(d, T, seed);  // P.qkv: raw (pre-conv) projections here
  const int64_t C = P.stride, se = P.state_elems(), orow = P.out_row(), ce = C * (kConvK - 1);
  const auto w = round_bf16(moefold::test::randn(size_t(C) * kConvK, seed + 7, 0.5f));
  const std::vector<int32_t> slot0{0};
  const auto pool0 = make_pool(1, se, slot0, seed + 5);
  const auto conv0 = to_bf16(moefold::test::randn(size_t(ce), seed + 6));
  DevProblem dp(P);
  Dev<uint16_t> dw(to_bf16(w));
  Dev<int32_t> dslots(slot0), dns(std::vector<int32_t>{1});
  auto run = [&](const std::vector<int>& parts, std::vector<uint16_t>& y, std::vector<uint16_t>& out,
                 std::vector<float>& state, std::vector<uint16_t>& conv) {
    Dev<float> dpool(pool0);
    Dev<uint16_t> dconv(conv0), dy(size_t(T * C)), dout(size_t(T * orow));
    dy.poison();
    dout.poison();
    int r0 = 0;
    for (int len : parts) {
      Dev<int32_t> dcu(std::vector<int32_t>{0, len});
      moefold::cuda::causal_conv1d_silu_prefill(dp.qkv.bf() + r0 * C, dw.bf(), dcu.p, dslots.p, dns.p, len, dconv.bf(),
                                                dy.bf() + r0 * C, int(C), kConvK, nullptr);
      moefold::cuda::gdn_chunked_prefill(dp.args(r0, dpool.p, dslots.p, dns.p, dout.p, dy.p), dcu.p, 1, nullptr,
                                         nullptr, 0, d, nullptr);
      r0 += len;
    }
    y = dy.down();
    out = dout.down();
    state = dpool.down();
    conv = dconv.down();
  };
  std::vector<uint16_t> y1, o1, c1, y2, o2, c2;
  std::vector<float> s1, s2;
  run({T}, y1, o1, s1, c1);
  run({n, T - n}, y2, o2, s2, c2);
  const std::string shape = dims_str(d) + ",T=" + std::to_string(T) + ",split=" + std::to_string(n);
  EXPECT_TRUE(contract_exact("gdn_split.conv_y+conv_state", shape,
                             byte_mismatches(y1, y2, 0, y1.size()) + byte_mismatches(c1, c2, 0, c1.size())));
  EXPECT_TRUE(contract("gdn_split.out", shape, rel_err(from_bf16(o2), from_bf16(o1)), kTolBf16));
  EXPECT_TRUE(contract("gdn_split.state", shape, rel_err(s2, s1), kTolState));
  // The whole pipeline against the CPU (conv, then the recurrence on the bf16 conv output).
  std::vector<float> yref(size_t(T * C)), cst = from_bf16(conv0), sref = pool0, oref(size_t(T * orow));
  moefold::cpu::causal_conv1d_silu(P.qkv.data(), w.data(), cst.data(), yref.data(), T, C, kConvK);
  EXPECT_TRUE(contract("gdn_split.conv_y_vs_cpu", shape, rel_err(from_bf16(y1), yref), kTolBf16));
  const auto ygpu = from_bf16(y1);
  P.reference(0, T, sref.data(), oref.data(), &ygpu);
  EXPECT_TRUE(contract("gdn_split.out_vs_cpu", shape, rel_err(from_bf16(o1), oref), kTolBf16));
  EXPECT_TRUE(contract("gdn_split.state_vs_cpu", shape, rel_err(s1, sref), kTolState));
}

// Snapshots at chunk boundaries of two sequences in one launch == CPU state of a prefill stopped there,
// and == a GPU prefill stopped there. Entries for padding sequences, chunks past the end and entries past
// the live snapshot count are ignored (their destination slots stay poisoned).
void snapshot_case(const GdnDims& d, int len0, int len1, uint64_t seed) {
  const std::vector<int> lens{len0, len1};
  const int S = 2, cap = 3, rows = len0 + len1;
  const Problem P(d, rows + 4, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  const std::vector<int32_t> slots{1, 0, 2};  // seq 2 is padding
  const auto pool0 = make_pool(12, se, {1, 0}, seed + 5);
  const int last0 = (len0 - 1) / 64, last1 = (len1 - 1) / 64;
  // {seq, chunk, dst}: live entries first, then ones that must be ignored.
  const std::vector<GdnSnapshot> snaps{{0, 0, 3},        {0, last0 > 1 ? 2 : last0, 4}, {0, last0, 5},
                                       {1, 1 <= last1 ? 1 : 0, 6}, {1, last1 + 1, 7},  {2, 0, 8},
                                       {0, 1, 9}};
  const int live_snaps = 6;
  DevProblem dp(P);
  Dev<float> dpool(pool0);
  Dev<uint16_t> dout(size_t((rows + 4) * orow));
  Dev<int32_t> dcu(cu_padded(lens, cap, rows + 4)), dslots(slots), dns(std::vector<int32_t>{S}),
      dnsnap(std::vector<int32_t>{live_snaps});
  Dev<GdnSnapshot> dsnaps(snaps);
  dout.poison();
  moefold::cuda::gdn_chunked_prefill(dp.args(0, dpool.p, dslots.p, dns.p, dout.p), dcu.p, cap, dsnaps.p, dnsnap.p,
                                     int(snaps.size()), d, nullptr);
  const auto pool = dpool.down();
  const auto cu = cu_of(lens);
  for (int e = 0; e < live_snaps - 2; ++e) {  // the first four entries are valid
    const GdnSnapshot sn = snaps[size_t(e)];
    const int n = std::min(64 * (sn.chunk + 1), lens[size_t(sn.seq)]);
    std::vector<float> sref = slice(pool0, size_t(slots[size_t(sn.seq)] * se), size_t(se)), oref(size_t(n * orow));
    P.reference(cu[size_t(sn.seq)], n, sref.data(), oref.data());
    const std::string shape = dims_str(d) + ",lens=" + lens_str(lens) + ",seq=" + std::to_string(sn.seq) +
                              ",chunk=" + std::to_string(sn.chunk) + ",tokens=" + std::to_string(n);
    const auto got = slice(pool, size_t(sn.dst_slot * se), size_t(se));
    EXPECT_TRUE(contract("gdn_snapshot.vs_cpu", shape, rel_err(got, sref), kTolState));
    // GPU prefill of only those n tokens.
    Dev<float> dp2(pool0);
    Dev<uint16_t> do2(size_t(n * orow));
    Dev<int32_t> dcu2(std::vector<int32_t>{0, n}), ds2(std::vector<int32_t>{slots[size_t(sn.seq)]}),
        dn2(std::vector<int32_t>{1});
    moefold::cuda::gdn_chunked_prefill(dp.args(cu[size_t(sn.seq)], dp2.p, ds2.p, dn2.p, do2.p, nullptr, false), dcu2.p, 1, nullptr,
                                       nullptr, 0, d, nullptr);
    const auto pool2 = dp2.down();
    EXPECT_TRUE(contract("gdn_snapshot.vs_gpu_prefix", shape,
                         rel_err(got, slice(pool2, size_t(slots[size_t(sn.seq)] * se), size_t(se))), kTolState));
  }
  size_t untouched = 0;
  for (int s : {2, 7, 8, 9, 10, 11}) untouched += byte_mismatches(pool, pool0, size_t(s * se), size_t(se));
  EXPECT_TRUE(contract_exact("gdn_snapshot.ignored_entries", dims_str(d) + ",lens=" + lens_str(lens), untouched));
}


}  // namespace
}  // namespace gdn_test

using namespace gdn_test;  // NOLINT(google-build-using-namespace): the helpers above

TEST(GdnPrefill, BatchSmall) {
  MOEFOLD_REQUIRE_GPU();
  prefill_case(kSmall, {65, 1, 0, 17, 130, 64, 3}, 201);
}

TEST(GdnPrefill, SingleSequenceLengths) {
  MOEFOLD_REQUIRE_GPU();
  for (int T : kLens) prefill_case(kSmall, {T}, 211 + uint64_t(T));
  for (int T : {1, 64, 65, 1000}) prefill_case(kReal, {T}, 221 + uint64_t(T));
}

TEST(GdnPrefill, BatchAllLengths) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<int> lens = kLens;
  lens.insert(lens.begin() + 3, 0);
  prefill_case(kSmall, lens, 231);
  prefill_case(kReal, lens, 241);
}

TEST(GdnPrefill, ChunkedEqualsRecurrentSmall) {
  MOEFOLD_REQUIRE_GPU();
  chunked_vs_recurrent_case(kSmall, 130, 301);
}

TEST(GdnPrefill, ChunkedEqualsRecurrent) {
  MOEFOLD_REQUIRE_GPU();
  chunked_vs_recurrent_case(kSmall, 1000, 311);
  chunked_vs_recurrent_case(kReal, 200, 321);
}

TEST(GdnPrefill, SplitEqualsWholeSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (int n : {1, 64, 65}) split_case(kSmall, 130, n, 401 + uint64_t(n));
}

TEST(GdnPrefill, SplitEqualsWhole) {
  MOEFOLD_REQUIRE_GPU();
  for (int n : {1, 63, 64, 65}) {
    split_case(kSmall, 200, n, 411 + uint64_t(n));
    split_case(kReal, 200, n, 421 + uint64_t(n));
  }
}

TEST(GdnPrefill, SnapshotsSmall) {
  MOEFOLD_REQUIRE_GPU();
  snapshot_case(kSmall, 200, 130, 501);
}

TEST(GdnPrefill, Snapshots) {
  MOEFOLD_REQUIRE_GPU();
  snapshot_case(kSmall, 1000, 65, 511);
  snapshot_case(kReal, 200, 130, 521);
}

// The tensor-core prefill path (dk 128; the split chunk kernel + state pass, as args.max_rows is set) on a
// small shape: batches with 0/1-token sequences, a split, snapshots and chunked == recurrent (the
// compute-sanitizer pass of those kernels).
TEST(GdnPrefill, TensorCoreSmall) {
  MOEFOLD_REQUIRE_GPU();
  prefill_case(kTc, {65, 1, 0, 17, 130, 64, 3}, 251);
  split_case(kTc, 130, 65, 451);
  snapshot_case(kTc, 200, 130, 551);
  chunked_vs_recurrent_case(kTc, 130, 331);
}


// Every variant of the tensor-core prefill (the split path and the fused kernel, each with 16 or 32 value
// columns per block and one or two input stages; the fused one's long k loops rolled or unrolled; the
// launcher picks by shape, env variables force): same contract. dv = 16 takes the 16-column blocks by itself.
TEST(GdnPrefill, TensorCoreVariantsSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (const char* split : {"1", "0"})
    for (const char* bv : {"16", "32"})
      for (const char* st : {"1", "2"}) {
        ScopedEnv e0("MOEFOLD_GDN_TC_SPLIT", split), e1("MOEFOLD_GDN_TC_BV", bv), e2("MOEFOLD_GDN_TC_STAGES", st);
        prefill_case(kTc, {65, 1, 0, 130}, 281);
      }
  {
    ScopedEnv e0("MOEFOLD_GDN_TC_SPLIT", "0"), e("MOEFOLD_GDN_TC_UNROLL", "1");  // the rolled 32-column variant
    prefill_case(kTc, {65, 1, 0, 130}, 285);
  }
  {
    ScopedEnv e("MOEFOLD_GDN_TC_CHUNK_BLOCKS", "3");  // the chunk kernel's 3-blocks-per-SM register budget
    prefill_case(kTc, {65, 1, 0, 130}, 287);
  }
  {
    ScopedEnv e("MOEFOLD_GDN_TC_GROUP", "1");  // one value head per chunk-kernel block
    prefill_case(GdnDims{1, 2, 128, 32}, {65, 1, 0, 130}, 289);
  }
  prefill_case(GdnDims{1, 2, 128, 16}, {65, 1, 0, 130}, 291);
  chunked_vs_recurrent_case(GdnDims{1, 2, 128, 48}, 130, 341);
}

// The split path in windows of 1 and 3 global chunks (chunk kernel + state pass per window, the state
// carried through its slot, snapshots taken in later windows).
TEST(GdnPrefill, TensorCoreWindowsSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (const char* w : {"1", "3"}) {
    ScopedEnv e("MOEFOLD_GDN_TC_WINDOW", w);
    prefill_case(kTc, {65, 1, 0, 17, 130, 64, 3}, 252);
    snapshot_case(kTc, 200, 130, 552);
  }
}

// The fused tensor-core kernel (the path when the row bound is unknown or the scratch cannot grow): the
// same contract.
TEST(GdnPrefill, TensorCoreFusedSmall) {
  MOEFOLD_REQUIRE_GPU();
  ScopedEnv e("MOEFOLD_GDN_TC_SPLIT", "0");
  prefill_case(kTc, {65, 1, 0, 17, 130, 64, 3}, 253);
  split_case(kTc, 130, 65, 453);
  snapshot_case(kTc, 200, 130, 553);
}

// The scalar prefill kernel stays the path for shapes the tensor-core one does not cover; keep it tested on
// the real shape too.
TEST(GdnPrefill, ScalarKernelReal) {
  MOEFOLD_REQUIRE_GPU();
  ScopedEnv scalar("MOEFOLD_GDN_TC", "0");
  prefill_case(kReal, {65, 1, 0, 130}, 261);
  prefill_case(kTc, {65, 1, 0, 130}, 271);
}

// The fixture shapes: qwen3_5_moe_text has dk 32 != dv 16 (dv below one 32-column value tile), and
// qwen3_5_moe / qwen3_next dk 16, dv 32.
TEST(GdnPrefill, FixtureShapes) {
  MOEFOLD_REQUIRE_GPU();
  for (const GdnDims d : {GdnDims{2, 4, 32, 16}, GdnDims{2, 4, 16, 32}}) {
    prefill_case(d, {1, 2, 63, 65, 130}, 901);
    for (int T : {1, 2, 65}) prefill_case(d, {T}, 911 + uint64_t(T));
    chunked_vs_recurrent_case(d, 130, 921);
    decode_case(d, 3, 931);
  }
}
