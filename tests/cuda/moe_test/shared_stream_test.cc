// moe_test: the shared expert inside the streaming expert kernels (moe_forward_shared, MoeSharedStream.*)
// against the separate chain the other capacities run (invariant GEMM gate_up -> swiglu -> invariant
// GEMM down -> moe_forward with that shared_out): the layer output, the shared output, the shared act and
// the routed y of every live pair bitwise equal, with random weights, poisoned outputs and padding, the
// router's top-k and replayed routings onto expert 0 / E-1, live counts 0 and 1 in a captured graph,
// several shared tiles (forced streaming at capacities > 16), uneven K splits, and the fallbacks.
#include "cuda/moe_test/moe_test_util.h"
#include "core/error.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/invariant_gemm.h"
#include "ops/cuda/decode_gemm.h"

namespace moefold::cuda::moe_test {
namespace {

using bf16 = __nv_bfloat16;

/// A dense shared expert: gate_up [2 Is, H] (gate rows then up rows), down [H, Is], bf16.
struct SharedWeights {
  int H = 0, Is = 0;
  DevBuf gate_up, down;
};
std::unique_ptr<SharedWeights> make_shared_weights(int H, int Is, uint64_t seed) {
  auto s = std::make_unique<SharedWeights>();
  s->H = H, s->Is = Is;
  std::vector<uint16_t> h;
  rand_bf16(size_t(2) * Is * H, seed, 1.0f / std::sqrt(float(H)), h, nullptr);
  s->gate_up.alloc(h.size() * 2);
  upload(s->gate_up.p, h);
  rand_bf16(size_t(H) * Is, seed + 1, 1.0f / std::sqrt(float(Is)), h, nullptr);
  s->down.alloc(h.size() * 2);
  upload(s->down.p, h);
  return s;
}

enum class Route { kTopk, kExpert0, kExpertLast, kMixed };
const char* route_name(Route r) {
  switch (r) {
    case Route::kTopk: return "topk";
    case Route::kExpert0: return "expert0";
    case Route::kExpertLast: return "expertLast";
    default: return "mixed0Last";
  }
}
/// Replay ids of `rows` rows for a routing (empty for top-k): every slot expert 0, every slot E-1, or
/// per row {0, E-1, 1, E-2, ...} (distinct, both ends).
std::vector<int32_t> route_ids(Route r, int rows, int k, int E) {
  std::vector<int32_t> ids;
  if (r == Route::kTopk) return ids;
  for (int t = 0; t < rows; ++t)
    for (int s = 0; s < k; ++s)
      ids.push_back(r == Route::kExpert0 ? 0 : r == Route::kExpertLast ? E - 1 : (s % 2 == 0 ? s / 2 : E - 1 - s / 2));
  return ids;
}

/// The results of one run (live rows / pairs only) and the padding bytes written.
struct Outputs {
  std::vector<uint16_t> out, sout, act, y;  // out, shared out [L, H]; shared act [L, Is]; y [L * k, H]
  size_t pad_written = 0;                   // bytes of padding rows of out / sout / act / y not 0xFF
};

/// Device buffers of one capacity for both paths: the separate chain and moe_forward_shared.
struct SharedRig {
  const MoeWeights& w;
  const SharedWeights& s;
  int k, cap;
  MoeShape shape;
  DevBuf x, res, out, rows, replay, ws_mem, gu, act, sout, dg_ws;
  MoeWorkspace ws;
  SharedRig(const MoeWeights& w_, const SharedWeights& s_, int cap_, int expert_tiles)
      : w(w_), s(s_), k(w_.k), cap(cap_), shape{cap_, w_.E, w_.k, w_.H, w_.I, expert_tiles, true},
        x(size_t(cap_) * w_.H * 2), res(size_t(cap_) * w_.H * 2), out(size_t(cap_) * w_.H * 2), rows(4),
        replay(size_t(cap_) * w_.k * 4), ws_mem(moe_workspace_bytes(shape)), gu(size_t(cap_) * 2 * s_.Is * 2),
        act(size_t(cap_) * s_.Is * 2), sout(size_t(cap_) * w_.H * 2),
        dg_ws(std::max(decode_gemm_workspace_bytes(kDecodeGemmMaxRows, 2 * s_.Is, w_.H),
                       decode_gemm_workspace_bytes(kDecodeGemmMaxRows, w_.H, s_.Is))) {
    ws = moe_workspace_bind(ws_mem.p, ws_mem.bytes, shape);
    MOEFOLD_CUDA_CHECK(cudaMemset(dg_ws.p, 0, dg_ws.bytes));  // the decode GEMM's counters start at zero
  }
  MoeSharedExpert shared() {
    return MoeSharedExpert{s.gate_up.as<bf16>(), s.down.as<bf16>(), s.Is, act.as<bf16>(), sout.as<bf16>()};
  }
  /// The chain of the other capacities: invariant GEMM -> swiglu -> invariant GEMM -> moe_forward.
  void separate(bool with_replay, cudaStream_t st) {
    const int32_t* live = rows.as<int32_t>();
    invariant_gemm_bf16(x.as<bf16>(), s.gate_up.as<bf16>(), nullptr, gu.as<bf16>(), cap, w.H, 2 * s.Is, live,
                        dg_ws.p, st);
    swiglu(gu.as<bf16>(), act.as<bf16>(), cap, s.Is, live, st);
    invariant_gemm_bf16(act.as<bf16>(), s.down.as<bf16>(), nullptr, sout.as<bf16>(), cap, s.Is, w.H, live, dg_ws.p, st);
    moe_forward(x.as<bf16>(), w.d_router.as<bf16>(), w.d_gate_up.as<bf16>(), w.d_down.as<bf16>(), sout.as<bf16>(),
                w.d_shared_gate.as<bf16>(), res.as<bf16>(), live, shape, true, ws, out.as<bf16>(), st,
                with_replay ? replay.as<int32_t>() : nullptr);
  }
  void fused(bool with_replay, cudaStream_t st) {
    moe_forward_shared(x.as<bf16>(), w.d_router.as<bf16>(), w.d_gate_up.as<bf16>(), w.d_down.as<bf16>(), shared(),
                       w.d_shared_gate.as<bf16>(), res.as<bf16>(), rows.as<int32_t>(), shape, true, ws, out.as<bf16>(),
                       st, with_replay ? replay.as<int32_t>() : nullptr);
  }
  /// Live rows [0, L) of xh / resh / ids; padding rows of x and res NaN / huge, replay entries of padding
  /// rows naming real experts; workspace, out, gu, act, sout poisoned (0xFF).
  void prepare(const std::vector<uint16_t>& xh, const std::vector<uint16_t>& resh, const std::vector<int32_t>& ids,
               int L) {
    const int H = w.H;
    const uint16_t garbage[3] = {0x7FC0, 0x7F7F, 0xFF7F};
    std::vector<uint16_t> hx(size_t(cap) * H), hr(size_t(cap) * H);
    for (size_t i = 0; i < hx.size(); ++i) {
      const bool live = i < size_t(L) * H;
      hx[i] = live ? xh[i] : garbage[i % 3];
      hr[i] = live ? resh[i] : garbage[(i + 1) % 3];
    }
    upload(x.p, hx), upload(res.p, hr);
    std::vector<int32_t> rp(size_t(cap) * k);
    for (size_t i = 0; i < rp.size(); ++i)
      rp[i] = i < size_t(L) * k && !ids.empty() ? ids[i] : int32_t((i * 5 + 1) % size_t(w.E));
    upload(replay.p, rp);
    upload(rows.p, std::vector<int32_t>{L});
    for (DevBuf* b : {&ws_mem, &out, &gu, &act, &sout}) MOEFOLD_CUDA_CHECK(cudaMemset(b->p, 0xFF, b->bytes));
  }
  Outputs collect(int L) const {
    const size_t H = size_t(w.H), Is = size_t(s.Is), P = size_t(cap) * k, LP = size_t(L) * k;
    Outputs o;
    o.out = download<uint16_t>(out.p, size_t(L) * H);
    o.sout = download<uint16_t>(sout.p, size_t(L) * H);
    o.act = download<uint16_t>(act.p, size_t(L) * Is);
    o.y = download<uint16_t>(ws.y, LP * H);
    o.pad_written = count_unpoisoned(out.as<uint16_t>() + L * H, (cap - L) * H * 2) +
                    count_unpoisoned(sout.as<uint16_t>() + L * H, (cap - L) * H * 2) +
                    count_unpoisoned(act.as<uint16_t>() + L * Is, (cap - L) * Is * 2) +
                    count_unpoisoned(ws.y + LP * H, (P - LP) * H * 2);
    return o;
  }
};

size_t mismatches(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

/// Inputs of `rows` rows: x, residual (bf16 bits).
struct Inputs {
  std::vector<uint16_t> xh, resh;
};
Inputs inputs(int rows, int H, uint64_t seed) {
  Inputs in;
  rand_bf16(size_t(rows) * H, seed, 1.0f, in.xh, nullptr);
  rand_bf16(size_t(rows) * H, seed + 1, 1.0f, in.resh, nullptr);
  return in;
}

/// Eager runs of both paths at capacity `cap` (expert_tiles: -1 chosen, 4 forced streaming) for each
/// live count; every result bitwise equal, nothing written in padding, and the shared output not all
/// zero (the comparison must see real values).
void check_eager(const MoeWeights& w, const SharedWeights& s, int cap, int expert_tiles, const std::vector<int>& lives,
                 Route route, uint64_t seed) {
  SharedRig rig(w, s, cap, expert_tiles);
  ASSERT_TRUE(moe_shared_fusable(rig.shape, s.Is));
  ASSERT_EQ(moe_expert_config(rig.shape), kMoeExpertStream);
  const Inputs in = inputs(cap, w.H, seed);
  const std::vector<int32_t> ids = route_ids(route, cap, w.k, w.E);
  for (int L : lives) {
    rig.prepare(in.xh, in.resh, ids, L);
    rig.separate(!ids.empty(), nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    const Outputs a = rig.collect(L);
    rig.prepare(in.xh, in.resh, ids, L);
    rig.fused(!ids.empty(), nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    const Outputs b = rig.collect(L);
    const std::string shp = fmt::format("E={},k={},H={},I={},Is={},cap={},live={},tiles={},{}", w.E, w.k, w.H, w.I,
                                        s.Is, cap, L, expert_tiles, route_name(route));
    size_t nonzero = 0;
    for (uint16_t v : b.sout) nonzero += (v & 0x7FFF) != 0;
    EXPECT_TRUE(contract_exact("moe_shared_stream_out_eq_separate", shp, mismatches(a.out, b.out)));
    EXPECT_TRUE(contract_exact("moe_shared_stream_shared_out_eq_separate", shp, mismatches(a.sout, b.sout)));
    EXPECT_TRUE(contract_exact("moe_shared_stream_shared_act_eq_separate", shp, mismatches(a.act, b.act)));
    EXPECT_TRUE(contract_exact("moe_shared_stream_routed_y_eq_separate", shp, mismatches(a.y, b.y)));
    EXPECT_TRUE(contract_exact("moe_shared_stream_padding_untouched", shp, a.pad_written + b.pad_written));
    EXPECT_TRUE(contract_exact("moe_shared_stream_shared_out_nonzero", shp, L > 0 && nonzero == 0 ? 1 : 0));
  }
}

MoeWeights& uneven_weights() {  // H = 640: gate_up's 10 K steps in S(128, 640) = 4 uneven splits
  static std::unique_ptr<MoeWeights> w = make_weights(8, 2, 640, 64, 6100);
  return *w;
}

// The 35B shape at capacity 1 (the decode graph of one sequence; S = 16 gate_up splits, 4 down), every
// routing; the small shape at capacity 1 (S = 2 / 1) and forced at 20 rows (two shared tiles, live
// counts across the tile boundary); uneven splits.
// Both kernel configurations (4 warps a CTA, and the wide 5-warp one).
TEST(MoeSharedStream, BitwiseVsSeparate) {
  MOEFOLD_REQUIRE_GPU();
  static std::unique_ptr<SharedWeights> s35 = make_shared_weights(2048, 512, 6000);
  MoeWeights& sw = small_weights();
  static std::unique_ptr<SharedWeights> ssmall = make_shared_weights(sw.H, sw.I, 6020);
  static std::unique_ptr<SharedWeights> suneven = make_shared_weights(uneven_weights().H, uneven_weights().I, 6030);
  EXPECT_EQ(decode_gemm_splits(2 * 64, 640), 4);  // 10 K steps: splits of 2, 3, 2, 3
  EXPECT_EQ(decode_gemm_splits(2 * 512, 2048), 16);
  EXPECT_EQ(decode_gemm_splits(2048, 512), 4);
  for (bool wide : {false, true}) {
    moe_detail::set_stream_wide(wide);
    uint64_t seed = 6010;
    for (Route r : {Route::kTopk, Route::kExpert0, Route::kExpertLast, Route::kMixed})
      check_eager(real_weights(), *s35, 1, -1, {1}, r, ++seed);
    for (Route r : {Route::kTopk, Route::kExpertLast}) check_eager(sw, *ssmall, 1, -1, {1}, r, ++seed);
    for (Route r : {Route::kTopk, Route::kExpert0})
      check_eager(sw, *ssmall, 20, kMoeExpertStream, {20, 17, 16, 1}, r, ++seed);
    check_eager(uneven_weights(), *suneven, 1, -1, {1}, Route::kTopk, ++seed);
    check_eager(uneven_weights(), *suneven, 5, kMoeExpertStream, {5, 2}, Route::kMixed, ++seed);
  }
  moe_detail::reset_stream_wide();
}

// The fused layer captured once in a graph at capacity 1 and replayed at live 1 (two input sets) and 0:
// live 1 equals the separate chain run eagerly on the same inputs; live 0 writes nothing at all.
TEST(MoeSharedStream, GraphReplayLive01) {
  MOEFOLD_REQUIRE_GPU();
  static std::unique_ptr<SharedWeights> s35 = make_shared_weights(2048, 512, 6100);
  for (MoeWeights* w : {&real_weights(), &small_weights()}) {
    std::unique_ptr<SharedWeights> small;
    const SharedWeights* s = s35.get();
    if (w->H != 2048) {
      small = make_shared_weights(w->H, w->I, 6110);
      s = small.get();
    }
    SharedRig rig(*w, *s, 1, -1);
    const Inputs in[2] = {inputs(1, w->H, 6120), inputs(1, w->H, 6130)};
    const std::vector<int32_t> none;
    cudaStream_t st;
    MOEFOLD_CUDA_CHECK(cudaStreamCreate(&st));
    rig.prepare(in[0].xh, in[0].resh, none, 1);
    rig.fused(false, st);  // eager warm-up (kernel attributes) before the capture
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    rig.fused(false, st);
    MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int step = 0; step < 4; ++step) {
      const int L = step == 1 || step == 3 ? 0 : 1;
      const Inputs& cur = in[step / 2];
      const std::string shp = fmt::format("E={},k={},H={},I={},cap=1,live={},replay={}", w->E, w->k, w->H, w->I, L, step);
      Outputs sep;
      if (L == 1) {
        rig.prepare(cur.xh, cur.resh, none, 1);
        rig.separate(false, st);
        MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
        sep = rig.collect(1);
      }
      rig.prepare(cur.xh, cur.resh, none, L);
      MOEFOLD_CUDA_CHECK(cudaGraphLaunch(exec, st));
      MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
      if (L == 1) {
        const Outputs g = rig.collect(1);
        EXPECT_TRUE(contract_exact("moe_shared_stream_graph_out_eq_separate", shp,
                                   mismatches(sep.out, g.out) + mismatches(sep.sout, g.sout) + mismatches(sep.act, g.act) +
                                       mismatches(sep.y, g.y)));
      } else {  // nothing written: out, shared out / act, the routed act and y
        const size_t written = count_unpoisoned(rig.out.p, rig.out.bytes) + count_unpoisoned(rig.sout.p, rig.sout.bytes) +
                               count_unpoisoned(rig.act.p, rig.act.bytes) +
                               count_unpoisoned(rig.ws.act, size_t(w->k) * w->I * 2) +
                               count_unpoisoned(rig.ws.y, size_t(w->k) * w->H * 2);
        EXPECT_TRUE(contract_exact("moe_shared_stream_graph_live0_nothing_written", shp, written));
      }
    }
    MOEFOLD_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MOEFOLD_CUDA_CHECK(cudaGraphDestroy(graph));
    MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
  }
}

// Where the fused layer does not apply it is refused (moefold::Error, nothing launched) and the callers
// keep the separate chain: a shared intermediate different from I, capacities on the tiles (batch
// invariant, capacity 2) or the GEMV (not invariant). A model without a shared expert runs moe_forward
// with no shared_out: its routed y equals the fused layer's (the routed items keep their bits).
TEST(MoeSharedStream, FallbacksAndNoSharedExpert) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  static std::unique_ptr<SharedWeights> half = make_shared_weights(w.H, w.I / 2, 6200),
                                        same = make_shared_weights(w.H, w.I, 6210);
  const MoeShape one{1, w.E, w.k, w.H, w.I, -1, true}, two{2, w.E, w.k, w.H, w.I, -1, true},
      gemv{1, w.E, w.k, w.H, w.I, -1, false};
  EXPECT_FALSE(moe_shared_fusable(one, w.I / 2));
  EXPECT_FALSE(moe_shared_fusable(one, 0));
  EXPECT_FALSE(moe_shared_fusable(two, w.I));
  EXPECT_FALSE(moe_shared_fusable(gemv, w.I));
  EXPECT_TRUE(moe_shared_fusable(one, w.I));
  {
    SharedRig rig(w, *half, 1, -1);
    const Inputs in = inputs(1, w.H, 6220);
    rig.prepare(in.xh, in.resh, {}, 1);
    EXPECT_THROW(rig.fused(false, nullptr), Error);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(contract_exact("moe_shared_stream_refused_nothing_written", "Is=I/2",
                               count_unpoisoned(rig.out.p, rig.out.bytes) + count_unpoisoned(rig.sout.p, rig.sout.bytes)));
  }
  {
    SharedRig rig(w, *same, 2, -1);  // batch invariant at capacity 2: the 16-row tiles
    const Inputs in = inputs(2, w.H, 6230);
    rig.prepare(in.xh, in.resh, {}, 2);
    EXPECT_THROW(rig.fused(false, nullptr), Error);
  }
  SharedRig rig(w, *same, 1, -1);
  for (uint64_t seed : {6240, 6250}) {
    const Inputs in = inputs(1, w.H, seed);
    rig.prepare(in.xh, in.resh, {}, 1);
    moe_forward(rig.x.as<bf16>(), w.d_router.as<bf16>(), w.d_gate_up.as<bf16>(), w.d_down.as<bf16>(), nullptr, nullptr,
                rig.res.as<bf16>(), rig.rows.as<int32_t>(), rig.shape, true, rig.ws, rig.out.as<bf16>(), nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    const auto y_plain = download<uint16_t>(rig.ws.y, size_t(w.k) * w.H);
    rig.prepare(in.xh, in.resh, {}, 1);
    rig.fused(false, nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    const auto y_fused = download<uint16_t>(rig.ws.y, size_t(w.k) * w.H);
    EXPECT_TRUE(contract_exact("moe_shared_stream_routed_y_eq_no_shared", fmt::format("seed={}", seed),
                               mismatches(y_plain, y_fused)));
  }
}

// For compute-sanitizer (memcheck / racecheck): the fused layer at the small shape, capacity 1 and
// forced at 20 rows, early and late down, both configurations.
TEST(MoeSharedStream, SanitizeSmall) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  static std::unique_ptr<SharedWeights> s = make_shared_weights(w.H, w.I, 6300);
  for (bool wide : {false, true})
    for (bool early : {true, false}) {
      moe_detail::set_stream_wide(wide);
      moe_detail::set_stream_early_down(early);
      check_eager(w, *s, 1, -1, {1, 0}, Route::kTopk, 6310);
      check_eager(w, *s, 20, kMoeExpertStream, {17}, Route::kMixed, 6320);
    }
  moe_detail::set_stream_early_down(true);
  moe_detail::reset_stream_wide();
}

// The smallest launch of SanitizeSmall's kind, for compute-sanitizer racecheck in seconds: the fused layer
// at capacity 1, 5-warp configuration, early down. At this shape (H 256, I 128) a warp's ring is deeper
// than its steps (gate_up 4 K steps against 6 stages, down 2 against 5), the case whose prologue once
// committed too few cp.async groups (racecheck: RAW hazards, cp_async16 -> ldmatrix_x4 in one thread).
TEST(MoeSharedStream, SanitizeTiny) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  static std::unique_ptr<SharedWeights> s = make_shared_weights(w.H, w.I, 6300);
  moe_detail::set_stream_wide(true);
  moe_detail::set_stream_early_down(true);
  check_eager(w, *s, 1, -1, {1, 0}, Route::kTopk, 6310);
  moe_detail::reset_stream_wide();
}

}  // namespace
}  // namespace moefold::cuda::moe_test
