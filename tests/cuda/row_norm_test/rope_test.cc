// RoPE after the rewrite (vector items, loads before the cos/sin table): bitwise equal to main's
// kernel (legacy_kernels.cu: the per-element math is unchanged), within bf16 tolerance of
// cpu::apply_rope, padding tokens and the parts of each row it must not touch left bit-identical.
// Shapes: Qwen3.5/3.6 (q inside the fused q_proj output, partial rotary), Llama-3 scaling, full rotary
// with more items than threads, half = 6 (V = 2), q only; tokens 1, 2, 17, 128, 4100.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda/row_norm_test/legacy_kernels.h"
#include "cuda/row_norm_test/row_norm_test_util.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/rope.h"

using namespace moefold;
using namespace moefold::test;
using namespace moefold::test::rownorm;

namespace {

struct RopeCase {
  int64_t Hq, Hkv, D, rot;
  double theta, llama3;
  bool fused_q, with_k;
};

void check_rope(const RopeCase& c, int64_t T, uint64_t seed) {
  const int64_t cap = T + 2, qw = c.fused_q ? 2 * c.D : c.D;
  auto qbuf = rand_bf16(size_t(cap * c.Hq * qw), seed, 2.0f), k = rand_bf16(size_t(cap * c.Hkv * c.D), seed + 1, 2.0f);
  std::vector<int32_t> pos(static_cast<size_t>(cap));
  const int32_t fixed[] = {0, 1, 99999, 100000, 131071, 262143, 65535, 4095};
  for (int64_t t = 0; t < cap; ++t) pos[size_t(t)] = t < 8 ? fixed[t] : int32_t(mix64(seed * 7 + uint64_t(t)) % 200001);
  const auto inv = cpu::rope_inv_freq(c.rot, c.theta, c.llama3);
  cuda::RopeFreqs freqs(c.rot, inv);
  auto dpos = cuda::to_device(pos);
  auto dl = dev_count(T);
  std::vector<uint16_t> qo[2], ko[2];
  for (int v = 0; v < 2; ++v) {  // 0: today's kernel, 1: main's
    auto dq = dev_bf16(qbuf), dk = dev_bf16(k);
    bf16* kp = c.with_k ? dk.data() : nullptr;
    if (v == 0)
      cuda::apply_rope(dq.data(), cuda::HeadRows{c.Hq, c.Hq * qw, qw}, kp, cuda::HeadRows{c.Hkv}, dpos.data(), cap, c.D,
                       freqs, dl.data(), nullptr);
    else
      legacy::apply_rope(dq.data(), cuda::HeadRows{c.Hq, c.Hq * qw, qw}, kp, cuda::HeadRows{c.Hkv}, dpos.data(), cap,
                         c.D, freqs, dl.data(), nullptr);
    device_sync();
    qo[v] = host_bits(dq);
    ko[v] = host_bits(dk);
  }
  const std::string shape = fmt::format("T={},cap={},Hq={},Hkv={},D={},rot={}{}{}", T, cap, c.Hq, c.with_k ? c.Hkv : 0,
                                        c.D, c.rot, c.llama3 > 0 ? ",llama3" : "", c.fused_q ? ",fused_q" : "");
  size_t diff = 0;
  for (size_t i = 0; i < qo[0].size(); ++i) diff += qo[0][i] != qo[1][i];
  for (size_t i = 0; i < ko[0].size(); ++i) diff += ko[0][i] != ko[1][i];
  EXPECT_TRUE(contract_exact("rope_bitwise_vs_main", shape, diff));
  std::vector<float> q(size_t(T * c.Hq * c.D)), got(q.size());
  for (int64_t r = 0; r < T * c.Hq; ++r)
    for (int64_t i = 0; i < c.D; ++i) {
      q[size_t(r * c.D + i)] = qbuf[size_t(r * qw + i)];
      got[size_t(r * c.D + i)] = bits_to_f32(qo[0][size_t(r * qw + i)]);
    }
  cpu::apply_rope(q.data(), pos.data(), T, c.Hq, c.D, c.rot, inv.data());
  std::vector<float> ref = q;
  if (c.with_k) {
    std::vector<float> kref(k.begin(), k.begin() + T * c.Hkv * c.D);
    cpu::apply_rope(kref.data(), pos.data(), T, c.Hkv, c.D, c.rot, inv.data());
    ref.insert(ref.end(), kref.begin(), kref.end());
    auto kg = bits_to_f32(ko[0], 0, kref.size());
    got.insert(got.end(), kg.begin(), kg.end());
  }
  EXPECT_TRUE(contract("rope", shape, rel_err(got, ref), 1e-2));
  size_t bad = 0;  // gate halves, padding tokens, and k when not passed: bit-identical to the input
  for (int64_t r = 0; r < cap * c.Hq; ++r)
    for (int64_t i = 0; i < qw; ++i)
      if ((i >= c.D || r >= T * c.Hq) && bits_to_f32(qo[0][size_t(r * qw + i)]) != qbuf[size_t(r * qw + i)]) ++bad;
  for (size_t i = c.with_k ? size_t(T * c.Hkv * c.D) : 0; i < k.size(); ++i) bad += bits_to_f32(ko[0][i]) != k[i];
  EXPECT_TRUE(contract_exact("rope_untouched", shape, bad));
}

const RopeCase kCases[] = {
    {16, 2, 256, 64, 1e7, 0, true, true},       // Qwen3.5/3.6: 72 items of 8 pairs
    {9, 3, 64, 64, 500000, 32, false, true},    // Llama-3 scaling
    {64, 8, 128, 128, 1e6, 0, false, true},     // full rotary: 576 items > 512 threads
    {3, 1, 24, 12, 10000, 0, false, true},      // half = 6: V = 2
    {4, 2, 32, 16, 10000, 0, true, false},      // q only
};

}  // namespace

TEST(RowNormRope, BitwiseVsMainAndCpu) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 7000;
  for (const RopeCase& c : kCases)
    for (int64_t T : {1, 2, 17, 128, 4100}) check_rope(c, T, seed++);
}

TEST(RowNormRopeSmall, SanitizerCases) {
  MOEFOLD_REQUIRE_GPU();
  for (const RopeCase& c : kCases) check_rope(c, 3, 7100);
}
