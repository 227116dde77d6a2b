// moe_test: the fast router top-k (moe_topk.cuh topk_row_fast), the fast fused small-step route
// (router_topk_plan_fast_kernel) and the one-pass combine (moe_combine_onepass_kernel) against the
// previous kernels, kept callable through moe_detail::set_route_fast / set_combine_fast: the same bytes
// (ids, weights, counts, offsets, pair list, tiles, num_tiles, status, combine output) on random, tied,
// all-negative and NaN/inf logits, replayed and invalid ids, experts 0 and E-1 forced, poisoned outputs
// and padding rows; rows bit-identical at every row count (1, 2, 17, 128, 4100); the combine against the
// CPU. MoeRouterCluster.*: the cluster-fused router logits + top-k + plan (moe_router_route) against the
// two old kernels, the same bytes. MoeRoutePerf.DISABLED_OldVsNew times old vs new (A B B A) at 1, 8, 64,
// 256 and 32768 rows, and the cluster kernel at <= 16 rows.
#include "cuda/moe_test/moe_test_util.h"

namespace moefold::cuda::moe_test {
namespace {

/// Restores the switches to their defaults (fast route and combine on, cluster router off) when a test ends.
struct FastSwitches {
  ~FastSwitches() {
    moe_detail::set_route_fast(true);
    moe_detail::set_route_wide(true);
    moe_detail::set_combine_fast(true);
    moe_detail::set_router_cluster(false);
  }
};

/// fp32 logits of `rows` rows: random, ties, all negative, NaN/inf sprinkled, or a favoured expert 0 /
/// E-1 (by row parity) so the boundary experts are routed.
std::vector<float> logits_of(int kind, int rows, int E, uint64_t seed) {
  std::vector<float> l = test::randn(size_t(rows) * E, seed, 3.0f);
  for (size_t i = 0; i < l.size(); ++i) {
    const size_t e = i % size_t(E), t = i / size_t(E);
    switch (kind) {
      case 1: l[i] = float(int(l[i]) % 3); break;              // many exact ties
      case 2: l[i] = -std::fabs(l[i]) * 20.0f - 0.5f; break;   // all negative
      case 3:
        if (i % 5 == 0) l[i] = NAN;
        if (i % 11 == 2) l[i] = -INFINITY;
        if (t == 1) l[i] = NAN;  // an all-NaN row
        break;
      case 4:
        if (e == (t % 2 ? size_t(E) - 1 : 0)) l[i] = 40.0f;
        if (e == (t % 2 ? 0 : size_t(E) - 1)) l[i] = 39.0f;
        break;
      default: break;
    }
  }
  return l;
}
const char* kind_name(int kind) {
  static const char* n[5] = {"random", "ties", "all_negative", "nan_inf", "experts_0_last"};
  return n[kind];
}

/// Bytes of the route outputs of `w` (ids, weights of the live rows; counts, offsets, live pairs,
/// num_tiles, status, the planned tiles).
std::vector<uint8_t> route_bytes(const MoeWorkspace& w, int E, size_t live_pairs) {
  std::vector<uint8_t> v;
  auto add = [&](const void* p, size_t n) {
    auto h = download<uint8_t>(p, n);
    v.insert(v.end(), h.begin(), h.end());
  };
  add(w.ids, live_pairs * 4), add(w.weights, live_pairs * 4), add(w.counts, size_t(E) * 4);
  add(w.offsets, size_t(E + 1) * 4), add(w.num_tiles, 4), add(w.status, 4);
  const int32_t nt = download<int32_t>(w.num_tiles, 1)[0], np = download<int32_t>(w.offsets + E, 1)[0];
  if (nt >= 0 && nt <= w.max_tiles) add(w.tiles, size_t(nt) * 8);
  if (np >= 0 && size_t(np) <= live_pairs) add(w.pairs, size_t(np) * 4);
  return v;
}
size_t byte_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t mis = a.size() == b.size() ? 0 : 1000000;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) mis += a[i] != b[i];
  return mis;
}

// moe_route (fused at capacity <= 16, else top-k then plan) and moe_router_topk, old vs fast kernels
// (the fused route's fast kernel both with a warp a row and, where live * ceil(E / 32) <= 16, with
// topk_row_wide's ceil(E / 32) warps a row): identical bytes; padding rows' ids / weights unwritten (stale
// ids kept); with replay, an invalid id.
void check_route_old_vs_fast(int E, int k, int T, int cap, int kind, bool replay_on, bool renorm, uint64_t seed) {
  FastSwitches restore;
  const MoeShape shape{cap, E, k, 128, 64};
  std::vector<float> l = logits_of(kind, cap, E, seed);
  for (size_t i = size_t(T) * E; i < l.size(); ++i) l[i] = i % 3 ? (i % 3 == 1 ? 3.0e38f : -3.0e38f) : NAN;
  std::vector<int32_t> replay(size_t(cap) * k);
  uint64_t st = seed;
  for (auto& e : replay) e = int32_t(splitmix(st) % uint64_t(E));
  if (replay_on && T > 0) replay[0] = E + 1;  // invalid: dropped, counted in status
  if (replay_on && T > 1) replay[size_t(k)] = -3;
  const size_t bytes = moe_workspace_bytes(shape);
  DevBuf d_l(l.size() * 4), d_rep(replay.size() * 4), d_rows(4), wa(bytes), wb(bytes);
  upload(d_l.p, l), upload(d_rep.p, replay), upload(d_rows.p, std::vector<int32_t>{T});
  MoeWorkspace ws[2] = {moe_workspace_bind(wa.p, bytes, shape), moe_workspace_bind(wb.p, bytes, shape)};
  const size_t L = size_t(T) * k, P = size_t(cap) * k;
  std::vector<int32_t> stale(P - L);
  for (size_t i = 0; i < stale.size(); ++i) stale[i] = int32_t((i * 7 + 3) % size_t(E));
  const int32_t* rp = replay_on ? d_rep.as<int32_t>() : nullptr;
  std::vector<uint8_t> r[3], tk[3];
  size_t pad = 0;
  for (int mode = 0; mode < 3; ++mode) {  // old, fast with a warp a row, fast (wide where it applies)
    const int fast = mode > 0 ? 1 : 0;
    moe_detail::set_route_fast(fast == 1);
    moe_detail::set_route_wide(mode == 2);
    const MoeWorkspace& w = ws[fast];
    MOEFOLD_CUDA_CHECK(cudaMemset(fast ? wb.p : wa.p, 0xFF, bytes));
    if (!stale.empty()) MOEFOLD_CUDA_CHECK(cudaMemcpy(w.ids + L, stale.data(), stale.size() * 4, cudaMemcpyHostToDevice));
    moe_route(d_l.as<float>(), d_rows.as<int32_t>(), shape, renorm, w, nullptr, rp);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    r[mode] = route_bytes(w, E, L);
    if (!stale.empty()) pad += download<int32_t>(w.ids + L, P - L) != stale;
    pad += count_unpoisoned(w.weights + L, (P - L) * 4);
    // The standalone top-k kernel on the same logits.
    MOEFOLD_CUDA_CHECK(cudaMemset(w.weights, 0xFF, P * 4));
    moe_router_topk(d_l.as<float>(), d_rows.as<int32_t>(), shape, renorm, w.ids, w.weights, nullptr, rp);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    tk[mode] = download<uint8_t>(w.ids, L * 4);
    auto wt = download<uint8_t>(w.weights, L * 4);
    tk[mode].insert(tk[mode].end(), wt.begin(), wt.end());
    pad += count_unpoisoned(w.weights + L, (P - L) * 4);
  }
  char extra[96];
  std::snprintf(extra, sizeof extra, ",%s,%s,%s,fused=%d", kind_name(kind), replay_on ? "replay" : "topk",
                renorm ? "renorm" : "raw", int(moe_route_fused(shape)));
  const std::string shp = shape_str(E, k, 0, 0, T, cap) + extra;
  EXPECT_TRUE(contract_exact("moe_route_fast_eq_old", shp, byte_diff(r[0], r[1])));
  EXPECT_TRUE(contract_exact("moe_route_wide_eq_old", shp, byte_diff(r[0], r[2])));
  EXPECT_TRUE(contract_exact("moe_router_topk_fast_eq_old", shp, byte_diff(tk[0], tk[1])));
  EXPECT_TRUE(contract_exact("moe_route_fast_padding", shp, pad));
  if (T > 0) {  // the plan's pair count: exactly the live valid pairs
    const int bad = replay_on ? (T > 1 ? 2 : 1) : 0;
    EXPECT_EQ(download<int32_t>(ws[1].offsets + E, 1)[0], T * k - bad) << shp;
    EXPECT_EQ(download<int32_t>(ws[1].status, 1)[0], bad) << shp;
  }
}

TEST(MoeRouteFast, BitwiseEqualsOldKernels) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 9000;
  // Fused sizes (L <= 32: the one-warp plan; above: the block plan) and the unfused path.
  for (auto [E, k] : {std::pair{256, 8}, std::pair{16, 4}, std::pair{8, 1}, std::pair{64, 8}, std::pair{512, 32},
                      std::pair{128, 40}, std::pair{512, 10}, std::pair{200, 6}, std::pair{34, 3}})
    for (auto [T, cap] : {std::pair{1, 1}, std::pair{0, 3}, std::pair{2, 2}, std::pair{3, 7}, std::pair{4, 4},
                          std::pair{5, 9}, std::pair{15, 16}, std::pair{16, 16}, std::pair{17, 20}, std::pair{128, 128}})
      for (int kind = 0; kind < 5; ++kind)
        for (bool rp : {false, true}) {
          if (int64_t(cap) * k > 4096 && kind > 0) continue;
          ++seed;
          check_route_old_vs_fast(E, k, T, cap, kind, rp, (seed & 1) == 0, seed);
        }
  for (int kind = 0; kind < 5; ++kind) check_route_old_vs_fast(256, 8, 4100, 4111, kind, false, true, ++seed);
}

// Batch invariance of the fast top-k: each row's ids and weights are the same bytes when it is row 0 of a
// one-row step (fused path) as at row t of 2, 17, 128 and 4100-row steps, and match cpu::router_topk.
TEST(MoeRouteFast, RowsInvariantAcrossRowCounts) {
  MOEFOLD_REQUIRE_GPU();
  const int E = 256, k = 8, maxT = 4100;
  for (int kind : {0, 1, 3, 4}) {
    const std::vector<float> l = logits_of(kind, maxT, E, 77 + uint64_t(kind));
    DevBuf d_l(l.size() * 4), d_rows(4);
    upload(d_l.p, l);
    // Reference bytes of each checked row from one-row steps.
    const std::vector<int> rows = {0, 1, 2, 16, 17, 127, 4099};
    std::vector<std::vector<uint8_t>> ref;
    for (int t : rows) {
      const MoeShape s1{1, E, k, 128, 64};
      DevBuf wsm(moe_workspace_bytes(s1));
      MoeWorkspace ws = moe_workspace_bind(wsm.p, wsm.bytes, s1);
      upload(d_rows.p, std::vector<int32_t>{1});
      moe_route(d_l.as<float>() + size_t(t) * E, d_rows.as<int32_t>(), s1, true, ws, nullptr);
      MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
      auto b = download<uint8_t>(ws.ids, k * 4);
      auto wb = download<uint8_t>(ws.weights, k * 4);
      b.insert(b.end(), wb.begin(), wb.end());
      ref.push_back(b);
    }
    size_t mis = 0;
    for (int T : {2, 17, 128, 4100}) {
      const MoeShape s{T, E, k, 128, 64};
      DevBuf wsm(moe_workspace_bytes(s));
      MoeWorkspace ws = moe_workspace_bind(wsm.p, wsm.bytes, s);
      upload(d_rows.p, std::vector<int32_t>{T});
      moe_route(d_l.as<float>(), d_rows.as<int32_t>(), s, true, ws, nullptr);
      MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] >= T) continue;
        auto b = download<uint8_t>(ws.ids + size_t(rows[i]) * k, k * 4);
        auto wb = download<uint8_t>(ws.weights + size_t(rows[i]) * k, k * 4);
        b.insert(b.end(), wb.begin(), wb.end());
        mis += byte_diff(b, ref[i]);
      }
      if (T == 4100) {  // and the CPU reference on every row
        auto ids = download<int32_t>(ws.ids, size_t(T) * k);
        auto wts = download<float>(ws.weights, size_t(T) * k);
        std::vector<int32_t> iref(size_t(T) * k);
        std::vector<float> wref(size_t(T) * k);
        cpu::router_topk(l.data(), T, E, k, true, iref.data(), wref.data());
        size_t id_mis = 0;
        for (size_t i = 0; i < ids.size(); ++i) id_mis += ids[i] != iref[i];
        EXPECT_TRUE(contract_exact("moe_route_fast_ids_vs_cpu", std::string("T=4100,") + kind_name(kind), id_mis));
        EXPECT_TRUE(contract("moe_route_fast_weights_vs_cpu", std::string("T=4100,") + kind_name(kind),
                             rel_err(wts, wref), 1e-6));
      }
    }
    EXPECT_TRUE(contract_exact("moe_route_fast_row_invariance", std::string("T=1,2,17,128,4100,") + kind_name(kind), mis));
  }
}

// ---- the cluster-fused router logits + top-k + plan (moe_router_route) ------------------------------------
// Against moe_router_logits + moe_route with the old kernels: the same bytes in the live logits, ids,
// weights and the whole plan; padding rows' logits, ids and weights unwritten; experts 0 and E-1 routable
// (a replay naming them, logits favouring them); an invalid replayed id counted in status.
void check_router_cluster(int E, int k, int H, int T, int cap, int routing, uint64_t seed) {
  FastSwitches restore;
  const MoeShape shape{cap, E, k, H, 64};
  std::vector<uint16_t> xh, wh;
  rand_bf16(size_t(cap) * H, seed, 1.0f, xh, nullptr);
  rand_bf16(size_t(E) * H, seed + 1, 2.0f / std::sqrt(float(H)), wh, nullptr);
  const uint16_t garbage[4] = {0x7FC0, 0x7F7F, 0xFF7F, 0x7F80};
  for (size_t i = size_t(T) * H; i < xh.size(); ++i) xh[i] = garbage[i % 4];
  if (routing == 3)  // router rows of experts 0 and E-1 aligned with x: they win in most rows
    for (int h = 0; h < H; ++h) wh[size_t(h)] = wh[size_t(E - 1) * H + h] = (xh[size_t(h)] & 0x8000) ? 0xBF80 : 0x3F80;
  std::vector<int32_t> replay(size_t(cap) * k);
  for (size_t i = 0; i < replay.size(); ++i) replay[i] = int32_t(i % size_t(k) == 0 ? 0 : (i % size_t(k) == 1 ? E - 1 : (i * 13 + 5) % size_t(E)));
  if (T > 0) replay[size_t(k) - 1] = E;  // invalid
  const size_t bytes = moe_workspace_bytes(shape);
  DevBuf d_x(xh.size() * 2), d_w(wh.size() * 2), d_rep(replay.size() * 4), d_rows(4), wa(bytes), wb(bytes);
  upload(d_x.p, xh), upload(d_w.p, wh), upload(d_rep.p, replay), upload(d_rows.p, std::vector<int32_t>{T});
  MoeWorkspace ws[2] = {moe_workspace_bind(wa.p, bytes, shape), moe_workspace_bind(wb.p, bytes, shape)};
  const int32_t* rp = routing == 1 ? d_rep.as<int32_t>() : nullptr;
  const bool renorm = routing != 2;
  const size_t L = size_t(T) * k, P = size_t(cap) * k;
  std::vector<uint8_t> r[2];
  size_t pad = 0;
  const int64_t launches0 = moe_detail::router_cluster_launches();
  for (int fused = 0; fused < 2; ++fused) {
    moe_detail::set_route_fast(fused == 1);
    moe_detail::set_router_cluster(fused == 1);
    MOEFOLD_CUDA_CHECK(cudaMemset(fused ? wb.p : wa.p, 0xFF, bytes));
    moe_router_route(d_x.as<__nv_bfloat16>(), d_w.as<__nv_bfloat16>(), d_rows.as<int32_t>(), shape, renorm, ws[fused],
                     nullptr, rp);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    r[fused] = route_bytes(ws[fused], E, L);
    auto lg = download<uint8_t>(ws[fused].logits, size_t(T) * E * 4);
    r[fused].insert(r[fused].end(), lg.begin(), lg.end());
    pad += count_unpoisoned(ws[fused].logits + size_t(T) * E, size_t(cap - T) * E * 4) +
           count_unpoisoned(ws[fused].ids + L, (P - L) * 4) + count_unpoisoned(ws[fused].weights + L, (P - L) * 4);
  }
  const bool ran = moe_detail::router_cluster_launches() > launches0;
  char extra[96];
  std::snprintf(extra, sizeof extra, ",%s,cluster_ran=%d",
                routing == 0 ? "topk" : (routing == 1 ? "replay" : (routing == 2 ? "raw" : "experts_0_last")), int(ran));
  const std::string shp = shape_str(E, k, H, 0, T, cap) + extra;
  EXPECT_TRUE(ran) << shp << ": the cluster kernel did not run (device cannot co-schedule the cluster?)";
  EXPECT_TRUE(contract_exact("moe_router_cluster_eq_old", shp, byte_diff(r[0], r[1])));
  EXPECT_TRUE(contract_exact("moe_router_cluster_padding", shp, pad));
  if (routing == 3 && T > 0) {  // expert 0 or E-1 actually routed
    auto c = download<int32_t>(ws[1].counts, size_t(E));
    EXPECT_GT(c[0] + c[size_t(E) - 1], 0) << shp;
  }
}

TEST(MoeRouterCluster, BitwiseEqualsLogitsThenRoute) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 8000;
  for (auto [E, k, H] : {std::tuple{256, 8, 2048}, std::tuple{16, 4, 512}, std::tuple{64, 8, 1024},
                         std::tuple{200, 6, 512}, std::tuple{128, 32, 512}, std::tuple{2, 1, 512},
                         std::tuple{16, 4, 128}, std::tuple{8, 2, 128}, std::tuple{64, 8, 256}})
    for (auto [T, cap] : {std::pair{1, 1}, std::pair{0, 3}, std::pair{3, 7}, std::pair{4, 4}, std::pair{15, 16},
                          std::pair{16, 16}})
      for (int routing = 0; routing < 4; ++routing) {
        const MoeShape s{cap, E, k, H, 64};
        moe_detail::set_router_cluster(true);
        const bool applies = moe_router_cluster_fused(s);
        moe_detail::set_router_cluster(false);
        if (!applies) continue;  // e.g. k = 32 at 16 rows is fused, cap * E * 4 within the pipeline buffers
        check_router_cluster(E, k, H, T, cap, routing, ++seed);
      }
}

// ---- combine: one-pass vs the previous kernel -------------------------------------------------------------
struct CombineCase {
  int E, k, H, T, cap;
  bool residual, shared, gate;
};

/// Runs moe_combine on random inputs (padding rows of every input poisoned) with the given kernel and
/// returns the output bytes of all `cap` rows (padding must stay 0xFF).
std::vector<uint16_t> run_combine(const CombineCase& c, bool fast, uint64_t seed, std::vector<float>* ref) {
  const MoeShape shape{c.cap, c.E, c.k, c.H, 64};
  const size_t H = size_t(c.H), P = size_t(c.cap) * c.k;
  std::vector<uint16_t> yh, xh, sh, rh, gh;
  std::vector<float> yf, xf, sf, rf, gf;
  rand_bf16(P * H, seed, 1.0f, yh, &yf);
  rand_bf16(size_t(c.cap) * H, seed + 1, 1.0f, xh, &xf);
  rand_bf16(size_t(c.cap) * H, seed + 2, 0.5f, sh, &sf);
  rand_bf16(size_t(c.cap) * H, seed + 3, 1.0f, rh, &rf);
  rand_bf16(H, seed + 4, 2.0f / std::sqrt(float(H)), gh, &gf);
  std::vector<float> wts = test::uniform(P, seed + 5, 0.0f, 0.3f);
  const uint16_t garbage[3] = {0x7FC0, 0x7F7F, 0xFF80};
  for (size_t i = size_t(c.T) * H; i < size_t(c.cap) * H; ++i) xh[i] = sh[i] = rh[i] = garbage[i % 3];
  for (size_t i = size_t(c.T) * c.k * H; i < P * H; ++i) yh[i] = garbage[i % 3];
  for (size_t i = size_t(c.T) * c.k; i < P; ++i) wts[i] = NAN;
  DevBuf wsm(moe_workspace_bytes(shape)), d_w(P * 4), d_x(xh.size() * 2), d_s(sh.size() * 2), d_r(rh.size() * 2),
      d_g(H * 2), d_out(size_t(c.cap) * H * 2), d_rows(4);
  MoeWorkspace ws = moe_workspace_bind(wsm.p, wsm.bytes, shape);
  upload(ws.y, yh), upload(d_w.p, wts), upload(d_x.p, xh), upload(d_s.p, sh), upload(d_r.p, rh), upload(d_g.p, gh);
  upload(d_rows.p, std::vector<int32_t>{c.T});
  MOEFOLD_CUDA_CHECK(cudaMemset(d_out.p, 0xFF, d_out.bytes));
  moe_detail::set_combine_fast(fast);
  moe_combine(d_w.as<float>(), ws, c.shared ? d_s.as<__nv_bfloat16>() : nullptr,
              c.gate ? d_g.as<__nv_bfloat16>() : nullptr, d_x.as<__nv_bfloat16>(),
              c.residual ? d_r.as<__nv_bfloat16>() : nullptr, d_rows.as<int32_t>(), shape, d_out.as<__nv_bfloat16>(),
              nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  moe_detail::set_combine_fast(true);
  if (ref) {  // fp64 reference of the live rows
    ref->assign(size_t(c.T) * H, 0.0f);
    for (size_t t = 0; t < size_t(c.T); ++t) {
      double d = 0;
      for (size_t h = 0; h < H; ++h) d += double(xf[t * H + h]) * gf[h];
      const double g = c.shared ? (c.gate ? 1.0 / (1.0 + std::exp(-d)) : 1.0) : 0.0;
      for (size_t h = 0; h < H; ++h) {
        double a = c.residual ? rf[t * H + h] : 0.0;
        for (int s = 0; s < c.k; ++s) a += double(wts[t * c.k + s]) * yf[(t * c.k + s) * H + h];
        a += g * (c.shared ? sf[t * H + h] : 0.0f);
        (*ref)[t * H + h] = float(a);
      }
    }
  }
  return download<uint16_t>(d_out.p, size_t(c.cap) * H);
}

TEST(MoeCombineFast, BitwiseEqualsOldKernel) {
  MOEFOLD_REQUIRE_GPU();
  FastSwitches restore;
  uint64_t seed = 7000;
  std::vector<CombineCase> cases;
  for (int T : {1, 2, 17, 128, 4100})
    cases.push_back({256, 8, 2048, T, T + (T % 2 ? 3 : 0), true, true, true});
  for (auto [k, H] : {std::pair{8, 256}, std::pair{4, 1152}, std::pair{1, 2048}, std::pair{7, 128},
                      std::pair{9, 2048} /*old kernel*/, std::pair{8, 4096} /*old kernel*/})
    for (int flags = 0; flags < 8; ++flags)
      cases.push_back({64, k, H, 5, 9, (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0});
  for (const CombineCase& c : cases) {
    std::vector<float> ref;
    const auto a = run_combine(c, false, ++seed, nullptr);
    const auto b = run_combine(c, true, seed, &ref);
    size_t mis = 0, pad = 0;
    for (size_t i = 0; i < a.size(); ++i) mis += a[i] != b[i];
    for (size_t i = size_t(c.T) * c.H; i < b.size(); ++i) pad += b[i] != 0xFFFF;
    char shp[128];
    std::snprintf(shp, sizeof shp, "k=%d,H=%d,T=%d,cap=%d,res=%d,shared=%d,gate=%d", c.k, c.H, c.T, c.cap,
                  int(c.residual), int(c.shared), int(c.gate));
    EXPECT_TRUE(contract_exact("moe_combine_onepass_eq_old", shp, mis));
    EXPECT_TRUE(contract_exact("moe_combine_onepass_padding", shp, pad));
    std::vector<float> got(ref.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(b[i]);
    EXPECT_TRUE(contract("moe_combine_onepass_vs_fp64", shp, rel_err(got, ref), 8e-3));
  }
}

// A few cases of every new path, small enough for compute-sanitizer (memcheck / racecheck).
TEST(MoeRouteFast, SanitizeSmall) {
  MOEFOLD_REQUIRE_GPU();
  check_route_old_vs_fast(256, 8, 1, 1, 0, false, true, 1);     // fast route, one-warp plan
  check_route_old_vs_fast(256, 8, 3, 7, 3, true, true, 2);      // replay with invalid ids
  check_route_old_vs_fast(16, 4, 15, 16, 1, false, false, 3);   // block plan (60 pairs)
  check_route_old_vs_fast(128, 40, 1, 1, 4, false, true, 4);    // k > 32 slots
  check_route_old_vs_fast(256, 8, 17, 20, 0, false, true, 5);   // the standalone top-k kernel
  check_router_cluster(256, 8, 2048, 1, 1, 0, 6);              // cluster: 16 CTAs
  check_router_cluster(64, 8, 1024, 15, 16, 1, 7);              // cluster: block plan, replay
  check_router_cluster(16, 4, 512, 0, 3, 0, 8);                 // cluster: no live rows
  check_router_cluster(16, 4, 128, 16, 16, 3, 9);               // cluster of 1 CTA, 2 warps (fixture shape)
  FastSwitches restore;
  for (const CombineCase& c : {CombineCase{256, 8, 2048, 1, 1, true, true, true}, CombineCase{64, 4, 1152, 3, 5, false, true, false}}) {
    const auto a = run_combine(c, false, 11, nullptr), b = run_combine(c, true, 11, nullptr);
    EXPECT_TRUE(contract_exact("moe_combine_onepass_eq_old", "sanitize,k=" + std::to_string(c.k), a == b ? 0 : 1));
  }
}

// ---- timing (run with --gtest_also_run_disabled_tests) -------------------------------------------------------
/// Microseconds per launch of `body` (kReps launches captured in one graph; median of 15 replays).
double us_per_launch(cudaStream_t st, const std::function<void()>& body, int reps) {
  cudaGraph_t g;
  cudaGraphExec_t ex;
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < reps; ++i) body();
  MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
  MOEFOLD_CUDA_CHECK(cudaGraphDestroy(g));
  cudaEvent_t a, b;
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
  MOEFOLD_CUDA_CHECK(cudaGraphLaunch(ex, st));
  std::vector<float> ms;
  for (int i = 0; i < 15; ++i) {
    MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
    MOEFOLD_CUDA_CHECK(cudaGraphLaunch(ex, st));
    MOEFOLD_CUDA_CHECK(cudaEventRecord(b, st));
    MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  MOEFOLD_CUDA_CHECK(cudaGraphExecDestroy(ex));
  return double(ms[ms.size() / 2]) * 1000.0 / reps;
}

TEST(MoeRoutePerf, DISABLED_OldVsNew) {
  MOEFOLD_REQUIRE_GPU();
  FastSwitches restore;
  const int E = 256, k = 8, H = 2048;
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("PERF moe route/combine E=%d k=%d H=%d: us per launch, graphs of back-to-back launches, A B B A "
              "(A = old kernels, B = new); route = moe_route (fused top-k + plan at <= 16 rows, else top-k + plan)\n",
              E, k, H);
  std::printf("PERF %-7s | %-27s | %-27s | %-27s\n", "rows", "route old/new/new/old", "topk old/new/new/old",
              "combine old/new/new/old");
  for (int T : {1, 8, 64, 256, 32768}) {
    const MoeShape s{T, E, k, H, 512};
    DevBuf wsm(moe_workspace_bytes(s)), d_l(size_t(T) * E * 4), d_rows(4), d_x(size_t(T) * H * 2),
        d_sh(size_t(T) * H * 2), d_res(size_t(T) * H * 2), d_out(size_t(T) * H * 2), d_g(size_t(H) * 2);
    MoeWorkspace ws = moe_workspace_bind(wsm.p, wsm.bytes, s);
    DevBuf wr(size_t(E) * H * 2);
    {
      std::vector<uint16_t> hw;
      rand_bf16(size_t(E) * H, 8, 0.04f, hw, nullptr);
      upload(wr.p, hw);
    }
    upload(d_l.p, test::randn(size_t(T) * E, 5, 2.0f));
    upload(d_rows.p, std::vector<int32_t>{T});
    std::vector<uint16_t> h;
    rand_bf16(size_t(T) * H, 6, 1.0f, h, nullptr);
    upload(d_x.p, h), upload(d_sh.p, h), upload(d_res.p, h);
    rand_bf16(size_t(H), 7, 0.02f, h, nullptr);
    upload(d_g.p, h);
    MOEFOLD_CUDA_CHECK(cudaMemset(ws.y, 0, size_t(T) * k * H * 2));
    const int reps = T >= 4096 ? 5 : 100;
    auto route = [&] { moe_route(d_l.as<float>(), d_rows.as<int32_t>(), s, true, ws, st); };
    // router logits + route from x: old = the two old kernels, new = logits + fast route, and at <= 16
    // rows also the cluster-fused kernel (the third column of the last table).
    auto router = [&] {
      moe_router_route(d_x.as<__nv_bfloat16>(), wr.as<__nv_bfloat16>(), d_rows.as<int32_t>(), s, true, ws, st);
    };
    auto topk = [&] { moe_router_topk(d_l.as<float>(), d_rows.as<int32_t>(), s, true, ws.ids, ws.weights, st); };
    moe_route(d_l.as<float>(), d_rows.as<int32_t>(), s, true, ws, st);  // valid weights for the combine
    auto combine = [&] {
      moe_combine(ws.weights, ws, d_sh.as<__nv_bfloat16>(), d_g.as<__nv_bfloat16>(), d_x.as<__nv_bfloat16>(),
                  d_res.as<__nv_bfloat16>(), d_rows.as<int32_t>(), s, d_out.as<__nv_bfloat16>(), st);
    };
    double r[4][4];
    const std::function<void()> bodies[4] = {route, topk, combine, router};
    for (int b = 0; b < 4; ++b)
      for (int i = 0; i < 4; ++i) {
        const bool fast = i == 1 || i == 2;  // A B B A
        moe_detail::set_route_fast(fast);
        moe_detail::set_combine_fast(fast);
        r[b][i] = us_per_launch(st, bodies[b], reps);
      }
    moe_detail::set_route_fast(true);
    moe_detail::set_combine_fast(true);
    // The cluster-fused router (same bytes), A B B A against logits + fast route.
    double c[4] = {0, 0, 0, 0};
    moe_detail::set_router_cluster(true);
    const bool cluster = moe_router_cluster_fused(s);
    if (cluster)
      for (int i = 0; i < 4; ++i) {
        moe_detail::set_router_cluster(i == 1 || i == 2);
        c[i] = us_per_launch(st, router, reps);
      }
    moe_detail::set_router_cluster(false);
    auto cell = [](const double* v) {
      char c[64];
      std::snprintf(c, sizeof c, "%6.2f/%6.2f/%6.2f/%6.2f", v[0], v[1], v[2], v[3]);
      return std::string(c);
    };
    auto ratio = [](const double* v) { return (v[1] + v[2]) / (v[0] + v[3]); };
    std::printf("PERF %-7d | %-27s | %-27s | %-27s  new/old %.2f %.2f %.2f\n", T, cell(r[0]).c_str(), cell(r[1]).c_str(),
                cell(r[2]).c_str(), ratio(r[0]), ratio(r[1]), ratio(r[2]));
    std::printf("PERF %-7d | logits+route old/new/new/old %s new/old %.2f", T, cell(r[3]).c_str(), ratio(r[3]));
    if (cluster) std::printf(" | cluster: fast/cluster/cluster/fast %s cluster/fast %.2f", cell(c).c_str(), ratio(c));
    std::printf("\n");
    std::fflush(stdout);
  }
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

// The fused route at 1-4 rows: a warp a row (narrow) against topk_row_wide (wide), A B B A, at the
// Qwen3.5/3.6 (256 experts, top-8) and Qwen3-Next (512, top-10) router shapes.
TEST(MoeRoutePerf, DISABLED_WideVsNarrow) {
  MOEFOLD_REQUIRE_GPU();
  FastSwitches restore;
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("PERF moe_route fused: us per launch, graphs of back-to-back launches, A B B A (A = a warp a row, "
              "B = wide)\n");
  for (auto [E, k] : {std::pair{256, 8}, std::pair{512, 10}})
    for (int T : {1, 2, 4}) {
      const MoeShape s{T, E, k, 2048, 512};
      DevBuf wsm(moe_workspace_bytes(s)), d_l(size_t(T) * E * 4), d_rows(4);
      MoeWorkspace ws = moe_workspace_bind(wsm.p, wsm.bytes, s);
      upload(d_l.p, test::randn(size_t(T) * E, 5, 2.0f));
      upload(d_rows.p, std::vector<int32_t>{T});
      auto route = [&] { moe_route(d_l.as<float>(), d_rows.as<int32_t>(), s, true, ws, st); };
      double r[4];
      for (int i = 0; i < 4; ++i) {
        moe_detail::set_route_wide(i == 1 || i == 2);
        r[i] = us_per_launch(st, route, 200);
      }
      std::printf("PERF E=%-4d k=%-3d rows %d | route narrow/wide/wide/narrow %6.2f/%6.2f/%6.2f/%6.2f  wide/narrow %.2f\n",
                  E, k, T, r[0], r[1], r[2], r[3], (r[1] + r[2]) / (r[0] + r[3]));
      std::fflush(stdout);
    }
  moe_detail::set_route_wide(true);
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace moefold::cuda::moe_test
