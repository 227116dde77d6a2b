// Contract tests of the W8A8 prefill experts (moe_fp8.h: moe_fp8_prefill_forward, moe_fp8_wgmma.cu; the
// activation quantisation of fp8_act_quant.h), stage by stage against fp64 references built from the same
// quantised operands:
//  - the quantised activations (x, then act) bitwise equal to the CPU's 1 x 128 quantisation
//    (fp8_quantize_activations' definition: codes and scales);
//  - act (after gate_up + SwiGLU) against fp64 sums over the quantised x and weights;
//  - y (per slot, after down) against fp64 sums over the kernel's own quantised act;
//  - the combine against fp64 over those y; and, for scale, each stage against the whole ideal W8A8 and
//    W8A16 chains (src/ops/cpu/fp8_ideal.h), printed as PROBE lines.
// Tokens 1, 2, 17, 64, 113, 114, 128, 300, 1000, 4096 at a capacity above the live count (read on the
// device), poisoned outputs and scratch, padding untouched (bytes), a row alone bitwise equal to the same
// row in the batch, E 8 .. 512, replays in which only expert 0 (resp. only expert E-1) is routed (one
// expert holding every pair over several 128-row tiles). Skips without a GPU. Fp8Bench.PrefillExperts
// (MOEFOLD_FP8_BENCH=1) times the chain at the 35B shape beside the dequantise + bf16 path.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
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
#include "core/parallel.h"
#include "core/profiler.h"
#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "cuda/fp8_test_util.h"
#include "ops/cpu/fp8_ideal.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/fp8_act_quant.h"
#include "ops/cuda/fp8_gemv.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe_fp8.h"

namespace moefold::cuda {
namespace {

using test::contract;
using test::contract_exact;
using namespace fp8test;

/// The CPU's 1 x 128 quantisation of rows [0, T) of x [*, K]: codes and scales (fp8_act_quant.h).
void quantize_rows_cpu(const float* x, int64_t T, int64_t K, std::vector<uint8_t>& q, std::vector<float>& s) {
  const int64_t KB = (K + 127) / 128;
  q.assign(size_t(T * K), 0);
  s.assign(size_t(T * KB), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < KB; ++b) {
      const int64_t c1 = std::min(K, b * 128 + 128);
      float amax = 0.0f;
      for (int64_t c = b * 128; c < c1; ++c) amax = std::max(amax, std::fabs(x[t * K + c]));
      const float sc = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
      s[size_t(t * KB + b)] = sc;
      for (int64_t c = b * 128; c < c1; ++c) q[size_t(t * K + c)] = f32_to_f8e4m3(x[t * K + c] / sc);
    }
}

/// Number of differing bytes / words between a device result and the CPU's over the first n elements.
template <class T>
size_t mismatches(const std::vector<T>& got, const std::vector<T>& want, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
  return bad;
}

struct PrefillRun {
  std::vector<int32_t> ids, pairs;
  std::vector<float> weights, xs, as;
  std::vector<uint8_t> xq, aq;
  std::vector<uint16_t> act, y, out;
};

/// One run at step capacity `cap`, its workspace and scratch bound for ws_cap >= cap rows (0: cap), as
/// the executor binds them for its largest step.
PrefillRun run_prefill(MoeCase& m, const DeviceBuffer<bf16>& x, int T, int cap, const std::vector<int32_t>* replay,
                       int ws_cap = 0) {
  MoeShape s{cap, m.E, m.k, m.H, m.I}, bound{std::max(cap, ws_cap), m.E, m.k, m.H, m.I};
  DeviceBuffer<uint8_t> wsb(moe_workspace_bytes(bound)), fb(moe_fp8_prefill_scratch_bytes(bound));
  MoeWorkspace ws = moe_workspace_bind(wsb.data(), wsb.size(), bound);
  MoeFp8PrefillScratch sc = moe_fp8_prefill_scratch_bind(fb.data(), fb.size(), bound);
  const size_t P = size_t(cap) * m.k;
  fill_device_bytes(ws.act, 0xFF, P * m.I * 2, nullptr);
  fill_device_bytes(ws.y, 0xFF, P * m.H * 2, nullptr);
  fb.fill_bytes(0xFF);
  DeviceBuffer<bf16> out(size_t(cap) * m.H);
  out.fill_bytes(0xFF);
  DeviceBuffer<int32_t> live(1), rep(replay ? replay->size() : 1);
  live.upload(std::vector<int32_t>{T});
  if (replay) rep.upload(*replay);
  moe_fp8_prefill_forward(x.data(), m.drouter.data(), m.dgu->q.data(), m.dgu->s.data(), m.ddn->q.data(),
                          m.ddn->s.data(), nullptr, nullptr, nullptr, live.data(), s, true, ws, sc, out.data(), nullptr,
                          replay ? rep.data() : nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  PrefillRun r;
  const size_t LP = size_t(T) * m.k;
  auto get = [](auto& v, const void* src, size_t n) {
    v.resize(n);
    MOEFOLD_CUDA_CHECK(cudaMemcpy(v.data(), src, n * sizeof(v[0]), cudaMemcpyDeviceToHost));
  };
  get(r.ids, ws.ids, LP);
  get(r.weights, ws.weights, LP);
  get(r.pairs, ws.pairs, LP);
  get(r.act, ws.act, P * m.I);
  get(r.y, ws.y, P * m.H);
  get(r.xq, sc.xq, size_t(cap) * m.H);
  get(r.xs, sc.xs, size_t(cap) * (m.H / 128));
  get(r.aq, sc.aq, P * m.I);
  get(r.as, sc.as, P * (m.I / 128));
  r.out = bits_of(out);
  return r;
}

/// Rows [r0, r0 + n) of `w` as fp64 values (e4m3 * scale, exact).
void weight_rows(const Fp8Weight& w, int64_t r0, int64_t n, std::vector<double>& out) {
  const int64_t K = w.cols, KB = w.col_blocks();
  out.resize(size_t(n * K));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < K; ++c)
      out[size_t(r * K + c)] =
          double(f8e4m3_to_f32(w.q[size_t((r0 + r) * K + c)])) * double(w.scale[size_t((r0 + r) * KB + c / 128)]);
}

/// One case: every stage against its fp64 reference (see the header).
void prefill_case(MoeCase& m, int T, int cap, const std::vector<int32_t>* replay = nullptr, const char* tag = "",
                  int ws_cap = 0) {
  const std::string shape = m.name(T, cap) + tag + (ws_cap > cap ? ",ws_cap=" + std::to_string(ws_cap) : "");
  std::vector<float> x = test::rand_bf16(size_t(cap) * m.H, uint64_t(T * 17 + m.E));
  for (int t = 0; t < T; t += 9)  // an outlier (bf16-exact): its block's scale differs
    x[size_t(t) * m.H + 3] = bf16_to_f32(f32_to_bf16(x[size_t(t) * m.H + 3] * 40.0f));
  auto dx = test::dev_bf16(x);
  PrefillRun r = run_prefill(m, dx, T, cap, replay, ws_cap);
  const int64_t H = m.H, I = m.I, k = m.k, P = int64_t(T) * k;
  if (replay) {
    size_t bad = 0;
    for (int64_t i = 0; i < P; ++i) bad += r.ids[size_t(i)] != (*replay)[size_t(i)];
    EXPECT_TRUE(contract_exact("moe_fp8_prefill:replayed_ids", shape, bad));
  }
  // x quantised: bitwise the CPU's; padding rows untouched.
  std::vector<uint8_t> xq;
  std::vector<float> xs;
  quantize_rows_cpu(x.data(), T, H, xq, xs);
  EXPECT_TRUE(contract_exact("fp8_quantize_rows(x):bitwise", shape,
                             mismatches(r.xq, xq, xq.size()) + mismatches(r.xs, xs, xs.size())));
  size_t pad = 0;
  for (size_t i = xq.size(); i < r.xq.size(); ++i) pad += r.xq[i] != 0xFF;
  // act: fp64 over the quantised x and weights, at plan position j.
  std::vector<double> act_ref(size_t(P * I)), y_ref(size_t(P * H));
  std::vector<float> act_got(size_t(P * I));
  parallel_for(P, [&](int64_t lo, int64_t hi) {
    std::vector<double> wr, xa(static_cast<size_t>(H));
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t pr = r.pairs[size_t(j)], t = pr / k, e = r.ids[size_t(pr)];
      for (int64_t c = 0; c < H; ++c)
        xa[size_t(c)] = double(f8e4m3_to_f32(xq[size_t(t * H + c)])) * double(xs[size_t(t * (H / 128) + c / 128)]);
      weight_rows(m.gate_up, e * 2 * I, 2 * I, wr);
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < H; ++c) {
          g += wr[size_t(i * H + c)] * xa[size_t(c)];
          u += wr[size_t((I + i) * H + c)] * xa[size_t(c)];
        }
        act_ref[size_t(j * I + i)] = g / (1.0 + std::exp(-g)) * u;
        act_got[size_t(j * I + i)] = bf16_to_f32(r.act[size_t(j * I + i)]);
      }
    }
  }, 1);
  const double e_act = cpu::rel_err(act_got.data(), act_ref.data(), act_got.size());
  EXPECT_TRUE(contract("moe_fp8_prefill:after_gemms(act)", shape, e_act, 4e-3));
  // act quantised: bitwise the CPU's quantisation of the kernel's own act; y over it in fp64.
  std::vector<uint8_t> aq;
  std::vector<float> as;
  quantize_rows_cpu(act_got.data(), P, I, aq, as);
  EXPECT_TRUE(contract_exact("fp8_quantize_rows(act):bitwise", shape,
                             mismatches(r.aq, aq, aq.size()) + mismatches(r.as, as, as.size())));
  for (size_t i = aq.size(); i < r.aq.size(); ++i) pad += r.aq[i] != 0xFF;
  parallel_for(P, [&](int64_t lo, int64_t hi) {
    std::vector<double> wr, aa(static_cast<size_t>(I));
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t pr = r.pairs[size_t(j)], e = r.ids[size_t(pr)];
      for (int64_t c = 0; c < I; ++c)
        aa[size_t(c)] = double(f8e4m3_to_f32(aq[size_t(j * I + c)])) * double(as[size_t(j * (I / 128) + c / 128)]);
      weight_rows(m.down, e * H, H, wr);
      for (int64_t h = 0; h < H; ++h) {
        double v = 0;
        for (int64_t c = 0; c < I; ++c) v += wr[size_t(h * I + c)] * aa[size_t(c)];
        y_ref[size_t(pr * H + h)] = v;
      }
    }
  }, 1);
  const auto y_got = to_f32(r.y, 0, size_t(P * H));
  const double e_y = cpu::rel_err(y_got.data(), y_ref.data(), y_got.size());
  EXPECT_TRUE(contract("moe_fp8_prefill:per_slot(y)", shape, e_y, 4e-3));
  // The combine over the kernel's y.
  std::vector<double> out_ref(size_t(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t sl = 0; sl < k; ++sl)
      for (int64_t h = 0; h < H; ++h)
        out_ref[size_t(t * H + h)] += double(r.weights[size_t(t * k + sl)]) * double(y_got[size_t((t * k + sl) * H + h)]);
  const auto out_got = to_f32(r.out, 0, size_t(T) * H);
  const double e_out = cpu::rel_err(out_got.data(), out_ref.data(), out_got.size());
  EXPECT_TRUE(contract("moe_fp8_prefill:after_combine", shape, e_out, 4e-3));
  // Scale: the whole chain against the ideal W8A8 and W8A16 chains (their own FP8 rounding).
  if (int64_t(T) * m.E <= 64 * 512) {
    const cpu::MoeIdealStages a8 =
        cpu::moe_fp8_ideal(x.data(), T, r.ids.data(), r.weights.data(), k, m.gate_up, m.down, m.E, H, I, true);
    const cpu::MoeIdealStages a16 =
        cpu::moe_fp8_ideal(x.data(), T, r.ids.data(), r.weights.data(), k, m.gate_up, m.down, m.E, H, I, false);
    std::printf("PROBE %s vs ideal W8A8 chain: y=%.3e out=%.3e | vs W8A16 chain: out=%.3e | W8A8 chain vs W8A16: "
                "out=%.3e\n",
                shape.c_str(), cpu::rel_err(y_got.data(), a8.y.data(), y_got.size()),
                cpu::rel_err(out_got.data(), a8.out.data(), out_got.size()),
                cpu::rel_err(out_got.data(), a16.out.data(), out_got.size()),
                cpu::rel_err(a8.out.data(), a16.out.data(), a16.out.size()));
  }
  // Padding: scratch rows past the live ones, y rows of pairs >= P and out rows >= T never written.
  EXPECT_TRUE(contract_exact("moe_fp8_prefill:padding_untouched", shape,
                             pad + test::touched(r.y, size_t(P * H), r.y.size()) +
                                 test::touched(r.out, size_t(T) * H, r.out.size())));
  // Batch invariance: the last live row alone (capacity 1) has the same bits.
  if (!replay && T > 1) {
    std::vector<float> xl(x.begin() + ptrdiff_t(size_t(T - 1) * H), x.begin() + ptrdiff_t(size_t(T) * H));
    auto dxl = test::dev_bf16(xl);
    PrefillRun one = run_prefill(m, dxl, 1, 1, nullptr);
    size_t diff = 0;
    for (int64_t h = 0; h < H; ++h) diff += one.out[size_t(h)] != r.out[size_t((T - 1) * H + h)];
    EXPECT_TRUE(contract_exact("moe_fp8_prefill:row_alone_bitwise", shape, diff));
  }
}

TEST(Fp8ActQuant, RowsBitwiseTheCpusAndPaddingUntouched) {
  MOEFOLD_REQUIRE_GPU();
  for (int64_t K : {8, 64, 128, 200, 2048}) {  // partial blocks: 8, 64, 200
    const int64_t cap = 37, T = 29;
    std::vector<float> x = test::rand_bf16(size_t(cap * K), uint64_t(K));
    x[0] = 0.0f;  // with K == 8 an all-zero block below: scale 1
    for (int64_t c = 1; c < std::min<int64_t>(K, 128); ++c) x[size_t(c)] = 0.0f;
    x[size_t(K + 1)] = 3072.0f;  // a block whose other values fall to e4m3 subnormals
    auto dx = test::dev_bf16(x);
    const int64_t KB = (K + 127) / 128;
    DeviceBuffer<uint8_t> q(size_t(cap * K));
    DeviceBuffer<float> s(size_t(cap * KB));
    q.fill_bytes(0xFF);
    s.fill_bytes(0xFF);
    DeviceBuffer<int32_t> live(1);
    live.upload(std::vector<int32_t>{int32_t(T)});
    fp8_quantize_rows(dx.data(), cap, K, live.data(), q.data(), s.data(), nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> gq = q.download(), wq;
    std::vector<float> gs = s.download(), ws;
    quantize_rows_cpu(x.data(), T, K, wq, ws);
    size_t pad = 0;
    for (size_t i = wq.size(); i < gq.size(); ++i) pad += gq[i] != 0xFF;
    const std::string shape = "K=" + std::to_string(K) + ",T=29,cap=37";
    EXPECT_TRUE(contract_exact("fp8_quantize_rows:bitwise", shape, mismatches(gq, wq, wq.size()) + mismatches(gs, ws, ws.size())));
    EXPECT_TRUE(contract_exact("fp8_quantize_rows:padding_untouched", shape, pad));
    EXPECT_EQ(gs[0], 1.0f);  // row 0's first block is all zero
  }
}

TEST(MoeFp8Prefill, ContractVsQuantisedReferences) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<std::array<int, 4>> shapes = {{8, 2, 128, 128}, {16, 4, 256, 256}, {512, 10, 512, 128},
                                            {32, 4, 384, 384}, {256, 8, 2048, 512}};
  if (small_only()) shapes = {{8, 2, 128, 128}, {16, 4, 256, 256}};
  for (auto [E, k, H, I] : shapes) {
    std::unique_ptr<MoeCase> own;
    MoeCase& m = E == 256 ? real_shape() : *(own = std::make_unique<MoeCase>(E, k, H, I));
    std::vector<int> Ts = {1, 2, 17, 64, 113, 114, 128, 300};
    if (E == 256) Ts = {17, 300};
    if (E == 8 && !small_only()) Ts.insert(Ts.end(), {1000, 4096});
    for (int T : Ts) prefill_case(m, T, T == 4096 ? T : T + 5);
    if (E != 256) prefill_case(m, 300, 301, nullptr, "", 1024);  // a workspace bound for larger steps
  }
}

// Only expert 0 routed (resp. only expert E-1): k = 1 replays send every token there, so one expert holds
// all pairs in three 128-row tiles (the last partial); nothing may be dropped.
TEST(MoeFp8Prefill, OnlyFirstOrOnlyLastExpert) {
  MOEFOLD_REQUIRE_GPU();
  for (int E : small_only() ? std::vector<int>{8} : std::vector<int>{8, 256, 512}) {
    MoeCase m(E, 1, 256, 128);
    for (int which : {0, E - 1}) {
      std::vector<int32_t> rep(300, which);
      prefill_case(m, 300, 300, &rep, which == 0 ? ",only_expert_0" : ",only_expert_E-1");
    }
  }
}

TEST(MoeFp8Prefill, UnsupportedShapesRefused) {
  EXPECT_FALSE(moe_fp8_prefill_supported(MoeShape{16, 8, 2, 128, 64}));  // I % 128 != 0: the bf16 chain
  EXPECT_TRUE(moe_fp8_prefill_supported(MoeShape{16, 8, 2, 128, 128}));
}

// ---- prefill throughput (MOEFOLD_FP8_BENCH=1) ------------------------------------------------------

TEST(Fp8Bench, PrefillExperts) {
  MOEFOLD_REQUIRE_GPU();
  if (!std::getenv("MOEFOLD_FP8_BENCH")) GTEST_SKIP() << "set MOEFOLD_FP8_BENCH=1";
  MoeCase& m = real_shape();
  // The old path's bf16 copies of the experts (dequantised once here; the executor does it per layer).
  const int64_t E = m.E, H = m.H, I = m.I;
  DeviceBuffer<bf16> wb(size_t(E * 3 * I * H));
  for (int T : {4096, 16384}) {
    MoeShape s{T, m.E, m.k, m.H, m.I};
    DeviceBuffer<uint8_t> wsb(moe_workspace_bytes(s)), fb(moe_fp8_prefill_scratch_bytes(s));
    MoeWorkspace ws = moe_workspace_bind(wsb.data(), wsb.size(), s);
    MoeFp8PrefillScratch sc = moe_fp8_prefill_scratch_bind(fb.data(), fb.size(), s);
    auto dx = test::dev_bf16(test::rand_bf16(size_t(T) * H, uint64_t(T)));
    DeviceBuffer<bf16> out(size_t(T) * H);
    DeviceBuffer<int32_t> live(1);
    live.upload(std::vector<int32_t>{T});
    auto fp8 = [&] {
      moe_fp8_prefill_forward(dx.data(), m.drouter.data(), m.dgu->q.data(), m.dgu->s.data(), m.ddn->q.data(),
                              m.ddn->s.data(), nullptr, nullptr, nullptr, live.data(), s, true, ws, sc, out.data(),
                              nullptr);
    };
    auto deq = [&] {
      fp8_dequantize_bf16(m.dgu->q.data(), m.dgu->s.data(), E * 2 * I, H, wb.data(), nullptr);
      fp8_dequantize_bf16(m.ddn->q.data(), m.ddn->s.data(), E * H, I, wb.data() + E * 2 * I * H, nullptr);
    };
    auto bf16_chain = [&] {
      moe_forward(dx.data(), m.drouter.data(), wb.data(), wb.data() + E * 2 * I * H, nullptr, nullptr, nullptr,
                  live.data(), s, true, ws, out.data(), nullptr);
    };
    const double flops = 2.0 * T * m.k * (H * 2.0 * I + I * double(H));
    // A B B A: the W8A8 chain and the old path (dequantise + bf16 chain), and the bf16 chain alone.
    const double a1 = test::time_us(fp8, 2, 10), b1 = test::time_us([&] { deq(); bf16_chain(); }, 2, 10);
    const double b2 = test::time_us([&] { deq(); bf16_chain(); }, 2, 10), a2 = test::time_us(fp8, 2, 10);
    const double c = test::time_us(bf16_chain, 2, 10);
    const double a = std::min(a1, a2), b = std::min(b1, b2);
    std::printf("BENCH moe_fp8_prefill T=%d w8a8_wgmma us=%.0f/%.0f (%.0f TFLOP/s, chain) | dequant+bf16 us=%.0f/%.0f "
                "| bf16 chain alone (bf16 weights) us=%.0f (%.0f TFLOP/s) | speedup vs old path %.2fx\n",
                T, a1, a2, flops / a * 1e-6, b1, b2, c, flops / c * 1e-6, b / a);
    // The chain's kernels, timed by the profiler's CUDA events over 5 runs (the kernel table's numbers).
    prof::set_device_timer(cuda_event_timer());
    prof::begin_window();
    for (int i = 0; i < 5; ++i) {
      fp8();
      prof::flush();
    }
    const prof::WindowProfile w = prof::end_window();
    prof::set_device_timer(nullptr);
    for (const prof::KernelTime& kt : w.kernels)
      std::printf("BENCH   T=%d %-32s us/call=%8.1f TFLOP/s=%6.0f GB/s=%6.0f\n", T, kt.name.c_str(),
                  kt.time_s / double(kt.calls) * 1e6, kt.work.flops / kt.time_s * 1e-12, kt.work.bytes / kt.time_s * 1e-9);
  }
}

}  // namespace
}  // namespace moefold::cuda
