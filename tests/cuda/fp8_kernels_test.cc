// Contract tests of the block-scaled FP8 kernels (src/ops/cuda/fp8_gemv.h, moe_fp8.h; the tensor-core
// ones of fp8_mma.cuh and the CUDA-core ones of fp8.cuh) against the ideal quantised chain in fp64
// (src/ops/cpu/fp8_ideal.h: the same quantised weights, exact arithmetic; the kernels are W8A16, so the
// reference takes the activations as given): rows 1, 2, 17, 64, 113, 114, 128, 256 (dense) and 1, 2, 17,
// 64 (+ 113, 114, 128) tokens (experts) at a capacity above the live count (live count read from device
// memory), poisoned outputs, padding rows untouched (bytes), a row alone bitwise equal to the same row in
// the batch, partial blocks (K 64 .. 2112, N 48 .. 300, I 192 .. 2112), E 8 .. 512, routing replays in
// which only expert 0 (resp. only expert E-1) is routed, the exact e4m3 decoding (one-hot rows), fp32
// outputs (the FP8 lm_head) and the device quantisation of dummy weights. The stage probes (after the
// expert GEMMs, per slot, after the combine) are printed against the chain with FP8 activations (1 x 128)
// too, for scale. Skips without a GPU. Fp8Bench.* (MOEFOLD_FP8_BENCH=1) prints the decode-size bandwidth
// table (L2 flushed per run), the tensor-core kernels beside the CUDA-core ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/fp8_block.h"
#include "models/dummy_init.h"
#include "cuda/contract.h"
#include "cuda/fp8_test_util.h"
#include "cuda/cuda_test_util.h"
#include "ops/cpu/fp8_ideal.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/fp8_gemv.h"
#include "ops/cuda/moe_fp8.h"

namespace moefold::cuda {
namespace {

using test::contract;
using test::contract_exact;
using bf16 = __nv_bfloat16;
using namespace fp8test;





// ---- dense ---------------------------------------------------------------------------------------

enum class Dense { Mma, Simt };

/// The dense kernel under test: the tensor-core fp8_gemv (default) or the CUDA-core one.
void run_dense(Dense which, const bf16* x, const DevFp8& w, const bf16* b, bf16* y, int64_t cap, int64_t K, int64_t N,
               const int32_t* live) {
  if (which == Dense::Mma) fp8_gemv(x, w.q.data(), w.s.data(), b, y, cap, K, N, live, nullptr);
  else fp8_gemv_simt(x, w.q.data(), w.s.data(), b, y, cap, K, N, live, nullptr);
}

void dense_case(int64_t K, int64_t N, int64_t T, int64_t cap, bool bias, Dense which = Dense::Mma) {
  const std::string shape = "K=" + std::to_string(K) + ",N=" + std::to_string(N) + ",T=" + std::to_string(T) +
                            ",cap=" + std::to_string(cap) + (bias ? ",bias" : "") +
                            (which == Dense::Simt ? ",simt" : "");
  const Fp8Weight w = rand_fp8(N, K, uint64_t(K * 31 + N));
  DevFp8 dw(w);
  std::vector<float> x = test::rand_bf16(size_t(cap * K), uint64_t(T + 7));
  std::vector<float> b = test::rand_bf16(size_t(N), 99, 0.5f);
  auto dx = test::dev_bf16(x);
  auto db = test::dev_bf16(b);
  DeviceBuffer<bf16> y(size_t(cap * N));
  y.fill_bytes(0xFF);
  DeviceBuffer<int32_t> live(1);
  live.upload(std::vector<int32_t>{int32_t(T)});
  run_dense(which, dx.data(), dw, bias ? db.data() : nullptr, y.data(), cap, K, N, live.data());
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto yb = bits_of(y);
  std::vector<double> ref = cpu::fp8_linear_ideal(x.data(), T, w, false);
  if (bias)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) ref[size_t(t * N + n)] += double(b[size_t(n)]);
  const auto got = to_f32(yb, 0, size_t(T * N));
  EXPECT_TRUE(contract("fp8_gemv", shape, cpu::rel_err(got.data(), ref.data(), got.size()), 4e-3));
  EXPECT_TRUE(contract_exact("fp8_gemv:padding_untouched", shape, test::touched(yb, size_t(T * N), yb.size())));
  // Batch invariance: the last live row computed alone (max_rows 1) has the same bits.
  DeviceBuffer<bf16> y1(static_cast<size_t>(N));
  run_dense(which, dx.data() + (T - 1) * K, dw, bias ? db.data() : nullptr, y1.data(), 1, K, N, nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto y1b = bits_of(y1);
  size_t diff = 0;
  for (int64_t n = 0; n < N; ++n) diff += y1b[size_t(n)] != yb[size_t((T - 1) * N + n)];
  EXPECT_TRUE(contract_exact("fp8_gemv:row_alone_bitwise", shape, diff));
}


// K x N: partial scale blocks along K (64, 192, 448, 576, 2112: 0.5 .. 16.5 blocks) and along N (100,
// 130, 272, 300), every warps-along-K split (K 64 .. 4096 -> WK 1, 2, 4, 8).
TEST(Fp8Gemv, ContractVsIdealChain) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<std::pair<int64_t, int64_t>> shapes = {{2048, 512}, {576, 192}, {144, 100}, {4096, 272}, {64, 80},
                                                     {192, 130}, {448, 256}, {2112, 300}, {1024, 48}};
  if (small_only()) shapes = {{576, 192}, {144, 100}, {64, 80}};
  for (auto [K, N] : shapes)
    for (int64_t T : {1, 2, 17, 64, 113, 114, 128, 256})
      dense_case(K, N, T, T == 256 ? 256 : std::max<int64_t>(T + 3, 64), false);
  dense_case(576, 1536, 17, 32, true);
  dense_case(2112, 300, 64, 64, true);
  // The CUDA-core kernel of before, for the record (the benchmarks' baseline).
  for (int64_t T : {1, 17, 64}) dense_case(576, 192, T, 64, false, Dense::Simt);
}

// fp32 outputs (the FP8 lm_head), and the decoding exact: x = unit rows e_r, so y[r, n] is the weight
// value f8(w[n, r]) * scale itself, exactly (every one of the 254 finite e4m3 codes, subnormals too).
TEST(Fp8Gemv, F32OutAndExactDecoding) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t K = 256, N = 272, T = 256;
  Fp8Weight w;
  w.rows = N;
  w.cols = K;
  w.q.resize(size_t(N * K));
  for (int64_t i = 0; i < N * K; ++i) {
    const uint8_t b = uint8_t((i * 7 + i / K) & 0xff);
    w.q[size_t(i)] = (b & 0x7f) == 0x7f ? 0 : b;  // no NaN codes
  }
  w.scale.resize(size_t(N * w.col_blocks()));
  for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = std::ldexp(0.37f + 0.01f * float(i % 13), int(i % 9) - 4);
  DevFp8 dw(w);
  std::vector<float> x(size_t(T * K), 0.0f);
  for (int64_t r = 0; r < T; ++r) x[size_t(r * K + r)] = 1.0f;
  auto dx = test::dev_bf16(x);
  DeviceBuffer<float> y(size_t(T * N));
  fp8_gemv_f32out(dx.data(), dw.q.data(), dw.s.data(), nullptr, y.data(), T, K, N, nullptr, nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> yh(size_t(T * N));
  y.download(yh.data(), yh.size());
  size_t bad = 0;
  for (int64_t r = 0; r < T; ++r)
    for (int64_t n = 0; n < N; ++n) {
      const float want = w.value(n, r), got = yh[size_t(r * N + n)];
      bad += !(want == got);  // exact (a -0 weight may come back +0: the mma adds +0 partials)
    }
  EXPECT_TRUE(contract_exact("fp8_gemv_f32out:unit_rows_exact", "K=256,N=272,T=256", bad));
  // The lm_head shape class (fp32 out, bias) against the ideal chain.
  const Fp8Weight wr = rand_fp8(1000, 576, 3);
  DevFp8 dwr(wr);
  for (int64_t t : {1, 17, 64}) {
    std::vector<float> xr = test::rand_bf16(size_t(t * 576), uint64_t(t));
    std::vector<float> b(1000, 0.25f);
    auto dxr = test::dev_bf16(xr);
    DeviceBuffer<float> db(b.size()), yr(size_t(t * 1000));
    db.upload(b);
    fp8_gemv_f32out(dxr.data(), dwr.q.data(), dwr.s.data(), db.data(), yr.data(), t, 576, 1000, nullptr, nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(size_t(t * 1000));
    yr.download(got.data(), got.size());
    std::vector<double> ref = cpu::fp8_linear_ideal(xr.data(), t, wr, false);
    for (auto& v : ref) v += 0.25;
    EXPECT_TRUE(contract("fp8_gemv_f32out", "K=576,N=1000,T=" + std::to_string(t),
                         cpu::rel_err(got.data(), ref.data(), got.size()), 1e-5));
  }
}

TEST(Fp8Gemv, DequantiseIsExactBf16OfTheProduct) {
  MOEFOLD_REQUIRE_GPU();
  const Fp8Weight w = rand_fp8(300, 576, 5);
  DevFp8 dw(w);
  DeviceBuffer<bf16> out(w.q.size());
  fp8_dequantize_bf16(dw.q.data(), dw.s.data(), w.rows, w.cols, out.data(), nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ob = bits_of(out);
  size_t bad = 0;
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) bad += ob[size_t(r * w.cols + c)] != f32_to_bf16(w.value(r, c));
  EXPECT_TRUE(contract_exact("fp8_dequantize_bf16", "300x576", bad));
}

// --load-format dummy -q fp8 on the GPU: the device quantisation of a recipe equals fp8_quantize of its
// host values, bit for bit (q and scales), partial blocks in both dims, several matrices.
TEST(Fp8Quantize, DummyOnTheDeviceEqualsTheHost) {
  MOEFOLD_REQUIRE_GPU();
  const DummyRecipe r{0x1234abcdull, 0.03f};
  const int64_t mats = 3, rows = 200, cols = 300;
  std::vector<float> host(size_t(mats * rows * cols));
  for (size_t i = 0; i < host.size(); ++i) host[i] = dummy_value(r, int64_t(i));
  const Fp8Weight want = fp8_quantize(host.data(), mats, rows, cols);
  DeviceBuffer<uint8_t> q(want.q.size());
  DeviceBuffer<float> sc(want.scale.size());
  fp8_quantize_dummy(r, mats, rows, cols, q.data(), sc.data(), nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> gq = q.download();
  const std::vector<float> gs = sc.download();
  size_t bad = 0;
  for (size_t i = 0; i < gq.size(); ++i) bad += gq[i] != want.q[i];
  for (size_t i = 0; i < gs.size(); ++i) bad += std::memcmp(&gs[i], &want.scale[i], 4) != 0;
  EXPECT_TRUE(contract_exact("fp8_quantize_dummy:bitwise", "3x200x300", bad));
}

// ---- routed experts ------------------------------------------------------------------------------


struct MoeRun {
  std::vector<int32_t> ids, pairs;
  std::vector<float> weights;
  std::vector<uint16_t> act, y, out;
};

MoeRun run_moe(MoeCase& m, const DeviceBuffer<bf16>& x, int T, int cap, const std::vector<int32_t>* replay) {
  MoeShape s{cap, m.E, m.k, m.H, m.I};
  s.expert_tiles = kMoeExpertGemv;
  DeviceBuffer<uint8_t> wsb(moe_workspace_bytes(s));
  MoeWorkspace ws = moe_workspace_bind(wsb.data(), wsb.size(), s);
  fill_device_bytes(ws.act, 0xFF, size_t(cap) * m.k * m.I * 2, nullptr);
  fill_device_bytes(ws.y, 0xFF, size_t(cap) * m.k * m.H * 2, nullptr);
  DeviceBuffer<bf16> out(size_t(cap) * m.H);
  out.fill_bytes(0xFF);
  DeviceBuffer<int32_t> live(1), rep(replay ? replay->size() : 1);
  live.upload(std::vector<int32_t>{T});
  if (replay) rep.upload(*replay);
  moe_fp8_forward(x.data(), m.drouter.data(), m.dgu->q.data(), m.dgu->s.data(), m.ddn->q.data(), m.ddn->s.data(),
                  nullptr, nullptr, nullptr, live.data(), s, true, ws, out.data(), nullptr,
                  replay ? rep.data() : nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  MoeRun r;
  const size_t P = size_t(T) * m.k;
  r.ids.resize(P);
  r.weights.resize(P);
  r.pairs.resize(P);
  MOEFOLD_CUDA_CHECK(cudaMemcpy(r.ids.data(), ws.ids, P * 4, cudaMemcpyDeviceToHost));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(r.weights.data(), ws.weights, P * 4, cudaMemcpyDeviceToHost));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(r.pairs.data(), ws.pairs, P * 4, cudaMemcpyDeviceToHost));
  r.act.resize(size_t(cap) * m.k * m.I);
  r.y.resize(size_t(cap) * m.k * m.H);
  MOEFOLD_CUDA_CHECK(cudaMemcpy(r.act.data(), ws.act, r.act.size() * 2, cudaMemcpyDeviceToHost));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(r.y.data(), ws.y, r.y.size() * 2, cudaMemcpyDeviceToHost));
  r.out = bits_of(out);
  return r;
}

/// Runs one case and checks it against the ideal chain (routing: the kernel's own, or `replay`).
void moe_case(MoeCase& m, int T, int cap, const std::vector<int32_t>* replay = nullptr, const char* tag = "") {
  const std::string shape = m.name(T, cap) + tag;
  std::vector<float> x = test::rand_bf16(size_t(cap) * m.H, uint64_t(T * 13 + m.E));
  auto dx = test::dev_bf16(x);
  MoeRun r = run_moe(m, dx, T, cap, replay);
  const size_t P = size_t(T) * m.k;
  if (replay) {
    size_t bad = 0;
    for (size_t i = 0; i < P; ++i) bad += r.ids[i] != (*replay)[i];
    EXPECT_TRUE(contract_exact("moe_fp8:replayed_ids", shape, bad));
  }
  const cpu::MoeIdealStages ideal =
      cpu::moe_fp8_ideal(x.data(), T, r.ids.data(), r.weights.data(), m.k, m.gate_up, m.down, m.E, m.H, m.I, false);
  const cpu::MoeIdealStages ideal_a8 =
      cpu::moe_fp8_ideal(x.data(), T, r.ids.data(), r.weights.data(), m.k, m.gate_up, m.down, m.E, m.H, m.I, true);
  // Stage 1: act, stored at the pair's position j in the plan.
  std::vector<double> act_ref(P * m.I), act_a8(P * m.I);
  std::vector<float> act_got(P * m.I);
  for (size_t j = 0; j < P; ++j) {
    const size_t pr = size_t(r.pairs[j]);
    for (int i = 0; i < m.I; ++i) {
      act_got[j * m.I + i] = bf16_to_f32(r.act[j * m.I + i]);
      act_ref[j * m.I + i] = ideal.act[pr * m.I + i];
      act_a8[j * m.I + i] = ideal_a8.act[pr * m.I + i];
    }
  }
  const double e_act = cpu::rel_err(act_got.data(), act_ref.data(), act_got.size());
  const auto y_got = to_f32(r.y, 0, P * m.H);
  const double e_y = cpu::rel_err(y_got.data(), ideal.y.data(), y_got.size());
  const auto out_got = to_f32(r.out, 0, size_t(T) * m.H);
  const double e_out = cpu::rel_err(out_got.data(), ideal.out.data(), out_got.size());
  EXPECT_TRUE(contract("moe_fp8:after_gemms(act)", shape, e_act, 5e-3));
  EXPECT_TRUE(contract("moe_fp8:per_slot(y)", shape, e_y, 5e-3));
  EXPECT_TRUE(contract("moe_fp8:after_combine", shape, e_out, 5e-3));
  std::printf("PROBE %s act=%.3e y=%.3e out=%.3e | vs FP8-activation chain: act=%.3e y=%.3e out=%.3e | "
              "the A8 chain vs the W8A16 one: out=%.3e\n",
              shape.c_str(), e_act, e_y, e_out, cpu::rel_err(act_got.data(), act_a8.data(), act_got.size()),
              cpu::rel_err(y_got.data(), ideal_a8.y.data(), y_got.size()),
              cpu::rel_err(out_got.data(), ideal_a8.out.data(), out_got.size()),
              cpu::rel_err(ideal_a8.out.data(), ideal.out.data(), ideal.out.size()));
  // Padding: y rows of pairs >= T * k and out rows >= T are never written.
  EXPECT_TRUE(contract_exact("moe_fp8:padding_untouched", shape,
                             test::touched(r.y, P * m.H, r.y.size()) + test::touched(r.out, size_t(T) * m.H, r.out.size())));
  // Batch invariance: the last live row alone (capacity 1) has the same bits.
  if (!replay && T > 1) {
    std::vector<float> xl(x.begin() + ptrdiff_t(size_t(T - 1) * m.H), x.begin() + ptrdiff_t(size_t(T) * m.H));
    auto dxl = test::dev_bf16(xl);
    MoeRun one = run_moe(m, dxl, 1, 1, nullptr);
    size_t diff = 0;
    for (int h = 0; h < m.H; ++h) diff += one.out[size_t(h)] != r.out[size_t(T - 1) * m.H + h];
    EXPECT_TRUE(contract_exact("moe_fp8:row_alone_bitwise", shape, diff));
  }
}


TEST(MoeFp8, ContractVsIdealChain) {
  MOEFOLD_REQUIRE_GPU();
  // I: partial scale blocks 64, 192, 448, 576, 2112 (down's K, gate_up's rows); H 128 .. 2048.
  std::vector<std::array<int, 4>> shapes = {{8, 2, 128, 64},   {16, 4, 256, 192}, {256, 8, 2048, 512},
                                            {512, 10, 512, 128}, {32, 4, 256, 448}, {8, 2, 384, 576},
                                            {8, 1, 128, 2112}};
  if (small_only()) shapes = {{8, 2, 128, 64}, {16, 4, 256, 192}};
  for (auto [E, k, H, I] : shapes) {
    std::unique_ptr<MoeCase> own;
    MoeCase& m = E == 256 ? real_shape() : *(own = std::make_unique<MoeCase>(E, k, H, I));
    for (int T : {1, 2, 17, 64}) {
      // MOEFOLD_FP8_QUICK=1: the real shape's 64-token case (seconds of fp64 reference) is left out.
      if (E == 256 && T == 64 && std::getenv("MOEFOLD_FP8_QUICK")) continue;
      moe_case(m, T, std::max(T, 64));
    }
    if (E != 256)
      for (int T : {113, 114, 128}) moe_case(m, T, 128);
    moe_case(m, 17, 17);
    moe_case(m, 1, 1);  // one token: the stream kernels (moe_fp8_stream.cu)
  }
}

// Only expert 0 routed (resp. only expert E-1): k = 1 replays send every token there, so one expert holds
// all pairs in several 8-pair tiles; nothing may be dropped (the seeds' `expert_id > 0` bug).
TEST(MoeFp8, OnlyFirstOrOnlyLastExpert) {
  MOEFOLD_REQUIRE_GPU();
  for (int E : small_only() ? std::vector<int>{8} : std::vector<int>{8, 256, 512}) {
    MoeCase m(E, 1, 256, 128);
    for (int which : {0, E - 1}) {
      std::vector<int32_t> rep(64, which);
      moe_case(m, 64, 64, &rep, which == 0 ? ",only_expert_0" : ",only_expert_E-1");
      moe_case(m, 17, 64, &rep, which == 0 ? ",only_expert_0" : ",only_expert_E-1");
      const std::vector<int32_t> one(1, which);
      moe_case(m, 1, 1, &one, which == 0 ? ",only_expert_0" : ",only_expert_E-1");
    }
  }
}

/// Differing elements of two runs' ids (1 if any differ), act, y and out.
size_t differing(const MoeRun& a, const MoeRun& b) {
  size_t diff = a.ids != b.ids;
  for (size_t i = 0; i < a.act.size(); ++i) diff += a.act[i] != b.act[i];
  for (size_t i = 0; i < a.y.size(); ++i) diff += a.y[i] != b.y[i];
  for (size_t i = 0; i < a.out.size(); ++i) diff += a.out[i] != b.out[i];
  return diff;
}

// The one-token stream kernels (moe_fp8_stream.cu) against the register-fed ones: the same bytes in ids,
// act, y and out, at shapes with partial scale blocks (I 64 .. 2112), every warps-along-K split (WK 1, 2,
// 4), rings cut to fewer slots (one stage and eight items a CTA: I = 2048; a stage count that was not a
// multiple of the slots: H = 768, the 35B down), and a replay naming one expert twice (a two-pair tile at
// capacity 1), with the stream kernels proven to have run; a step with no live row writes nothing.
TEST(MoeFp8, StreamEqualsRegisterFedBitwise) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<std::array<int, 4>> shapes = {{8, 2, 128, 64},    {16, 4, 256, 192}, {256, 8, 2048, 512},
                                            {512, 10, 512, 128}, {32, 4, 256, 448}, {8, 2, 384, 576},
                                            {8, 1, 128, 2112},   {64, 8, 1024, 320}, {16, 8, 2048, 2048},
                                            {16, 4, 768, 256}};
  if (small_only()) shapes = {{8, 2, 128, 64}, {16, 4, 256, 192}, {8, 1, 128, 2112}};
  for (auto [E, k, H, I] : shapes) {
    std::unique_ptr<MoeCase> own;
    MoeCase& m = E == 256 ? real_shape() : *(own = std::make_unique<MoeCase>(E, k, H, I));
    const std::string shape = m.name(1, 1);
    MoeShape s1{1, E, k, H, I};
    s1.expert_tiles = kMoeExpertGemv;
    ASSERT_TRUE(moe_fp8_stream_supported(s1)) << shape;
    for (uint64_t seed : {1u, 2u, 3u}) {
      const std::vector<float> x = test::rand_bf16(size_t(H), seed * 7919 + uint64_t(E));
      auto dx = test::dev_bf16(x);
      set_moe_fp8_stream(false);
      const int64_t before = moe_fp8_stream_launches();
      const MoeRun b = run_moe(m, dx, 1, 1, nullptr);
      EXPECT_EQ(moe_fp8_stream_launches(), before) << shape << ": the register-fed run took the stream kernels";
      set_moe_fp8_stream(true);
      const int64_t n0 = moe_fp8_stream_launches();
      const MoeRun a = run_moe(m, dx, 1, 1, nullptr);
      EXPECT_EQ(moe_fp8_stream_launches() - n0, 2) << shape << ": the stream kernels did not run";
      const size_t diff = differing(a, b);
      EXPECT_TRUE(contract_exact("moe_fp8_stream:bitwise_vs_register_fed", shape + ",seed=" + std::to_string(seed), diff));
    }
    const std::vector<float> x = test::rand_bf16(size_t(H), 5);
    auto dx = test::dev_bf16(x);
    if (k >= 2) {  // one expert named twice: its tile holds both pairs of the token
      std::vector<int32_t> rep(static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) rep[size_t(i)] = i < 2 ? E - 1 : i;
      set_moe_fp8_stream(false);
      const MoeRun b = run_moe(m, dx, 1, 1, &rep);
      set_moe_fp8_stream(true);
      const MoeRun a = run_moe(m, dx, 1, 1, &rep);
      const size_t diff = differing(a, b);
      EXPECT_TRUE(contract_exact("moe_fp8_stream:bitwise_vs_register_fed", shape + ",replay_expert_twice", diff));
    }
    const MoeRun none = run_moe(m, dx, 0, 1, nullptr);
    EXPECT_TRUE(contract_exact("moe_fp8_stream:no_live_row_writes_nothing", shape,
                               test::touched(none.act, 0, none.act.size()) + test::touched(none.y, 0, none.y.size()) +
                                   test::touched(none.out, 0, none.out.size())));
  }
}

// The FP8 shared expert inside the stream kernels (moe_fp8_forward_shared) against its dense chain
// (fp8_gemv gate_up, swiglu, fp8_gemv down, then moe_fp8_forward with that shared_out): the same bytes in
// the shared act, shared_out, the routed y and the layer output; with no live row nothing is written.
TEST(MoeFp8, SharedExpertInStreamEqualsDenseChainBitwise) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<std::array<int, 4>> shapes = {{8, 2, 128, 64}, {16, 4, 256, 192}, {256, 8, 2048, 512}, {8, 1, 128, 2112},
                                            {64, 8, 1024, 320}};
  if (small_only()) shapes = {{8, 2, 128, 64}, {16, 4, 256, 192}};
  for (auto [E, k, H, I] : shapes) {
    std::unique_ptr<MoeCase> own;
    MoeCase& m = E == 256 ? real_shape() : *(own = std::make_unique<MoeCase>(E, k, H, I));
    const std::string shape = m.name(1, 1) + ",shared_I=" + std::to_string(I);
    MoeShape s{1, E, k, H, I};
    s.expert_tiles = kMoeExpertGemv;
    ASSERT_TRUE(moe_fp8_shared_fusable(s, I)) << shape;
    DevFp8 sgu(rand_fp8(2 * I, H, uint64_t(E + 101))), sdn(rand_fp8(H, I, uint64_t(E + 102)));
    auto gate = test::dev_bf16(test::rand_bf16(size_t(H), 17, 1.0f / std::sqrt(float(H))));
    for (int live_rows : {1, 0}) {
      const std::string sh = shape + ",live=" + std::to_string(live_rows);
      auto dx = test::dev_bf16(test::rand_bf16(size_t(H), uint64_t(E * 3 + H)));
      DeviceBuffer<int32_t> live(1);
      live.upload(std::vector<int32_t>{live_rows});
      DeviceBuffer<uint8_t> wsa(moe_workspace_bytes(s)), wsb(moe_workspace_bytes(s));
      MoeWorkspace wa = moe_workspace_bind(wsa.data(), wsa.size(), s), wb = moe_workspace_bind(wsb.data(), wsb.size(), s);
      DeviceBuffer<bf16> gu{size_t(2 * I)}, act_a{size_t(I)}, act_b{size_t(I)}, so_a{size_t(H)}, so_b{size_t(H)},
          out_a{size_t(H)}, out_b{size_t(H)};
      for (auto* b : {&act_a, &act_b, &so_a, &so_b, &out_a, &out_b}) b->fill_bytes(0xFF);
      fill_device_bytes(wa.y, 0xFF, size_t(k) * H * 2, nullptr);
      fill_device_bytes(wb.y, 0xFF, size_t(k) * H * 2, nullptr);
      // A: the dense chain, as the executor runs it without the fusion.
      fp8_gemv(dx.data(), sgu.q.data(), sgu.s.data(), nullptr, gu.data(), 1, H, 2 * I, live.data(), nullptr);
      swiglu(gu.data(), act_a.data(), 1, I, live.data(), nullptr);
      fp8_gemv(act_a.data(), sdn.q.data(), sdn.s.data(), nullptr, so_a.data(), 1, I, H, live.data(), nullptr);
      moe_fp8_forward(dx.data(), m.drouter.data(), m.dgu->q.data(), m.dgu->s.data(), m.ddn->q.data(), m.ddn->s.data(),
                      so_a.data(), gate.data(), nullptr, live.data(), s, true, wa, out_a.data(), nullptr);
      // B: the shared expert as items of the stream kernels.
      const int64_t n0 = moe_fp8_stream_launches();
      const MoeFp8SharedExpert shared{sgu.q.data(), sgu.s.data(), sdn.q.data(), sdn.s.data(), I, act_b.data(), so_b.data()};
      moe_fp8_forward_shared(dx.data(), m.drouter.data(), m.dgu->q.data(), m.dgu->s.data(), m.ddn->q.data(),
                             m.ddn->s.data(), shared, gate.data(), nullptr, live.data(), s, true, wb, out_b.data(), nullptr);
      MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(moe_fp8_stream_launches() - n0, 2) << sh << ": the stream kernels did not run";
      const auto aa = bits_of(act_a), ab = bits_of(act_b), sa = bits_of(so_a), sb = bits_of(so_b), oa = bits_of(out_a),
                 ob = bits_of(out_b);
      std::vector<uint16_t> ya(size_t(k) * H), yb(size_t(k) * H);
      MOEFOLD_CUDA_CHECK(cudaMemcpy(ya.data(), wa.y, ya.size() * 2, cudaMemcpyDeviceToHost));
      MOEFOLD_CUDA_CHECK(cudaMemcpy(yb.data(), wb.y, yb.size() * 2, cudaMemcpyDeviceToHost));
      size_t diff = (aa != ab) + (sa != sb) + (oa != ob) + (ya != yb);
      if (live_rows == 0)  // nothing written by either
        diff += test::touched(ab, 0, ab.size()) + test::touched(sb, 0, sb.size()) + test::touched(ob, 0, ob.size()) +
                test::touched(yb, 0, yb.size());
      EXPECT_TRUE(contract_exact("moe_fp8_stream:shared_expert_bitwise_vs_dense_chain", sh, diff));
    }
  }
}

// ---- decode-size bandwidth (MOEFOLD_FP8_BENCH=1) ---------------------------------------------------

/// Median us of f() with L2 flushed (a 256 MiB memset) before every timed run.
double time_cold(const std::function<void()>& f, int iters = 15) {
  static DeviceBuffer<uint8_t> flush(size_t(256) << 20);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  f();
  for (int i = 0; i < iters; ++i) {
    flush.fill_bytes(i & 0xFF);
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3;
}

TEST(Fp8Bench, DecodeBandwidth) {
  MOEFOLD_REQUIRE_GPU();
  if (!std::getenv("MOEFOLD_FP8_BENCH")) GTEST_SKIP() << "set MOEFOLD_FP8_BENCH=1";
  // The ceiling measured in this run: a device-to-device copy of 1 GiB (read + write bytes).
  const size_t cb = size_t(1) << 30;
  DeviceBuffer<uint8_t> c0(cb), c1(cb);
  const double copy_us = test::time_us([&] { cudaMemcpyAsync(c1.data(), c0.data(), cb, cudaMemcpyDeviceToDevice); }, 2, 10);
  const double peak = 2.0 * double(cb) / copy_us * 1e-3;  // GB/s
  std::printf("BENCH ceiling d2d_copy GB/s=%.0f\n", peak);
  // Routed experts at the Qwen3.6-35B-A3B shape.
  MoeCase& m = real_shape();
  for (int T : {1, 2, 4, 8, 16, 32, 64}) {
    MoeShape s{T, m.E, m.k, m.H, m.I};
    s.expert_tiles = kMoeExpertGemv;
    DeviceBuffer<uint8_t> wsb(moe_workspace_bytes(s));
    MoeWorkspace ws = moe_workspace_bind(wsb.data(), wsb.size(), s);
    std::vector<float> x = test::rand_bf16(size_t(T) * m.H, uint64_t(T));
    auto dx = test::dev_bf16(x);
    DeviceBuffer<bf16> out(size_t(T) * m.H);
    DeviceBuffer<int32_t> live(1);
    live.upload(std::vector<int32_t>{T});
    moe_fp8_forward(dx.data(), m.drouter.data(), m.dgu->q.data(), m.dgu->s.data(), m.ddn->q.data(), m.ddn->s.data(),
                    nullptr, nullptr, nullptr, live.data(), s, true, ws, out.data(), nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> counts(size_t(m.E));
    MOEFOLD_CUDA_CHECK(cudaMemcpy(counts.data(), ws.counts, size_t(m.E) * 4, cudaMemcpyDeviceToHost));
    const double touched = double(std::count_if(counts.begin(), counts.end(), [](int c) { return c > 0; }));
    const double gu_bytes = touched * 2 * m.I * (m.H + double(m.H / 128) * 4);
    const double dn_bytes = touched * m.H * (m.I + double(m.I / 128) * 4);
    const double tg = time_cold([&] { moe_fp8_expert_gate_up(dx.data(), m.dgu->q.data(), m.dgu->s.data(), s, ws, nullptr); });
    const double td = time_cold([&] { moe_fp8_expert_down(m.ddn->q.data(), m.ddn->s.data(), s, ws, nullptr); });
    const double tgs =
        time_cold([&] { moe_fp8_expert_gate_up_simt(dx.data(), m.dgu->q.data(), m.dgu->s.data(), s, ws, nullptr); });
    const double tds = time_cold([&] { moe_fp8_expert_down_simt(m.ddn->q.data(), m.ddn->s.data(), s, ws, nullptr); });
    auto pct = [&](double bytes, double us) { return 100 * bytes / us * 1e-3 / peak; };
    std::printf("BENCH moe_fp8 T=%d touched=%.0f mma: gate_up us=%.1f (%.0f%%) down us=%.1f (%.0f%%) both GB/s=%.0f "
                "(%.0f%%) | simt: gate_up us=%.1f down us=%.1f both (%.0f%%)\n",
                T, touched, tg, pct(gu_bytes, tg), td, pct(dn_bytes, td), (gu_bytes + dn_bytes) / (tg + td) * 1e-3,
                pct(gu_bytes + dn_bytes, tg + td), tgs, tds, pct(gu_bytes + dn_bytes, tgs + tds));
  }
  // One token: the register-fed expert kernels beside the stream kernels (moe_fp8_stream.cu), each alone
  // with L2 flushed, then the routed chain (router to combine) either way.
  {
    MoeShape s{1, m.E, m.k, m.H, m.I};
    s.expert_tiles = kMoeExpertGemv;
    DeviceBuffer<uint8_t> wsb(moe_workspace_bytes(s));
    MoeWorkspace ws = moe_workspace_bind(wsb.data(), wsb.size(), s);
    auto dx = test::dev_bf16(test::rand_bf16(size_t(m.H), 11));
    DeviceBuffer<bf16> out(size_t(m.H));
    DeviceBuffer<int32_t> live(1);
    live.upload(std::vector<int32_t>{1});
    auto chain = [&] {
      moe_fp8_forward(dx.data(), m.drouter.data(), m.dgu->q.data(), m.dgu->s.data(), m.ddn->q.data(), m.ddn->s.data(),
                      nullptr, nullptr, nullptr, live.data(), s, true, ws, out.data(), nullptr);
    };
    chain();
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    const double gu_bytes = double(m.k) * 2 * m.I * (m.H + double(m.H / 128) * 4);
    const double dn_bytes = double(m.k) * m.H * (m.I + double(m.I / 128) * 4);
    auto pct = [&](double bytes, double us) { return 100 * bytes / us * 1e-3 / peak; };
    const double tg = time_cold([&] { moe_fp8_expert_gate_up(dx.data(), m.dgu->q.data(), m.dgu->s.data(), s, ws, nullptr); });
    const double td = time_cold([&] { moe_fp8_expert_down(m.ddn->q.data(), m.ddn->s.data(), s, ws, nullptr); });
    set_moe_fp8_stream(false);
    const double tc = time_cold(chain);
    set_moe_fp8_stream(true);
    std::printf("BENCH moe_fp8_batch1 register-fed: gate_up us=%.1f (%.0f%%) down us=%.1f (%.0f%%) chain us=%.1f\n", tg,
                pct(gu_bytes, tg), td, pct(dn_bytes, td), tc);
    const double sg = time_cold([&] { moe_fp8_stream_gate_up(dx.data(), m.dgu->q.data(), m.dgu->s.data(), s, ws, nullptr); });
    const double sd = time_cold([&] { moe_fp8_stream_down(m.ddn->q.data(), m.ddn->s.data(), s, ws, nullptr); });
    const double sc = time_cold(chain);
    std::printf("BENCH moe_fp8_batch1 stream: gate_up us=%.1f (%.0f%%) down us=%.1f (%.0f%%) chain us=%.1f\n", sg,
                pct(gu_bytes, sg), sd, pct(dn_bytes, sd), sc);
  }
  if (std::getenv("MOEFOLD_FP8_BENCH_MOE_ONLY")) return;
  // Dense projections of that model: q|gate (8192 x 2048), o_proj (2048 x 4096), DeltaNet qkv|z (12288 x 2048).
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{8192, 2048}, {2048, 4096}, {12288, 2048}, {1024, 2048}}) {
    const Fp8Weight w = rand_fp8(N, K, 1);
    DevFp8 dw(w);
    for (int T : {1, 2, 4, 8, 16, 32, 64}) {
      auto dx = test::dev_bf16(test::rand_bf16(size_t(T) * K, 3));
      DeviceBuffer<bf16> y(size_t(T) * N);
      const double us = time_cold([&] { fp8_gemv(dx.data(), dw.q.data(), dw.s.data(), nullptr, y.data(), T, K, N, nullptr, nullptr); });
      const double us_s =
          time_cold([&] { fp8_gemv_simt(dx.data(), dw.q.data(), dw.s.data(), nullptr, y.data(), T, K, N, nullptr, nullptr); });
      const double bytes = double(N) * (K + double(K / 128) * 4);
      std::printf("BENCH fp8_gemv N=%lld K=%lld T=%d mma us=%.1f GB/s=%.0f (%.0f%%) | simt us=%.1f (%.0f%%)\n",
                  (long long)N, (long long)K, T, us, bytes / us * 1e-3, 100 * bytes / us * 1e-3 / peak, us_s,
                  100 * bytes / us_s * 1e-3 / peak);
    }
  }
  // The FP8 lm_head at the 35B shape (248320 x 2048, fp32 logits).
  {
    const int64_t N = 248320, K = 2048;
    Fp8Weight w;
    w.rows = N;
    w.cols = K;
    w.q.assign(size_t(N * K), 0x38);  // 1.0: the values do not change the time
    w.scale.assign(size_t(N * w.col_blocks()), 0.01f);
    DevFp8 dw(w);
    for (int T : {1, 64}) {
      auto dx = test::dev_bf16(test::rand_bf16(size_t(T) * K, 3));
      DeviceBuffer<float> y(size_t(T) * N);
      const double us = time_cold([&] { fp8_gemv_f32out(dx.data(), dw.q.data(), dw.s.data(), nullptr, y.data(), T, K, N, nullptr, nullptr); });
      const double bytes = double(N) * (K + double(K / 128) * 4);
      std::printf("BENCH fp8_lm_head N=%lld K=%lld T=%d us=%.1f GB/s=%.0f (%.0f%%)\n", (long long)N, (long long)K, T, us,
                  bytes / us * 1e-3, 100 * bytes / us * 1e-3 / peak);
    }
  }
}

}  // namespace
}  // namespace moefold::cuda
