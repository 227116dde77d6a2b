// moe_test: the small-batch GEMV path (MoeGemv.*) and the batch-invariant decode path (MoeStream.*):
// CUDA graphs replayed at changing live counts.
#include "cuda/moe_test/moe_test_util.h"

namespace moefold::cuda::moe_test {
namespace {

// ---- small-batch GEMV path: graph replays at changing live counts ---------------------------------------
// The routing of the live rows: the router's top-k, or a replay naming only expert 0 / only expert E-1
// in every slot (k pairs of a row on one expert: with k > 8 or several rows, several 8-pair tiles).
enum class Routing { kTopk, kExpert0, kExpertLast };
const char* routing_name(Routing r) { return r == Routing::kTopk ? "topk" : (r == Routing::kExpert0 ? "expert0" : "expertLast"); }

/// Inputs of up to `rows` live rows (bf16 bits and their fp32 values) and their replayed experts.
struct SmallInputs {
  std::vector<uint16_t> xh, shh, resh;
  std::vector<float> xf, shf, resf;
  std::vector<int32_t> replay;  // [rows, k]; empty for top-k routing
};
SmallInputs small_inputs(const MoeWeights& w, int k, int rows, Routing routing, uint64_t seed) {
  SmallInputs in;
  rand_bf16(size_t(rows) * w.H, seed, 1.0f, in.xh, &in.xf);
  rand_bf16(size_t(rows) * w.H, seed + 1, 0.5f, in.shh, &in.shf);
  rand_bf16(size_t(rows) * w.H, seed + 2, 1.0f, in.resh, &in.resf);
  if (routing != Routing::kTopk) in.replay.assign(size_t(rows) * k, routing == Routing::kExpert0 ? 0 : w.E - 1);
  return in;
}

/// Device buffers and a bound workspace of one capacity; `run` launches the chain (eager, or captured).
struct SmallChain {
  const MoeWeights& w;
  int k, cap;
  MoeShape shape;
  DevBuf x, sh, res, out, rows, replay, ws_mem;
  MoeWorkspace ws;
  SmallChain(const MoeWeights& w_, int k_, int cap_, bool invariant = false)
      : w(w_), k(k_), cap(cap_), shape{cap_, w_.E, k_, w_.H, w_.I, -1, invariant}, x(size_t(cap_) * w_.H * 2),
        sh(size_t(cap_) * w_.H * 2), res(size_t(cap_) * w_.H * 2), out(size_t(cap_) * w_.H * 2), rows(4),
        replay(size_t(cap_) * k_ * 4), ws_mem(moe_workspace_bytes(shape)) {
    ws = moe_workspace_bind(ws_mem.p, ws_mem.bytes, shape);
  }
  void run(bool with_replay, cudaStream_t st) {
    moe_forward(x.as<__nv_bfloat16>(), w.d_router.as<__nv_bfloat16>(), w.d_gate_up.as<__nv_bfloat16>(),
                w.d_down.as<__nv_bfloat16>(), sh.as<__nv_bfloat16>(), w.d_shared_gate.as<__nv_bfloat16>(),
                res.as<__nv_bfloat16>(), rows.as<int32_t>(), shape, true, ws, out.as<__nv_bfloat16>(), st,
                with_replay ? replay.as<int32_t>() : nullptr);
  }
  /// Live rows [0, L) from `in` (rows first .. first + L - 1 of it); padding rows poisoned with `garbage`
  /// bf16 bits, stale ids and replay entries naming real experts; workspace and out poisoned (0xFF).
  void prepare(const SmallInputs& in, int first, int L, uint16_t garbage) {
    const int H = w.H, E = w.E;
    std::vector<uint16_t> hx(size_t(cap) * H, garbage), hs(hx), hr(hx);
    std::copy_n(in.xh.begin() + size_t(first) * H, size_t(L) * H, hx.begin());
    std::copy_n(in.shh.begin() + size_t(first) * H, size_t(L) * H, hs.begin());
    std::copy_n(in.resh.begin() + size_t(first) * H, size_t(L) * H, hr.begin());
    upload(x.p, hx), upload(sh.p, hs), upload(res.p, hr);
    MOEFOLD_CUDA_CHECK(cudaMemset(ws_mem.p, 0xFF, ws_mem.bytes));
    MOEFOLD_CUDA_CHECK(cudaMemset(out.p, 0xFF, out.bytes));
    const std::vector<int32_t> st = stale(L);
    if (!st.empty()) MOEFOLD_CUDA_CHECK(cudaMemcpy(ws.ids + size_t(L) * k, st.data(), st.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> rp(size_t(cap) * k);
    for (size_t i = 0; i < rp.size(); ++i)
      rp[i] = i < size_t(L) * k && !in.replay.empty() ? in.replay[size_t(first) * k + i] : int32_t((i * 5 + 1) % size_t(E));
    upload(replay.p, rp);
    upload(rows.p, std::vector<int32_t>{L});
  }
  std::vector<int32_t> stale(int L) const {
    std::vector<int32_t> st(size_t(cap - L) * k);
    for (size_t i = 0; i < st.size(); ++i) st[i] = int32_t((i * 7 + 3) % size_t(w.E));
    return st;
  }
};

/// One row run alone (capacity 1, its own workspace): out bits, ids and weights of row `t` of `in`.
struct RowResult {
  std::vector<uint16_t> out;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
RowResult run_one_row(const MoeWeights& w, int k, const SmallInputs& in, int t, bool invariant = false) {
  SmallChain c(w, k, 1, invariant);
  c.prepare(in, t, 1, 0x7FC0);
  c.run(!in.replay.empty(), nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  return RowResult{download<uint16_t>(c.out.p, size_t(w.H)), download<int32_t>(c.ws.ids, size_t(k)),
                   download<float>(c.ws.weights, size_t(k))};
}

/// The GEMV-path contract at capacity `cap`: the chain captured once in a graph, replayed at each live
/// count of `lives` (padding poisoned NaN / +huge / -huge in turn). Checks per replay: exactly the live
/// pairs planned (= cpu::moe_plan of the live ids; the replayed experts when replaying), no padding
/// output / logit / id / weight / act / y row written, every live row bit-equal to its one-row run
/// (`alone`, computed at capacity 1), and the output vs the CPU reference.
void check_gemv_replays(const MoeWeights& w, int k, int cap, const std::vector<int>& lives, const SmallInputs& in,
                        const std::vector<RowResult>& alone, Routing routing, bool invariant = false,
                        int cpu_rows = 1 << 30) {
  const int E = w.E, H = w.H, I = w.I;
  SmallChain c(w, k, cap, invariant);
  if (!invariant) ASSERT_EQ(moe_expert_config(c.shape), kMoeExpertGemv);
  if (invariant) ASSERT_NE(moe_expert_config(c.shape), kMoeExpertGemv);
  if (invariant && cap <= kMoeStreamMaxRows) ASSERT_EQ(moe_expert_config(c.shape), kMoeExpertStream);
  const bool with_replay = routing != Routing::kTopk;
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreate(&st));
  c.prepare(in, 0, cap, 0x7FC0);  // eager warm-up (kernel attributes) before the capture
  c.run(with_replay, st);
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  c.run(with_replay, st);
  MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  const uint16_t garbage[3] = {0x7FC0 /*NaN*/, 0x7F7F /*+3.4e38*/, 0xFF7F /*-3.4e38*/};
  for (size_t i = 0; i < lives.size(); ++i) {
    const int L = lives[i];
    const size_t LP = size_t(L) * k, P = size_t(cap) * k;
    c.prepare(in, 0, L, garbage[i % 3]);
    MOEFOLD_CUDA_CHECK(cudaGraphLaunch(exec, st));
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
    char shp[160];
    std::snprintf(shp, sizeof shp, "E=%d,k=%d,H=%d,I=%d,cap=%d,live=%d,%s,experts=%d", E, k, H, I, cap, L,
                  routing_name(routing), moe_expert_config(c.shape));

    // Plan: exactly the live pairs.
    const auto ids = download<int32_t>(c.ws.ids, LP);
    const auto wts = download<float>(c.ws.weights, LP);
    const auto offsets = download<int32_t>(c.ws.offsets, size_t(E) + 1);
    const auto counts = download<int32_t>(c.ws.counts, size_t(E));
    const auto pairs = download<int32_t>(c.ws.pairs, LP);
    const cpu::MoePlan pref = cpu::moe_plan(ids.data(), L, k, E);
    size_t plan_mis = (offsets != pref.offsets) + (pairs != pref.pairs);
    for (int e = 0; e < E; ++e) plan_mis += counts[size_t(e)] != pref.offsets[size_t(e + 1)] - pref.offsets[size_t(e)];
    if (with_replay)
      for (size_t j = 0; j < LP; ++j) plan_mis += ids[j] != in.replay[j];
    EXPECT_EQ(offsets[size_t(E)], L * k) << shp;
    EXPECT_TRUE(contract_exact("moe_gemv_replay_plan", shp, plan_mis));

    // Padding: nothing written (bytes still 0xFF, stale ids intact).
    size_t pad = count_unpoisoned(c.out.as<uint16_t>() + size_t(L) * H, size_t(cap - L) * H * 2) +
                 count_unpoisoned(c.ws.logits + size_t(L) * E, size_t(cap - L) * E * 4) +
                 count_unpoisoned(c.ws.weights + LP, (P - LP) * 4) +
                 count_unpoisoned(c.ws.act + LP * I, (P - LP) * size_t(I) * 2) +
                 count_unpoisoned(c.ws.y + LP * H, (P - LP) * size_t(H) * 2);
    if (P > LP) pad += download<int32_t>(c.ws.ids + LP, P - LP) != c.stale(L);
    EXPECT_TRUE(contract_exact("moe_gemv_replay_padding_untouched", shp, pad));

    // Live rows: bit-equal to the row alone; vs the CPU reference.
    const auto out = download<uint16_t>(c.out.p, size_t(L) * H);
    size_t mis = 0;
    for (int t = 0; t < L; ++t) {
      const RowResult& a = alone[size_t(t)];
      for (int h = 0; h < H; ++h) mis += out[size_t(t) * H + h] != a.out[size_t(h)];
      for (int s = 0; s < k; ++s)
        mis += ids[size_t(t) * k + s] != a.ids[size_t(s)] || std::memcmp(&wts[size_t(t) * k + s], &a.weights[size_t(s)], 4);
    }
    EXPECT_TRUE(contract_exact("moe_gemv_replay_eq_one_row", shp, mis));
    const int LC = std::min(L, cpu_rows);  // rows checked against the CPU (it is slow at the 35B shape)
    const std::vector<float> x_live(in.xf.begin(), in.xf.begin() + ptrdiff_t(LC) * H),
        sh_live(in.shf.begin(), in.shf.begin() + ptrdiff_t(LC) * H), res_live(in.resf.begin(), in.resf.begin() + ptrdiff_t(LC) * H);
    const std::vector<float> ref = reference_rows(w, k, LC, x_live, sh_live, res_live, ids.data(), wts.data());
    const std::vector<uint16_t> out_c(out.begin(), out.begin() + ptrdiff_t(LC) * H);
    EXPECT_TRUE(contract("moe_gemv_replay_vs_cpu", shp, rel_err(from_bf16(out_c), ref), 1e-2));
  }
  MOEFOLD_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MOEFOLD_CUDA_CHECK(cudaGraphDestroy(graph));
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

/// The bucket-16 sequence (and other capacities when `caps` has more) for one shape and routing.
void check_gemv_shape(const MoeWeights& w, int k, Routing routing, uint64_t seed,
                      const std::vector<std::pair<int, std::vector<int>>>& caps, bool invariant = false,
                      int cpu_rows = 1 << 30) {
  int rows = 0;
  for (const auto& c : caps) rows = std::max(rows, c.first);
  const SmallInputs in = small_inputs(w, k, rows, routing, seed);
  std::vector<RowResult> alone;
  for (int t = 0; t < rows; ++t) alone.push_back(run_one_row(w, k, in, t, invariant));
  for (const auto& [cap, lives] : caps) check_gemv_replays(w, k, cap, lives, in, alone, routing, invariant, cpu_rows);
}

const std::vector<int> kBucket16Lives = {1, 2, 3, 7, 15, 16, 3};

MoeWeights& fixture_weights(int E) {  // the fixtures' MoE shape (hidden 128, intermediate 64)
  static std::unique_ptr<MoeWeights> w8 = make_weights(8, 2, 128, 64, 3100), w64 = make_weights(64, 8, 128, 64, 3200),
                                     w256 = make_weights(256, 8, 128, 64, 3300);
  return E == 8 ? *w8 : (E == 64 ? *w64 : *w256);
}

// For compute-sanitizer: one fixture shape, one mid shape with multi-tile experts.
TEST(MoeGemv, SmallGraphReplay) {
  MOEFOLD_REQUIRE_GPU();
  check_gemv_shape(fixture_weights(8), 2, Routing::kTopk, 4000, {{16, {1, 3, 16, 2}}});
  static std::unique_ptr<MoeWeights> w = make_weights(64, 8, 256, 128, 3400);
  check_gemv_shape(*w, 8, Routing::kExpert0, 4010, {{5, {5, 2}}});
}

// E in {8, 64, 256} x k in {1, 2, 8} at the fixtures' H / I, three routings: bucket 16 at the live
// counts, and capacities 1 .. 16 at live counts up to the capacity (rows bit-equal across capacities).
TEST(MoeGemv, GraphReplayFixtureShapes) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 4100;
  for (int E : {8, 64, 256})
    for (int k : {1, 2, 8})
      for (Routing r : {Routing::kTopk, Routing::kExpert0, Routing::kExpertLast})
        check_gemv_shape(fixture_weights(E), k, r, ++seed,
                         {{16, kBucket16Lives}, {1, {1}}, {2, {1, 2}}, {3, {2}}, {8, {8, 5, 1}}, {13, {12}}});
  static std::unique_ptr<MoeWeights> w = make_weights(64, 8, 256, 128, 3400);
  for (int cap : {4, 9, 16}) check_gemv_shape(*w, 8, Routing::kTopk, ++seed, {{cap, {cap, cap - 1, 1}}});
}

// The Qwen3.6-35B-A3B layer shape (E 256, H 2048, I 512) at k 8, 2, 1.
TEST(MoeGemv, GraphReplay35BShape) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = real_weights();
  uint64_t seed = 4200;
  for (Routing r : {Routing::kTopk, Routing::kExpert0, Routing::kExpertLast})
    check_gemv_shape(w, 8, r, ++seed, {{16, kBucket16Lives}, {4, {4, 1}}});
  for (int k : {1, 2}) check_gemv_shape(w, k, Routing::kTopk, ++seed, {{16, kBucket16Lives}});
}

// The GEMV forced at a capacity above 16 (experts with more than 8 pairs: several 8-pair tiles each)
// against the CPU and the padding contract.
TEST(MoeGemv, ForcedAtLargerCapacity) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = fixture_weights(8);
  std::vector<uint16_t> xh, shh, resh;
  std::vector<float> xf, shf, resf;
  const int T = 40, cap = 45;
  rand_bf16(size_t(T) * w.H, 4300, 1.0f, xh, &xf);
  rand_bf16(size_t(T) * w.H, 4301, 0.5f, shh, &shf);
  ChainRun g = run_chain(w, T, cap, xh, shh, resh, kMoeExpertGemv);
  const std::vector<float> ref = reference_rows(w, w.k, T, xf, shf, resf, g.ids.data(), g.weights.data());
  const std::string shp = shape_str(w.E, w.k, w.H, w.I, T, cap) + ",forced_gemv";
  EXPECT_EQ(g.offsets[size_t(w.E)], T * w.k);
  EXPECT_TRUE(contract("moe_gemv_forced", shp, rel_err(from_bf16(g.out), ref), 1e-2));
  EXPECT_TRUE(contract_exact("moe_gemv_forced_padding", shp,
                             g.pad_out_bytes_written + g.pad_logits + g.pad_ids + g.pad_weights + g.pad_act + g.pad_y));
}

// ---- batch-invariant decode path (streaming kernels at capacity 1, tiles above) ------------------------
// The same graph-replay contract with batch_invariant: the one-row runs (capacity 1: the streaming
// kernels) must equal the rows of bucket 16 and of bucket 128 (16-row tiles; the wide plan at 128) bit
// for bit, at the live counts, with the padding poisoned.
const std::vector<int> kBucket128Lives = {1, 9, 33, 64, 113, 114, 127, 128, 2};

// For compute-sanitizer (memcheck / racecheck): the streaming kernels forced, one and several plan tiles
// per expert, with and without the early start of down.
TEST(MoeStream, SanitizeSmall) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  for (bool early : {true, false}) {
    moe_detail::set_stream_early_down(early);
    for (int T : {3, 40}) {
      std::vector<uint16_t> xh, shh, none;
      std::vector<float> xf, shf, resf;
      rand_bf16(size_t(T) * w.H, 950 + T, 1.0f, xh, &xf);
      rand_bf16(size_t(T) * w.H, 951 + T, 0.5f, shh, &shf);
      ChainRun g = run_chain(w, T, T + 2, xh, shh, none, kMoeExpertStream);
      const std::vector<float> ref = reference_rows(w, w.k, T, xf, shf, resf, g.ids.data(), g.weights.data());
      const std::string shp = shape_str(w.E, w.k, w.H, w.I, T, T + 2) + (early ? ",early_down" : ",late_down");
      EXPECT_TRUE(contract("moe_stream_forced", shp, rel_err(from_bf16(g.out), ref), 1e-2));
      EXPECT_TRUE(contract_exact("moe_stream_forced_padding", shp,
                                 g.pad_out_bytes_written + g.pad_logits + g.pad_ids + g.pad_weights + g.pad_act + g.pad_y));
    }
  }
  moe_detail::set_stream_early_down(true);
}

TEST(MoeStream, GraphReplayFixtureShapes) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 5100;
  for (int E : {8, 64, 256})
    for (int k : {1, 2, 8})
      for (Routing r : {Routing::kTopk, Routing::kExpert0, Routing::kExpertLast})
        check_gemv_shape(fixture_weights(E), k, r, ++seed, {{16, kBucket16Lives}, {128, kBucket128Lives}, {3, {2}}},
                         true);
}

TEST(MoeStream, GraphReplay35BShape) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = real_weights();
  uint64_t seed = 5200;
  for (Routing r : {Routing::kTopk, Routing::kExpert0, Routing::kExpertLast})
    check_gemv_shape(w, 8, r, ++seed, {{16, kBucket16Lives}, {128, kBucket128Lives}}, true, 3);
  check_gemv_shape(w, 1, Routing::kTopk, ++seed, {{16, kBucket16Lives}}, true, 3);
}

}  // namespace
}  // namespace moefold::cuda::moe_test
