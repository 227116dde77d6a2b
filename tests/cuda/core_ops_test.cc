// Contract tests of the CUDA backend's dense and elementwise ops against the CPU reference
// (ops/cpu): GEMM (bf16 and fp32 output, bias, accumulate, strided rows), RMSNorm variants, fused
// residual + RMSNorm, RoPE (partial and full, positions up to 262k), embedding gather (with
// out-of-range ids), SwiGLU, sigmoid output gate and residual add, at the row counts
// 1, 2, 17, 63, 64, 65, 127, 1000, plus live counts below capacity (padding rows untouched).
// Inputs are rounded to bf16 before the fp32 reference runs, so only the kernel's own rounding
// and accumulation order are measured. Tolerances: bf16 outputs 1e-2, fp32 outputs 1e-4.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/norm.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/rope.h"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

constexpr double kTolBf16 = 1e-2;
constexpr double kTolF32 = 1e-4;
const std::vector<int64_t> kRows = {1, 2, 17, 63, 64, 65, 127, 1000};

void sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

DeviceBuffer<int32_t> dev_count(int32_t n) { return cuda::to_device(std::vector<int32_t>{n}); }

// ---- GEMM ------------------------------------------------------------------------------------
void check_gemm(int64_t T, int64_t in, int64_t out, bool bias, bool f32out, bool accumulate, int64_t x_stride,
                uint64_t seed) {
  const int64_t xs = x_stride ? x_stride : in;
  auto x = rand_bf16(size_t(T * xs), seed, 1.0f), w = rand_bf16(size_t(out * in), seed + 1, 0.05f);
  auto b = rand_bf16(size_t(out), seed + 2, 0.5f), y0 = rand_bf16(size_t(T * out), seed + 3, 1.0f);
  std::vector<float> xd(size_t(T * in));
  for (int64_t t = 0; t < T; ++t)
    std::copy(x.begin() + t * xs, x.begin() + t * xs + in, xd.begin() + t * in);
  std::vector<float> ref(size_t(T * out));
  cpu::linear(xd.data(), w.data(), bias ? b.data() : nullptr, ref.data(), T, in, out);
  if (accumulate)
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
  auto dx = dev_bf16(x), dw = dev_bf16(w);
  std::vector<float> y;
  if (f32out) {
    auto db = cuda::to_device(b);
    DeviceBuffer<float> dy(size_t(T * out));
    if (accumulate) dy.upload(y0); else dy.fill_bytes(0xFF);
    cu::gemm_bf16_f32out(dx.data(), dw.data(), bias ? db.data() : nullptr, dy.data(), T, in, out, nullptr,
                         accumulate, x_stride);
    sync();
    y = dy.download();
  } else {
    auto db = dev_bf16(b);
    DeviceBuffer<bf16> dy(size_t(T * out));
    if (accumulate) dy = dev_bf16(y0); else dy.fill_bytes(0xFF);
    cu::gemm_bf16(dx.data(), dw.data(), bias ? db.data() : nullptr, dy.data(), T, in, out, nullptr, accumulate,
                  x_stride);
    sync();
    y = host_f32(dy);
  }
  const std::string shape = fmt::format("T={},in={},out={}{}{}{}", T, in, out, bias ? ",bias" : "",
                                        accumulate ? ",acc" : "", x_stride ? fmt::format(",ldx={}", x_stride) : "");
  EXPECT_TRUE(contract(f32out ? "gemm_bf16_f32out" : "gemm_bf16", shape, rel_err(y, ref),
                       f32out ? kTolF32 : kTolBf16));
}

}  // namespace

TEST(Gemm, RowCounts) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 100;
  for (int64_t T : kRows) {
    check_gemm(T, 256, 384, true, false, false, 0, seed++);
    check_gemm(T, 2048, 1024, false, false, false, 0, seed++);
  }
}

TEST(Gemm, Fp32OutLmHeadAndVariants) {
  MOEFOLD_REQUIRE_GPU();
  for (int64_t T : {1, 17, 64}) check_gemm(T, 1024, 32011, false, true, false, 0, 200 + uint64_t(T));
  check_gemm(65, 512, 768, true, true, false, 0, 210);
  check_gemm(17, 512, 768, false, false, true, 0, 211);  // y += x W^T
  check_gemm(63, 512, 768, true, true, true, 0, 212);
  check_gemm(17, 512, 768, false, false, false, 520, 213);  // strided x rows
  check_gemm(127, 2048, 8192, false, false, false, 0, 214);  // Qwen3.5 q_proj shape
}

TEST(GemmSmall, Basic) {
  MOEFOLD_REQUIRE_GPU();
  check_gemm(17, 64, 96, true, false, false, 0, 300);
  check_gemm(3, 64, 96, false, true, true, 72, 301);
}

// ---- RMSNorm ---------------------------------------------------------------------------------
namespace {

void check_rms_norm(int64_t T, int64_t dim, cpu::NormKind kind, int64_t live, uint64_t seed) {
  auto x = rand_bf16(size_t(T * dim), seed, 3.0f), w = rand_bf16(size_t(dim), seed + 1, 0.5f);
  auto dx = dev_bf16(x), dw = dev_bf16(w);
  DeviceBuffer<bf16> dy(size_t(T * dim));
  dy.fill_bytes(0xFF);
  auto dl = dev_count(int32_t(live));
  cu::rms_norm(dx.data(), dw.data(), dy.data(), T, dim, 1e-6f, kind, live < T ? dl.data() : nullptr, nullptr);
  sync();
  std::vector<float> ref(size_t(live * dim));
  cpu::rms_norm(x.data(), w.data(), ref.data(), live, dim, 1e-6f, kind);
  auto y = host_f32(dy);
  const std::string k = kind == cpu::NormKind::ZeroCentred ? "rms_norm_zc" : "rms_norm";
  const std::string shape = fmt::format("T={},live={},dim={}", T, live, dim);
  EXPECT_TRUE(contract(k, shape, rel_err(slice(y, 0, size_t(live * dim)), ref), kTolBf16));
  if (live < T) {
    EXPECT_TRUE(contract_exact(k + "_padding", shape, touched(host_bits(dy), size_t(live * dim), y.size())));
  }
}

void check_add_rms_norm(int64_t T, int64_t dim, int64_t live, uint64_t seed) {
  auto h = rand_bf16(size_t(T * dim), seed, 4.0f), y = rand_bf16(size_t(T * dim), seed + 1, 2.0f);
  auto w = rand_bf16(size_t(dim), seed + 2, 0.5f);
  auto dh = dev_bf16(h), dy = dev_bf16(y), dw = dev_bf16(w);
  DeviceBuffer<bf16> dx(size_t(T * dim));
  dx.fill_bytes(0xFF);
  auto dl = dev_count(int32_t(live));
  cu::add_rms_norm(dh.data(), dy.data(), dw.data(), dx.data(), T, dim, 1e-6f, cpu::NormKind::ZeroCentred,
                   live < T ? dl.data() : nullptr, nullptr);
  sync();
  std::vector<float> hs(size_t(live * dim)), ref(size_t(live * dim));
  for (size_t i = 0; i < hs.size(); ++i) hs[i] = bf16_to_f32(f32_to_bf16(h[i] + y[i]));
  cpu::rms_norm(hs.data(), w.data(), ref.data(), live, dim, 1e-6f, cpu::NormKind::ZeroCentred);
  auto hg = host_f32(dh), xg = host_f32(dx);
  size_t hmis = 0;
  for (size_t i = 0; i < hg.size(); ++i) hmis += i < hs.size() ? hg[i] != hs[i] : hg[i] != h[i];  // padding kept
  const std::string shape = fmt::format("T={},live={},dim={}", T, live, dim);
  EXPECT_TRUE(contract_exact("add_rms_norm_residual", shape, hmis));
  EXPECT_TRUE(contract("add_rms_norm", shape, rel_err(slice(xg, 0, hs.size()), ref), kTolBf16));
  if (live < T) {
    EXPECT_TRUE(contract_exact("add_rms_norm_padding", shape, touched(host_bits(dx), hs.size(), xg.size())));
  }
}

// Per-head norm in place inside Qwen3.5's fused [T, Hq, 2D] q_proj output (query halves only).
void check_head_norm(int64_t T, int64_t Hq, int64_t D, int64_t live, uint64_t seed) {
  auto qg = rand_bf16(size_t(T * Hq * 2 * D), seed, 3.0f), w = rand_bf16(size_t(D), seed + 1, 0.5f);
  auto dqg = dev_bf16(qg), dw = dev_bf16(w);
  auto dl = dev_count(int32_t(live));
  cu::rms_norm(dqg.data(), dw.data(), dqg.data(), T, D, 1e-6f, cpu::NormKind::ZeroCentred,
               live < T ? dl.data() : nullptr, nullptr, cu::HeadRows{Hq, 2 * Hq * D, 2 * D});
  sync();
  auto out = host_f32(dqg);
  std::vector<float> q(size_t(live * Hq * D)), ref(q.size()), got(q.size());
  for (int64_t r = 0; r < live * Hq; ++r)
    for (int64_t i = 0; i < D; ++i) {
      q[size_t(r * D + i)] = qg[size_t(r * 2 * D + i)];
      got[size_t(r * D + i)] = out[size_t(r * 2 * D + i)];
    }
  cpu::rms_norm(q.data(), w.data(), ref.data(), live * Hq, D, 1e-6f, cpu::NormKind::ZeroCentred);
  size_t untouched_bad = 0;  // gate halves and padding rows must be bit-identical
  for (int64_t r = 0; r < T * Hq; ++r)
    for (int64_t i = 0; i < 2 * D; ++i)
      if ((i >= D || r >= live * Hq) && out[size_t(r * 2 * D + i)] != qg[size_t(r * 2 * D + i)]) ++untouched_bad;
  const std::string shape = fmt::format("T={},live={},heads={},D={},stride=2D", T, live, Hq, D);
  EXPECT_TRUE(contract("rms_norm_heads_inplace", shape, rel_err(got, ref), kTolBf16));
  EXPECT_TRUE(contract_exact("rms_norm_heads_untouched", shape, untouched_bad));
}

}  // namespace

TEST(Norms, RowCounts) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 400;
  for (int64_t T : kRows) {
    check_rms_norm(T, 2048, cpu::NormKind::ZeroCentred, T, seed++);
    check_rms_norm(T, 77, cpu::NormKind::Plain, T, seed++);
    check_add_rms_norm(T, 2048, T, seed++);
    check_head_norm(T, 16, 256, T, seed++);
  }
  check_rms_norm(65, 2048, cpu::NormKind::Plain, 17, seed++);
  check_rms_norm(1000, 576, cpu::NormKind::ZeroCentred, 999, seed++);
  check_add_rms_norm(65, 2048, 17, seed++);
  check_add_rms_norm(64, 75, 63, seed++);
  check_head_norm(65, 2, 256, 17, seed++);
}

TEST(NormsSmall, Basic) {
  MOEFOLD_REQUIRE_GPU();
  check_rms_norm(17, 64, cpu::NormKind::Plain, 5, 500);
  check_rms_norm(3, 13, cpu::NormKind::ZeroCentred, 3, 501);
  check_add_rms_norm(9, 64, 4, 502);
  check_head_norm(5, 3, 32, 3, 503);
}

// ---- RoPE ------------------------------------------------------------------------------------
namespace {

struct RopeCase {
  int64_t Hq, Hkv, D, rot;
  double theta, llama3;
  bool fused_q;  // q inside a [T, Hq, 2D] fused q_proj output
};

void check_rope(const RopeCase& c, int64_t T, int64_t live, uint64_t seed) {
  const int64_t qw = c.fused_q ? 2 * c.D : c.D;
  auto qbuf = rand_bf16(size_t(T * c.Hq * qw), seed, 2.0f), k = rand_bf16(size_t(T * c.Hkv * c.D), seed + 1, 2.0f);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  const int32_t fixed[] = {0, 1, 99999, 100000, 131071, 262143, 65535, 4095};
  for (int64_t t = 0; t < T; ++t)
    pos[size_t(t)] = t < 8 ? fixed[t] : int32_t(mix64(seed * 7 + uint64_t(t)) % 100001);
  const auto inv = cpu::rope_inv_freq(c.rot, c.theta, c.llama3);
  cu::RopeFreqs freqs(c.rot, inv);
  auto dq = dev_bf16(qbuf), dk = dev_bf16(k);
  auto dpos = cuda::to_device(pos);
  auto dl = dev_count(int32_t(live));
  cu::apply_rope(dq.data(), cu::HeadRows{c.Hq, c.Hq * qw, qw}, dk.data(), cu::HeadRows{c.Hkv}, dpos.data(), T, c.D,
                 freqs, live < T ? dl.data() : nullptr, nullptr);
  sync();
  auto qo = host_f32(dq), ko = host_f32(dk);
  std::vector<float> q(size_t(live * c.Hq * c.D)), qgot(q.size());
  for (int64_t r = 0; r < live * c.Hq; ++r)
    for (int64_t i = 0; i < c.D; ++i) {
      q[size_t(r * c.D + i)] = qbuf[size_t(r * qw + i)];
      qgot[size_t(r * c.D + i)] = qo[size_t(r * qw + i)];
    }
  std::vector<float> kref(k.begin(), k.begin() + live * c.Hkv * c.D);
  cpu::apply_rope(q.data(), pos.data(), live, c.Hq, c.D, c.rot, inv.data());
  cpu::apply_rope(kref.data(), pos.data(), live, c.Hkv, c.D, c.rot, inv.data());
  std::vector<float> got = qgot, ref = q;
  got.insert(got.end(), ko.begin(), ko.begin() + ptrdiff_t(kref.size()));
  ref.insert(ref.end(), kref.begin(), kref.end());
  size_t not_bf16_exact = 0;  // against the reference rounded once to bf16
  for (size_t i = 0; i < got.size(); ++i) not_bf16_exact += got[i] != bf16_to_f32(f32_to_bf16(ref[i]));
  size_t untouched_bad = 0;
  for (int64_t r = 0; r < T * c.Hq; ++r)
    for (int64_t i = 0; i < qw; ++i)
      if ((i >= c.D || r >= live * c.Hq) && qo[size_t(r * qw + i)] != qbuf[size_t(r * qw + i)]) ++untouched_bad;
  for (size_t i = size_t(live * c.Hkv * c.D); i < k.size(); ++i) untouched_bad += ko[i] != k[i];
  const std::string shape = fmt::format("T={},live={},Hq={},Hkv={},D={},rot={},theta={:g}{},pos<=262143", T, live,
                                        c.Hq, c.Hkv, c.D, c.rot, c.theta, c.llama3 > 0 ? ",llama3" : "");
  EXPECT_TRUE(contract("rope", shape, rel_err(got, ref), kTolBf16));
  EXPECT_TRUE(contract("rope_bf16_mismatch_frac", shape, double(not_bf16_exact) / double(got.size()), 1e-2));
  EXPECT_TRUE(contract_exact("rope_untouched", shape, untouched_bad));
}

const RopeCase kQwen35{16, 2, 256, 64, 1e7, 0, true};
const RopeCase kLlama3{9, 3, 64, 64, 500000, 32, false};
const RopeCase kQwen3{32, 4, 128, 128, 1e6, 0, false};

}  // namespace

TEST(Rope, RowCounts) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 600;
  for (int64_t T : kRows) {
    check_rope(kQwen35, T, T, seed++);
    check_rope(kLlama3, T, T, seed++);
  }
  check_rope(kQwen3, 127, 127, seed++);
  check_rope(kQwen35, 65, 17, seed++);
  check_rope(kLlama3, 64, 63, seed++);
}

TEST(RopeSmall, Basic) {
  MOEFOLD_REQUIRE_GPU();
  check_rope(RopeCase{4, 2, 32, 16, 10000, 0, true}, 9, 6, 700);
  check_rope(RopeCase{3, 1, 64, 64, 500000, 8, false}, 5, 5, 701);
}

// ---- Embedding -------------------------------------------------------------------------------
namespace {

void check_embedding(int64_t T, int64_t V, int64_t H, int64_t live, bool bad_ids, uint64_t seed) {
  auto table = rand_bf16(size_t(V * H), seed, 1.0f);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t(mix64(seed + uint64_t(t)) % uint64_t(V));
  if (bad_ids && live >= 3) {
    ids[0] = int32_t(V);
    ids[2] = -1;
  }
  if (T > live) ids[size_t(T - 1)] = int32_t(V) + 1000;  // a padding row: never read
  auto dt = dev_bf16(table);
  auto di = cuda::to_device(ids);
  DeviceBuffer<bf16> dout(size_t(T * H));
  dout.fill_bytes(0xFF);
  auto flag = cuda::to_device(std::vector<int32_t>{0});
  auto dl = dev_count(int32_t(live));
  cu::embedding_gather(dt.data(), V, H, di.data(), dout.data(), T, live < T ? dl.data() : nullptr, flag.data(),
                       nullptr);
  sync();
  auto out = host_f32(dout);
  size_t mis = 0;
  bool any_bad = false;
  for (int64_t t = 0; t < live; ++t) {
    const int32_t id = ids[size_t(t)];
    const bool ok = id >= 0 && id < V;
    any_bad |= !ok;
    for (int64_t i = 0; i < H; ++i) mis += out[size_t(t * H + i)] != (ok ? table[size_t(id * H + i)] : 0.0f);
  }
  mis += touched(host_bits(dout), size_t(live * H), out.size());
  const std::string shape = fmt::format("T={},live={},V={},H={}{}", T, live, V, H, bad_ids ? ",bad_ids" : "");
  EXPECT_TRUE(contract_exact("embedding", shape, mis));
  EXPECT_TRUE(contract_exact("embedding_oob_flag", shape, size_t(flag.download()[0] != (any_bad ? 1 : 0))));
}

}  // namespace

TEST(Embedding, RowCounts) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 800;
  for (int64_t T : kRows) check_embedding(T, 5003, 2048, T, false, seed++);
  check_embedding(65, 1000, 77, 17, true, seed++);
  check_embedding(1000, 248320, 64, 1000, true, seed++);
}

TEST(EmbeddingSmall, Basic) {
  MOEFOLD_REQUIRE_GPU();
  check_embedding(9, 50, 64, 5, true, 900);
  check_embedding(4, 50, 7, 4, false, 901);
}

// ---- SwiGLU, gate, residual ------------------------------------------------------------------
namespace {

void check_swiglu(int64_t T, int64_t I, int64_t live, uint64_t seed) {
  auto gu = rand_bf16(size_t(T * 2 * I), seed, 4.0f);
  auto dgu = dev_bf16(gu);
  DeviceBuffer<bf16> dout(size_t(T * I));
  dout.fill_bytes(0xFF);
  auto dl = dev_count(int32_t(live));
  cu::swiglu(dgu.data(), dout.data(), T, I, live < T ? dl.data() : nullptr, nullptr);
  sync();
  std::vector<float> ref(size_t(live * I));
  cpu::swiglu(gu.data(), ref.data(), live, I);
  auto out = host_f32(dout);
  const std::string shape = fmt::format("T={},live={},I={}", T, live, I);
  EXPECT_TRUE(contract("swiglu", shape, rel_err(slice(out, 0, ref.size()), ref), kTolBf16));
  if (live < T) {
    EXPECT_TRUE(contract_exact("swiglu_padding", shape, touched(host_bits(dout), ref.size(), out.size())));
  }
}

// Output gate read in place from the fused q_proj layout, and the shared expert's scalar gate.
void check_gate(int64_t T, int64_t heads, int64_t D, bool scalar, int64_t live, uint64_t seed) {
  auto x = rand_bf16(size_t(T * heads * D), seed, 2.0f);
  const int64_t gw = scalar ? 1 : 2 * D;  // per-head gate row width in its buffer
  auto g = rand_bf16(size_t(T * heads * gw), seed + 1, 4.0f);
  auto dx = dev_bf16(x), dg = dev_bf16(g);
  DeviceBuffer<bf16> dy(x.size());
  dy.fill_bytes(0xFF);
  auto dl = dev_count(int32_t(live));
  const bf16* gate = scalar ? dg.data() : dg.data() + D;  // gate half of [query D | gate D]
  cu::sigmoid_gate_mul(dx.data(), gate, dy.data(), T, heads, D, live < T ? dl.data() : nullptr, nullptr,
                       cu::HeadRows{heads, heads * gw, gw}, scalar ? 0 : 1);
  sync();
  std::vector<float> ref(size_t(live * heads * D));
  for (int64_t t = 0; t < live; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D; ++i) {
        const float gv = scalar ? g[size_t((t * heads + h) * gw)] : g[size_t((t * heads + h) * gw + D + i)];
        ref[size_t((t * heads + h) * D + i)] = x[size_t((t * heads + h) * D + i)] * cpu::sigmoid(gv);
      }
  auto y = host_f32(dy);
  const std::string shape = fmt::format("T={},live={},heads={},D={}{}", T, live, heads, D, scalar ? ",scalar" : ",qg");
  EXPECT_TRUE(contract("sigmoid_gate_mul", shape, rel_err(slice(y, 0, ref.size()), ref), kTolBf16));
  if (live < T) {
    EXPECT_TRUE(contract_exact("sigmoid_gate_padding", shape, touched(host_bits(dy), ref.size(), y.size())));
  }
}

void check_residual(int64_t T, int64_t dim, int64_t live, uint64_t seed) {
  auto h = rand_bf16(size_t(T * dim), seed, 4.0f), y = rand_bf16(size_t(T * dim), seed + 1, 1.0f);
  auto dh = dev_bf16(h), dy = dev_bf16(y);
  auto dl = dev_count(int32_t(live));
  cu::residual_add(dh.data(), dy.data(), T, dim, live < T ? dl.data() : nullptr, nullptr);
  sync();
  auto out = host_f32(dh);
  size_t mis = 0;
  for (size_t i = 0; i < out.size(); ++i)
    mis += out[i] != (i < size_t(live * dim) ? bf16_to_f32(f32_to_bf16(h[i] + y[i])) : h[i]);
  EXPECT_TRUE(contract_exact("residual_add", fmt::format("T={},live={},dim={}", T, live, dim), mis));
}

}  // namespace

TEST(Elementwise, RowCounts) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 1000;
  for (int64_t T : kRows) {
    check_swiglu(T, 512, T, seed++);
    check_swiglu(T, 77, T, seed++);
    check_gate(T, 16, 256, false, T, seed++);
    check_gate(T, 1, 2048, true, T, seed++);
    check_residual(T, 2048, T, seed++);
  }
  check_swiglu(65, 512, 17, seed++);
  check_gate(65, 16, 256, false, 17, seed++);
  check_residual(65, 2048, 17, seed++);
  check_residual(64, 75, 63, seed++);
}

TEST(ElementwiseSmall, Basic) {
  MOEFOLD_REQUIRE_GPU();
  check_swiglu(9, 40, 5, 1100);
  check_swiglu(3, 7, 3, 1101);
  check_gate(5, 2, 32, false, 3, 1102);
  check_gate(5, 1, 64, true, 5, 1103);
  check_residual(9, 64, 5, 1104);
}

// ---- timings (run with --gtest_also_run_disabled_tests --gtest_filter='*Perf*') -----------------
TEST(CorePerf, DISABLED_Timings) {
  MOEFOLD_REQUIRE_GPU();
  struct G {
    int64_t T, in, out;
    bool f32;
  };
  for (const G& g : {G{1, 2048, 8192, false}, G{64, 2048, 8192, false}, G{4096, 2048, 8192, false},
                     G{1, 2048, 248320, true}, G{64, 2048, 248320, true}, G{8192, 4096, 2048, false}}) {
    DeviceBuffer<bf16> x(size_t(g.T * g.in)), w(size_t(g.out * g.in)), y(size_t(g.T * g.out));
    DeviceBuffer<float> yf(g.f32 ? size_t(g.T * g.out) : 0);
    x.fill_bytes(0x3C);
    w.fill_bytes(0x3C);
    const double us = time_us([&] {
      if (g.f32) cu::gemm_bf16_f32out(x.data(), w.data(), nullptr, yf.data(), g.T, g.in, g.out, nullptr);
      else cu::gemm_bf16(x.data(), w.data(), nullptr, y.data(), g.T, g.in, g.out, nullptr);
    });
    const double bytes = double(g.T * g.in + g.out * g.in) * 2 + double(g.T * g.out) * (g.f32 ? 4 : 2);
    const double flops = 2.0 * double(g.T) * double(g.in) * double(g.out);
    perf_line(g.f32 ? "gemm_bf16_f32out" : "gemm_bf16", fmt::format("T={},in={},out={}", g.T, g.in, g.out), us,
              fmt::format("TB/s={:.2f} TFLOP/s={:.1f}", bytes / us * 1e-6, flops / us * 1e-6));
  }
  const int64_t T = 4096, H = 2048;
  DeviceBuffer<bf16> h(size_t(T * H)), y(size_t(T * H)), x(size_t(T * H)), w(static_cast<size_t>(H));
  for (auto* b : {&h, &y, &x, &w}) b->fill_bytes(0x3C);
  double us = time_us([&] { cu::add_rms_norm(h.data(), y.data(), w.data(), x.data(), T, H, 1e-6f, cpu::NormKind::ZeroCentred, nullptr, nullptr); });
  perf_line("add_rms_norm", fmt::format("T={},dim={}", T, H), us, fmt::format("TB/s={:.2f}", 4.0 * T * H * 2 / us * 1e-6));
  us = time_us([&] { cu::rms_norm(h.data(), w.data(), x.data(), T, H, 1e-6f, cpu::NormKind::ZeroCentred, nullptr, nullptr); });
  perf_line("rms_norm", fmt::format("T={},dim={}", T, H), us, fmt::format("TB/s={:.2f}", 2.0 * T * H * 2 / us * 1e-6));
  DeviceBuffer<bf16> qg(size_t(T * 16 * 512)), k(size_t(T * 2 * 256));
  qg.fill_bytes(0x3C);
  k.fill_bytes(0x3C);
  DeviceBuffer<int32_t> pos(static_cast<size_t>(T));
  pos.fill_bytes(0x01);
  cu::RopeFreqs fr(64, cpu::rope_inv_freq(64, 1e7));
  us = time_us([&] {
    cu::rms_norm(qg.data(), w.data(), qg.data(), T, 256, 1e-6f, cpu::NormKind::ZeroCentred, nullptr, nullptr, cu::HeadRows{16, 16 * 512, 512});
  });
  perf_line("rms_norm_heads_inplace", fmt::format("T={},heads=16,D=256,stride=2D", T), us,
            fmt::format("TB/s={:.2f}", 2.0 * T * 16 * 256 * 2 / us * 1e-6));
  us = time_us([&] {
    cu::apply_rope(qg.data(), cu::HeadRows{16, 16 * 512, 512}, k.data(), cu::HeadRows{2}, pos.data(), T, 256, fr, nullptr, nullptr);
  });
  perf_line("rope", fmt::format("T={},Hq=16,Hkv=2,D=256,rot=64", T), us,
            fmt::format("TB/s={:.2f}", 2.0 * T * 18 * 64 * 2 / us * 1e-6));
  DeviceBuffer<bf16> gu(size_t(T * 1024)), act(size_t(T * 512));
  gu.fill_bytes(0x3C);
  us = time_us([&] { cu::swiglu(gu.data(), act.data(), T, 512, nullptr, nullptr); });
  perf_line("swiglu", fmt::format("T={},I=512", T), us, fmt::format("TB/s={:.2f}", 3.0 * T * 512 * 2 / us * 1e-6));
  DeviceBuffer<bf16> table(size_t(248320) * size_t(H));
  table.fill_bytes(0x3C);
  DeviceBuffer<int32_t> ids(static_cast<size_t>(T));
  ids.fill_bytes(0x01);
  us = time_us([&] { cu::embedding_gather(table.data(), 248320, H, ids.data(), x.data(), T, nullptr, nullptr, nullptr); });
  perf_line("embedding", fmt::format("T={},H={}", T, H), us, fmt::format("TB/s={:.2f}", 2.0 * T * H * 2 / us * 1e-6));
}
