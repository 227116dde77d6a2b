// moe_test: the whole routed chain (moe_forward) against the CPU, padding, tile configurations.
#include "cuda/moe_test/moe_test_util.h"

namespace moefold::cuda::moe_test {
namespace {

/// Full contract of one (weights, T) case: padded run vs CPU and vs an unpadded run.
void check_chain(MoeWeights& w, int T, int pad, bool with_residual, uint64_t seed) {
  const int E = w.E, k = w.k, H = w.H, I = w.I;
  const int cap = T + pad;
  std::vector<uint16_t> xh, shh, resh;
  std::vector<float> xf, shf, resf;
  rand_bf16(size_t(T) * H, seed, 1.0f, xh, &xf);
  rand_bf16(size_t(T) * H, seed + 1, 0.5f, shh, &shf);
  if (with_residual) rand_bf16(size_t(T) * H, seed + 2, 1.0f, resh, &resf);
  const std::string shp = shape_str(E, k, H, I, T, cap);

  ChainRun g = run_chain(w, T, cap, xh, shh, resh);

  // Router logits vs CPU fp32 (same bf16-rounded inputs; only the summation order differs).
  std::vector<float> lref(size_t(T) * E);
  cpu::linear(xf.data(), w.router.data(), nullptr, lref.data(), T, H, E);
  EXPECT_TRUE(contract("moe_router_logits", shp, rel_err(g.logits, lref), 1e-5));

  // Top-k on the GPU's own logits: ids exact, weights to fp32 rounding.
  std::vector<int32_t> iref(size_t(T) * k);
  std::vector<float> wref(size_t(T) * k);
  cpu::router_topk(g.logits.data(), T, E, k, true, iref.data(), wref.data());
  size_t id_mis = 0;
  for (size_t i = 0; i < iref.size(); ++i) id_mis += g.ids[i] != iref[i];
  EXPECT_TRUE(contract_exact("moe_router_topk_ids", shp, id_mis));
  EXPECT_TRUE(contract("moe_router_topk_weights", shp, rel_err(g.weights, wref), 1e-6));

  // Plan: exactly T * k pairs, grouped like cpu::moe_plan, tiles as expected, no padding read.
  cpu::MoePlan pref = cpu::moe_plan(g.ids.data(), T, k, E);
  size_t plan_mis = 0;
  for (int e = 0; e <= E; ++e) plan_mis += g.offsets[size_t(e)] != pref.offsets[size_t(e)];
  for (int e = 0; e < E; ++e) plan_mis += g.counts[size_t(e)] != pref.offsets[size_t(e + 1)] - pref.offsets[size_t(e)];
  if (g.pairs.size() == pref.pairs.size()) {
    for (size_t i = 0; i < g.pairs.size(); ++i) plan_mis += g.pairs[i] != pref.pairs[i];
  } else {
    plan_mis += 1000000;
  }
  int tiles_ref = 0;
  for (int e = 0; e < E; ++e)
    tiles_ref += (pref.offsets[size_t(e + 1)] - pref.offsets[size_t(e)] + g.tile_rows - 1) / g.tile_rows;
  EXPECT_EQ(g.offsets[size_t(E)], T * k) << "planned pairs must be exactly live_rows * k";
  EXPECT_EQ(g.num_tiles, tiles_ref);
  EXPECT_EQ(g.status, 0);
  plan_mis += (g.offsets[size_t(E)] != T * k) + (g.num_tiles != tiles_ref) + (g.status != 0);
  EXPECT_TRUE(contract_exact("moe_plan", shp, plan_mis));

  // Output vs CPU: routed experts with the GPU's ids/weights, + sigmoid(gate . x) * shared (+ residual).
  const std::vector<float> ref = reference_rows(w, k, T, xf, shf, resf, g.ids.data(), g.weights.data());
  EXPECT_TRUE(contract("moe_forward", shp + (with_residual ? ",residual" : ""), rel_err(from_bf16(g.out), ref), 1e-2));

  // Padding: nothing written, nothing routed, nothing run.
  const size_t pad_written =
      g.pad_out_bytes_written + g.pad_logits + g.pad_ids + g.pad_weights + g.pad_act + g.pad_y;
  EXPECT_EQ(g.pad_out_bytes_written, 0u);
  EXPECT_EQ(g.pad_logits, 0u);
  EXPECT_EQ(g.pad_ids, 0u);
  EXPECT_EQ(g.pad_weights, 0u);
  EXPECT_EQ(g.pad_act, 0u);
  EXPECT_EQ(g.pad_y, 0u);
  EXPECT_TRUE(contract_exact("moe_padding_untouched", shp, pad_written));

  // Live rows equal an unpadded run, bit for bit, on the same expert path (the GEMV of capacities <= 16
  // and the tiles differ in the last bits: moe.h).
  if (pad > 0) {
    ChainRun u = run_chain(w, T, T, xh, shh, resh, moe_expert_config(MoeShape{cap, E, k, H, I}));
    size_t mis = 0;
    for (size_t i = 0; i < u.out.size(); ++i) mis += u.out[i] != g.out[i];
    for (size_t i = 0; i < u.ids.size(); ++i) mis += u.ids[i] != g.ids[i];
    EXPECT_TRUE(contract_exact("moe_padded_eq_unpadded", shp, mis));
  }
}

// ---- the whole chain --------------------------------------------------------------------------------------
TEST(MoeChain, E16k4) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  uint64_t seed = 300;
  for (int T : kTokenCounts) check_chain(w, T, T == 4096 ? 0 : 5 + T % 3, T % 2 == 1, ++seed);
  check_chain(w, 1000, 24, false, ++seed);
}

// The fixtures' shape (hidden 128, intermediate 64: one or two K tiles) in a large bucket with few live
// rows, as the CUDA executor runs it (capacity = the most rows a step may hold).
TEST(MoeChain, TinyShapeLargeCapacityFewLiveRows) {
  MOEFOLD_REQUIRE_GPU();
  static std::unique_ptr<MoeWeights> w = make_weights(16, 4, 128, 64, 2500);
  uint64_t seed = 700;
  for (int T : {1, 2, 7, 63, 64, 65, 130}) check_chain(*w, T, 0, false, ++seed);
  for (int T : {1, 2, 7, 63, 64, 65, 130}) check_chain(*w, T, 2048 - T, T % 2 == 1, ++seed);
  static std::unique_ptr<MoeWeights> w8 = make_weights(8, 2, 128, 64, 2600);
  for (int T : {1, 63, 130}) check_chain(*w8, T, 2048 - T, false, ++seed);
}

TEST(MoeChain, E256k8RealShape) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = real_weights();
  uint64_t seed = 500;
  for (int T : kTokenCounts) check_chain(w, T, T == 4096 ? 0 : 7, T % 2 == 1, ++seed);
  check_chain(w, 1024, 0, false, ++seed);  // the medium tile configuration at the real shape
}

// Every tensor-core expert configuration (tiles of 16 / 64 / 128 rows, the streaming kernels) computes
// the same bits (same per-element mma order), so the choice by capacity never changes results.
TEST(MoeChain, TileConfigsBitIdentical) {
  MOEFOLD_REQUIRE_GPU();
  for (MoeWeights* w : {&small_weights(), &real_weights()})
    for (int T : {1, 5, 16, 100}) {
      std::vector<uint16_t> xh, shh, none;
      rand_bf16(size_t(T) * w->H, 77 + T, 1.0f, xh, nullptr);
      rand_bf16(size_t(T) * w->H, 78 + T, 0.5f, shh, nullptr);
      ChainRun base = run_chain(*w, T, T + 3, xh, shh, none, 0);
      for (int cfg : {1, 2, kMoeExpertStream, -kMoeExpertStream}) {  // -: down without the early start
        moe_detail::set_stream_early_down(cfg >= 0);
        ChainRun r = run_chain(*w, T, T + 3, xh, shh, none, std::abs(cfg));
        moe_detail::set_stream_early_down(true);
        size_t mis = 0;
        for (size_t i = 0; i < r.out.size(); ++i) mis += r.out[i] != base.out[i];
        mis += (r.pad_out_bytes_written + r.pad_act + r.pad_y) + (r.offsets != base.offsets) + (r.pairs != base.pairs);
        char shp[96];
        std::snprintf(shp, sizeof shp, "E=%d,k=%d,H=%d,T=%d,tiles=%d_vs_0", w->E, w->k, w->H, T, cfg);
        EXPECT_TRUE(contract_exact("moe_tile_configs_bit_identical", shp, mis));
      }
    }
}

// Step shapes: a workspace bound for 4,096 rows serving steps of 1 .. 113 rows (the executor's decode
// steps) gives bit-identical results to a workspace bound for the step itself, with the step's tiles.
TEST(MoeChain, StepShapeInLargeWorkspaceBitIdentical) {
  MOEFOLD_REQUIRE_GPU();
  for (MoeWeights* w : {&small_weights(), &real_weights()})
    for (int T : {1, 16, 113}) {
      std::vector<uint16_t> xh, shh, none;
      rand_bf16(size_t(T) * w->H, 91 + T, 1.0f, xh, nullptr);
      rand_bf16(size_t(T) * w->H, 92 + T, 0.5f, shh, nullptr);
      ChainRun base = run_chain(*w, T, T + 3, xh, shh, none);
      ChainRun r = run_chain(*w, T, T + 3, xh, shh, none, -1, 4096);
      size_t mis = 0;
      for (size_t i = 0; i < r.out.size(); ++i) mis += r.out[i] != base.out[i];
      mis += (r.pad_out_bytes_written + r.pad_act + r.pad_y) + (r.offsets != base.offsets) + (r.pairs != base.pairs) +
             (r.num_tiles != base.num_tiles);
      char shp[96];
      std::snprintf(shp, sizeof shp, "E=%d,k=%d,H=%d,T=%d,bound=4096", w->E, w->k, w->H, T);
      EXPECT_TRUE(contract_exact("moe_step_shape_bit_identical", shp, mis));
    }
}

// Small cases for compute-sanitizer (memcheck / racecheck): every kernel and both plan paths.
TEST(MoeChain, SanitizeSmall) {
  MOEFOLD_REQUIRE_GPU();
  check_chain(small_weights(), 3, 4, true, 900);
}
TEST(MoeChain, Sanitize) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  check_chain(w, 130, 6, false, 901);
  check_chain(w, 1100, 30, false, 902);
}

}  // namespace
}  // namespace moefold::cuda::moe_test
