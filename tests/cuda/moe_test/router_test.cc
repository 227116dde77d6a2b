// moe_test: the router top-k (crafted logits, routing replay), the fused small-step route and the plan.
#include "cuda/moe_test/moe_test_util.h"

namespace moefold::cuda::moe_test {
namespace {

// ---- router top-k on crafted logits -----------------------------------------------------------------------
enum class LogitKind { kRandom, kAllNegative, kTies, kSpecialsLive };

std::vector<float> crafted_logits(LogitKind kind, int T, int E, uint64_t seed) {
  std::vector<float> l;
  switch (kind) {
    case LogitKind::kRandom: l = test::randn(size_t(T) * E, seed, 3.0f); break;
    case LogitKind::kAllNegative: l = test::uniform(size_t(T) * E, seed, -60.0f, -0.5f); break;
    case LogitKind::kTies: {
      auto u = test::uniform(size_t(T) * E, seed, 0.0f, 4.0f);
      const float vals[4] = {-1.0f, 0.0f, 0.5f, 2.0f};
      l.resize(u.size());
      for (size_t i = 0; i < u.size(); ++i) l[i] = vals[std::min(3, int(u[i]))];
      break;
    }
    case LogitKind::kSpecialsLive: {
      l = test::randn(size_t(T) * E, seed, 2.0f);
      for (size_t i = 0; i < l.size(); i += 5) l[i] = NAN;
      for (size_t i = 2; i < l.size(); i += 11) l[i] = -INFINITY;
      if (T > 1)
        for (int e = 0; e < E; ++e) l[size_t(E) + e] = NAN;  // a row of NaN only
      break;
    }
  }
  return l;
}

// Runs moe_router_topk on `logits` ([cap, E]; rows >= T are padding) and, with `replay` ([cap, k]), replays
// those experts; checks against cpu::router_topk on the live rows: ids exact, weights within 1e-6,
// padding rows' outputs unwritten. Contract rows <what>_ids, <what>_weights, <what>_padding.
void expect_topk_matches_cpu(const std::string& what, const std::string& shp, const MoeShape& shape, int T,
                             bool renorm, const std::vector<float>& logits, const std::vector<int32_t>* replay) {
  const int cap = shape.capacity, k = shape.k, E = shape.E, pad = cap - T;
  DevBuf d_l(logits.size() * 4), d_r(replay ? replay->size() * 4 : 4), d_ids(size_t(cap) * k * 4),
      d_w(size_t(cap) * k * 4), d_rows(4);
  upload(d_l.p, logits);
  if (replay) upload(d_r.p, *replay);
  upload(d_rows.p, std::vector<int32_t>{T});
  MOEFOLD_CUDA_CHECK(cudaMemset(d_ids.p, 0xFF, d_ids.bytes));
  MOEFOLD_CUDA_CHECK(cudaMemset(d_w.p, 0xFF, d_w.bytes));
  moe_router_topk(d_l.as<float>(), d_rows.as<int32_t>(), shape, renorm, d_ids.as<int32_t>(), d_w.as<float>(), nullptr,
                  replay ? d_r.as<int32_t>() : nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  auto ids = download<int32_t>(d_ids.p, size_t(T) * k);
  auto wts = download<float>(d_w.p, size_t(T) * k);
  std::vector<int32_t> iref(size_t(T) * k);
  std::vector<float> wref(size_t(T) * k);
  cpu::router_topk(logits.data(), T, E, k, renorm, iref.data(), wref.data(), replay ? replay->data() : nullptr);
  size_t mis = 0;
  for (size_t i = 0; i < ids.size(); ++i) mis += ids[i] != iref[i];
  EXPECT_TRUE(contract_exact(what + "_ids", shp, mis));
  EXPECT_TRUE(contract(what + "_weights", shp, rel_err(wts, wref), 1e-6));
  const size_t pad_w = count_unpoisoned(d_ids.as<int32_t>() + size_t(T) * k, size_t(pad) * k * 4) +
                       count_unpoisoned(d_w.as<float>() + size_t(T) * k, size_t(pad) * k * 4);
  EXPECT_TRUE(contract_exact(what + "_padding", shp, pad_w));
}

void check_topk(int E, int k, int T, int pad, LogitKind kind, bool renorm, uint64_t seed) {
  const int cap = T + pad;
  MoeShape shape{cap, E, k, 128, 64};
  std::vector<float> live = crafted_logits(kind, T, E, seed);
  std::vector<float> l(size_t(cap) * E);
  const float garbage[5] = {NAN, 3.0e38f, -3.0e38f, INFINITY, -INFINITY};
  for (size_t i = 0; i < l.size(); ++i) l[i] = i < live.size() ? live[i] : garbage[i % 5];
  const char* names[4] = {"random", "all_negative", "ties", "nan_inf_live"};
  const std::string shp = shape_str(E, k, 0, 0, T, cap) + "," + names[int(kind)] + (renorm ? ",renorm" : ",raw");
  expect_topk_matches_cpu("moe_router_topk", shp, shape, T, renorm, l, nullptr);
}

TEST(MoeRouter, TopkMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 10;
  for (auto [E, k] : {std::pair{256, 8}, std::pair{16, 4}})
    for (int T : kTokenCounts)
      for (LogitKind kind : {LogitKind::kRandom, LogitKind::kAllNegative, LogitKind::kTies, LogitKind::kSpecialsLive})
        check_topk(E, k, T, T % 2 ? 5 : 0, kind, true, ++seed);
  check_topk(256, 8, 17, 3, LogitKind::kRandom, false, ++seed);
  check_topk(16, 4, 113, 3, LogitKind::kAllNegative, false, ++seed);
}

// Routing replay: given experts (distinct, random, expert 0 and the least likely ones included) instead
// of the top-k; weights must be cpu::router_topk's replay weights; padding rows' replay entries name real
// experts and must not be read or their outputs written.
void check_topk_replay(int E, int k, int T, int pad, bool renorm, uint64_t seed) {
  const int cap = T + pad;
  MoeShape shape{cap, E, k, 128, 64};
  std::vector<float> l = crafted_logits(LogitKind::kRandom, cap, E, seed);
  std::vector<int32_t> replay(size_t(cap) * k);
  uint64_t s = seed;
  for (int t = 0; t < cap; ++t)
    for (int j = 0; j < k; ++j) {
      int32_t e;
      bool dup;
      do {
        e = j == 0 && t % 3 == 0 ? 0 : int32_t(splitmix(s) % uint64_t(E));
        dup = false;
        for (int q = 0; q < j; ++q) dup |= replay[size_t(t) * k + q] == e;
      } while (dup);
      replay[size_t(t) * k + j] = e;
    }
  const std::string shp = shape_str(E, k, 0, 0, T, cap) + (renorm ? ",renorm" : ",raw");
  expect_topk_matches_cpu("moe_router_replay", shp, shape, T, renorm, l, &replay);
}

TEST(MoeRouter, ReplayMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 500;
  for (auto [E, k] : {std::pair{256, 8}, std::pair{16, 4}})
    for (int T : {1, 17, 128})
      for (bool renorm : {true, false}) check_topk_replay(E, k, T, T % 2 ? 5 : 0, renorm, ++seed);
}

// ---- fused top-k + plan of small steps (moe_route) ---------------------------------------------------------
// moe_route at capacity <= 16 (one launch) gives the bytes of moe_router_topk then moe_plan: ids, weights,
// counts, offsets, the live pair list, tiles, status; padding rows' logits NaN / huge, stale padding ids and
// replay entries; with replay, an invalid live id is counted in status in both.
void check_route_fused(int E, int k, int T, int cap, bool replay_on, uint64_t seed) {
  const MoeShape shape{cap, E, k, 128, 64};
  ASSERT_TRUE(moe_route_fused(shape));
  std::vector<float> l = crafted_logits(LogitKind::kRandom, cap, E, seed);
  for (size_t i = size_t(T) * E; i < l.size(); ++i) l[i] = i % 3 ? (i % 3 == 1 ? 3.0e38f : -3.0e38f) : NAN;
  std::vector<int32_t> replay(size_t(cap) * k);
  uint64_t st = seed;
  for (auto& e : replay) e = int32_t(splitmix(st) % uint64_t(E));
  if (replay_on && T > 0) replay[0] = E + 1;  // invalid: dropped, counted in status
  const size_t bytes = moe_workspace_bytes(shape);
  DevBuf d_l(l.size() * 4), d_rep(replay.size() * 4), d_rows(4), wa(bytes), wb(bytes);
  upload(d_l.p, l), upload(d_rep.p, replay), upload(d_rows.p, std::vector<int32_t>{T});
  MoeWorkspace a = moe_workspace_bind(wa.p, bytes, shape), b = moe_workspace_bind(wb.p, bytes, shape);
  MOEFOLD_CUDA_CHECK(cudaMemset(wa.p, 0xFF, bytes));
  MOEFOLD_CUDA_CHECK(cudaMemset(wb.p, 0xFF, bytes));
  const int32_t* rp = replay_on ? d_rep.as<int32_t>() : nullptr;
  moe_router_topk(d_l.as<float>(), d_rows.as<int32_t>(), shape, true, a.ids, a.weights, nullptr, rp);
  moe_plan(a.ids, d_rows.as<int32_t>(), shape, a, nullptr);
  moe_route(d_l.as<float>(), d_rows.as<int32_t>(), shape, true, b, nullptr, rp);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const size_t P = size_t(cap) * k;
  auto bytes_of = [&](const MoeWorkspace& w) {
    std::vector<uint8_t> v;
    auto add = [&](const void* p, size_t n) {
      auto h = download<uint8_t>(p, n);
      v.insert(v.end(), h.begin(), h.end());
    };
    add(w.ids, P * 4), add(w.weights, P * 4), add(w.counts, size_t(E) * 4), add(w.offsets, size_t(E + 1) * 4);
    add(w.pairs, P * 4), add(w.num_tiles, 4), add(w.status, 4);
    add(w.tiles, size_t(download<int32_t>(w.num_tiles, 1)[0]) * 8);
    return v;
  };
  const std::vector<uint8_t> ra = bytes_of(a), rb = bytes_of(b);
  size_t mis = ra.size() == rb.size() ? 0 : 1000000;
  for (size_t i = 0; i < std::min(ra.size(), rb.size()); ++i) mis += ra[i] != rb[i];
  const int status = download<int32_t>(b.status, 1)[0];
  EXPECT_EQ(status, replay_on && T > 0 ? 1 : 0);
  EXPECT_EQ(download<int32_t>(b.offsets + E, 1)[0], T * k - status);
  char extra[32];
  std::snprintf(extra, sizeof extra, ",%s", replay_on ? "replay" : "topk");
  EXPECT_TRUE(contract_exact("moe_route_fused_eq_topk_plan", shape_str(E, k, 0, 0, T, cap) + extra, mis));
}

TEST(MoeRoute, SmallFusedEqualsTopkThenPlan) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 600;
  for (auto [E, k] : {std::pair{8, 1}, std::pair{16, 4}, std::pair{64, 8}, std::pair{256, 8}, std::pair{512, 32}})
    for (auto [T, cap] : {std::pair{1, 1}, std::pair{0, 3}, std::pair{3, 7}, std::pair{15, 16}, std::pair{16, 16}})
      for (bool rp : {false, true}) check_route_fused(E, k, T, cap, rp, ++seed);
}

// ---- plan on given ids ------------------------------------------------------------------------------------
void check_plan(int E, int k, int T, int pad, int bad_ids, uint64_t seed) {
  const int cap = T + pad;
  MoeShape shape{cap, E, k, 128, 64};
  // Distinct random experts per live row; padding rows hold stale real experts.
  std::vector<int32_t> ids(size_t(cap) * k);
  uint64_t s = seed;
  for (int t = 0; t < cap; ++t) {
    for (int j = 0; j < k; ++j) {
      int32_t e;
      bool dup;
      do {
        e = int32_t(splitmix(s) % uint64_t(E));
        dup = false;
        for (int q = 0; q < j; ++q) dup |= ids[size_t(t) * k + q] == e;
      } while (dup);
      ids[size_t(t) * k + j] = e;
    }
  }
  for (int b = 0; b < bad_ids && T > 0; ++b) ids[size_t(b * 7 % (T * k))] = E + 3 + b;
  const size_t bytes = moe_workspace_bytes(shape);
  DevBuf d_ws(bytes), d_ids(ids.size() * 4), d_rows(4);
  MoeWorkspace ws = moe_workspace_bind(d_ws.p, bytes, shape);
  MOEFOLD_CUDA_CHECK(cudaMemset(d_ws.p, 0xFF, bytes));
  upload(d_ids.p, ids);
  upload(d_rows.p, std::vector<int32_t>{T});
  moe_plan(d_ids.as<int32_t>(), d_rows.as<int32_t>(), shape, ws, nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());

  // Reference over the live, valid pairs only (invalid ones are dropped by the GPU plan).
  const int L = T * k;
  std::vector<int32_t> counts(size_t(E), 0);
  for (int i = 0; i < L; ++i)
    if (ids[size_t(i)] >= 0 && ids[size_t(i)] < E) counts[size_t(ids[size_t(i)])]++;
  std::vector<int32_t> offs(size_t(E) + 1, 0), pairs;
  for (int e = 0; e < E; ++e) offs[size_t(e + 1)] = offs[size_t(e)] + counts[size_t(e)];
  for (int e = 0; e < E; ++e)
    for (int i = 0; i < L; ++i)
      if (ids[size_t(i)] == e) pairs.push_back(i);
  if (bad_ids == 0) {  // and it agrees with cpu::moe_plan
    cpu::MoePlan p = cpu::moe_plan(ids.data(), T, k, E);
    EXPECT_EQ(p.offsets, offs);
    EXPECT_EQ(p.pairs, pairs);
  }
  auto g_off = download<int32_t>(ws.offsets, size_t(E) + 1);
  auto g_cnt = download<int32_t>(ws.counts, size_t(E));
  auto g_pairs = download<int32_t>(ws.pairs, pairs.size());
  const int g_tiles = download<int32_t>(ws.num_tiles, 1)[0], g_status = download<int32_t>(ws.status, 1)[0];
  int tiles_ref = 0;
  for (int e = 0; e < E; ++e) tiles_ref += (counts[size_t(e)] + ws.tile_rows - 1) / ws.tile_rows;
  size_t mis = (g_off != offs) + (g_cnt != counts) + (g_pairs != pairs) + (g_tiles != tiles_ref) +
               (g_status != bad_ids);
  EXPECT_EQ(g_off[size_t(E)], L - bad_ids);
  EXPECT_EQ(g_status, bad_ids);
  char extra[64];
  std::snprintf(extra, sizeof extra, ",bad_ids=%d,tile_rows=%d", bad_ids, ws.tile_rows);
  EXPECT_TRUE(contract_exact("moe_plan", shape_str(E, k, 0, 0, T, cap) + extra, mis));
}

TEST(MoePlan, MatchesCpuAndCountsLivePairsOnly) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 100;
  for (auto [E, k] : {std::pair{256, 8}, std::pair{16, 4}})
    for (int T : kTokenCounts) check_plan(E, k, T, T == 4096 ? 100 : 9, 0, ++seed);
  check_plan(256, 8, 0, 16, 0, ++seed);     // no live rows at all
  check_plan(256, 8, 17, 5, 2, ++seed);     // invalid live ids: counted in status, dropped
  check_plan(256, 8, 1500, 300, 3, ++seed); // same on the device-sort path
}

// ---- router logits: the wide-tile kernel against the 16 x 16-tile one ---------------------------------------
// Bytes of the live logits equal between router_logits_wide_kernel and router_logits_kernel (the same
// arithmetic per logit), both against the CPU, padding rows of x poisoned (NaN bytes) and the padding rows
// of the logits unwritten. H covers every K split (8, 4, 2), E a partial 128-expert tile and the smallest E.
void check_wide_logits(int E, int H, int T, int cap, uint64_t seed) {
  std::vector<uint16_t> xh, wh;
  std::vector<float> xf, wf;
  rand_bf16(size_t(T) * H, seed, 1.0f, xh, &xf);
  rand_bf16(size_t(E) * H, seed + 1, 2.0f / std::sqrt(float(H)), wh, &wf);
  xh.resize(size_t(cap) * H, 0xFFFF);  // padding rows: NaN
  DevBuf d_x(xh.size() * 2), d_w(wh.size() * 2), d_rows(4), d_tile(size_t(cap) * E * 4), d_wide(size_t(cap) * E * 4);
  upload(d_x.p, xh);
  upload(d_w.p, wh);
  upload(d_rows.p, std::vector<int32_t>{T});
  MOEFOLD_CUDA_CHECK(cudaMemset(d_tile.p, 0xFF, d_tile.bytes));
  MOEFOLD_CUDA_CHECK(cudaMemset(d_wide.p, 0xFF, d_wide.bytes));
  const MoeShape shape{cap, E, 8 < E ? 8 : 1, H, 64};
  moe_detail::set_router_logits_kind(moe_detail::RouterLogitsKind::kTile);
  moe_router_logits(d_x.as<__nv_bfloat16>(), d_w.as<__nv_bfloat16>(), d_rows.as<int32_t>(), shape, d_tile.as<float>(),
                    nullptr);
  moe_detail::set_router_logits_kind(moe_detail::RouterLogitsKind::kWide);
  moe_router_logits(d_x.as<__nv_bfloat16>(), d_w.as<__nv_bfloat16>(), d_rows.as<int32_t>(), shape, d_wide.as<float>(),
                    nullptr);
  moe_detail::set_router_logits_kind(moe_detail::RouterLogitsKind::kAuto);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const std::string shp = shape_str(E, shape.k, H, 0, T, cap);
  auto tile = download<uint32_t>(d_tile.p, size_t(T) * E);
  auto wide = download<uint32_t>(d_wide.p, size_t(T) * E);
  size_t mis = 0;
  for (size_t i = 0; i < tile.size(); ++i) mis += tile[i] != wide[i];
  EXPECT_TRUE(contract_exact("router_logits_wide_eq_tile", shp, mis));
  std::vector<float> lref(size_t(T) * E), lw(size_t(T) * E);
  cpu::linear(xf.data(), wf.data(), nullptr, lref.data(), T, H, E);
  std::memcpy(lw.data(), wide.data(), lw.size() * 4);
  EXPECT_TRUE(contract("router_logits_wide", shp, rel_err(lw, lref), 1e-5));
  const size_t pad = size_t(cap - T) * E * 4;
  EXPECT_TRUE(contract_exact("router_logits_wide_padding", shp,
                             count_unpoisoned(d_wide.as<float>() + size_t(T) * E, pad) +
                                 count_unpoisoned(d_tile.as<float>() + size_t(T) * E, pad)));
}

TEST(MoeRouter, WideLogitsEqualTileLogits) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 900;
  for (auto [E, H] : {std::pair{256, 2048}, std::pair{160, 768}, std::pair{64, 384}, std::pair{2, 128}})
    for (auto [T, cap] : {std::pair{1, 5}, std::pair{17, 130}, std::pair{129, 300}, std::pair{4100, 4200}})
      check_wide_logits(E, H, T, cap, seed += 7);
}

}  // namespace
}  // namespace moefold::cuda::moe_test
