// Contract test of cuda::qk_norm_rope_kv_write (the attention prologue in one launch) against the four
// launches it replaces: rms_norm of q heads and of k heads (HeadRows), apply_rope, kv_cache_write. q, k
// (in place) and both cache layers compared byte for byte over the whole buffers, padding tokens poisoned
// and untouched, negative slots skipped; for the Qwen3.5 gated layout (q | gate per head inside one fused
// projection row), the Qwen3 fused layout and separate buffers.
#include "ops/cuda/cuda_check.h"  // first: sets up fmt for nvcc

#include <gtest/gtest.h>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/qk_norm_rope.h"

using namespace moefold;
using test::contract_exact;
using bf16 = __nv_bfloat16;
using cuda::HeadRows;
using cuda::NormKind;

namespace {

struct PrologueCase {
  int hq, hkv, dim, rotary, cap, live;
  bool gated, fused_proj, zero_centred;
};

struct PrologueOut {
  std::vector<uint16_t> proj, kc, vc;
};

PrologueOut run(const PrologueCase& c, bool fused, uint64_t seed) {
  const int64_t D = c.dim, qw = int64_t(c.hq) * D * (c.gated ? 2 : 1), kvw = int64_t(c.hkv) * D;
  const int64_t W = c.fused_proj ? qw + 2 * kvw : 0;  // one projection row [q (| gate) | k | v], or three buffers
  const int64_t per_row = c.fused_proj ? W : qw + 2 * kvw;
  auto proj = test::rand_bf16(size_t(c.cap * per_row), seed, 3.0f);
  // Padding tokens' q, k and v rows hold NaN (one region per tensor with separate buffers).
  if (c.fused_proj) {
    for (size_t i = size_t(c.live * per_row); i < proj.size(); ++i) proj[i] = NAN;
  } else {
    for (auto [start, width] : {std::pair{int64_t(0), qw}, std::pair{c.cap * qw, kvw}, std::pair{c.cap * (qw + kvw), kvw}})
      for (int64_t i = start + c.live * width; i < start + c.cap * width; ++i) proj[size_t(i)] = NAN;
  }
  auto proj_d = test::dev_bf16(proj);
  bf16* base = proj_d.data();
  bf16 *q = base, *k = c.fused_proj ? base + qw : base + c.cap * qw,
       *v = c.fused_proj ? base + qw + kvw : base + c.cap * (qw + kvw);
  const int64_t ts_q = c.fused_proj ? W : qw, ts_kv = c.fused_proj ? W : kvw;
  const HeadRows q_rows{c.hq, ts_q, c.gated ? 2 * D : D}, k_rows{c.hkv, ts_kv, D};
  auto qn = test::dev_bf16(test::rand_bf16(size_t(D), seed + 1, 0.6f));
  auto kn = test::dev_bf16(test::rand_bf16(size_t(D), seed + 2, 0.6f));
  const int64_t slots = 2 * c.cap + 3;
  test::DeviceBuffer<bf16> kc(size_t(slots * kvw)), vc(size_t(slots * kvw));
  kc.fill_bytes(0xFF);
  vc.fill_bytes(0xFF);
  std::vector<int32_t> slot(size_t(c.cap)), pos(size_t(c.cap));
  for (int t = 0; t < c.cap; ++t) {
    slot[size_t(t)] = t % 5 == 3 ? -1 : int32_t((2 * t + 1) % slots);
    pos[size_t(t)] = int32_t(test::mix64(seed + t) % 120000);
  }
  auto slot_d = cuda::to_device(slot), pos_d = cuda::to_device(pos), live_d = cuda::to_device(std::vector<int32_t>{c.live});
  const cuda::RopeFreqs freqs(c.rotary, cpu::rope_inv_freq(c.rotary, 1e7));
  const float eps = 1e-6f;
  const NormKind kind = c.zero_centred ? NormKind::ZeroCentred : NormKind::Plain;
  if (fused) {
    const cuda::QkNormRopeArgs a{q, q_rows, k, k_rows, v, ts_kv, qn.data(), kn.data(), eps, kind,
                                 kc.data(), vc.data(), slot_d.data(), pos_d.data()};
    EXPECT_TRUE(cuda::qk_norm_rope_supported(a, D, freqs));
    cuda::qk_norm_rope_kv_write(a, c.cap, D, freqs, live_d.data(), nullptr);
  } else {
    cuda::rms_norm(q, qn.data(), q, c.cap, D, eps, kind, live_d.data(), nullptr, q_rows);
    cuda::rms_norm(k, kn.data(), k, c.cap, D, eps, kind, live_d.data(), nullptr, k_rows);
    cuda::apply_rope(q, q_rows, k, k_rows, pos_d.data(), c.cap, D, freqs, live_d.data(), nullptr);
    cuda::kv_cache_write(k, ts_kv, v, ts_kv, kc.data(), vc.data(), slot_d.data(), c.cap, kvw, live_d.data(), nullptr);
  }
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  return {test::host_bits(proj_d), test::host_bits(kc), test::host_bits(vc)};
}

size_t mismatches(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  size_t n = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] != b[i];
  return n;
}

}  // namespace

TEST(QkNormRope, BitwiseEqualsFourLaunches) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 31000;
  std::vector<PrologueCase> cases;
  for (auto [cap, live] : {std::pair{1, 1}, std::pair{5, 3}, std::pair{64, 64}, std::pair{300, 257}, std::pair{4, 0}})
    for (int zc = 0; zc < 2; ++zc) {
      cases.push_back({16, 2, 256, 64, cap, live, true, true, zc != 0});     // Qwen3.5 / 3.6 gated attention
      cases.push_back({32, 4, 128, 128, cap, live, false, true, zc != 0});   // Qwen3-30B-A3B
      cases.push_back({8, 8, 64, 32, cap, live, false, false, zc != 0});     // separate q / k / v buffers
      cases.push_back({40, 8, 128, 64, cap, live, false, false, zc != 0});   // more heads than the block's warps
    }
  for (const PrologueCase& c : cases) {
    const std::string shp = fmt::format("hq={},hkv={},d={},rot={},cap={},live={},gated={},fused={},zc={}", c.hq, c.hkv,
                                        c.dim, c.rotary, c.cap, c.live, int(c.gated), int(c.fused_proj),
                                        int(c.zero_centred));
    const PrologueOut a = run(c, false, ++seed), b = run(c, true, seed);
    EXPECT_TRUE(contract_exact("qk_norm_rope.proj_bits", shp, mismatches(a.proj, b.proj)));
    EXPECT_TRUE(contract_exact("qk_norm_rope.k_cache_bits", shp, mismatches(a.kc, b.kc)));
    EXPECT_TRUE(contract_exact("qk_norm_rope.v_cache_bits", shp, mismatches(a.vc, b.vc)));
    size_t nan = 0;  // no NaN written to the cache (the poison is 0xFFFF; padding tokens hold 0x7FC0)
    for (uint16_t bits : b.kc) nan += (bits & 0x7F80) == 0x7F80 && (bits & 0x7F) != 0 && bits != 0xFFFF;
    EXPECT_TRUE(contract_exact("qk_norm_rope.k_cache_no_new_nan", shp, nan));
  }
}

TEST(QkNormRope, UnsupportedLayoutsDecline) {
  MOEFOLD_REQUIRE_GPU();
  test::DeviceBuffer<bf16> buf(4096);
  auto i32 = cuda::to_device(std::vector<int32_t>{0});
  const cuda::RopeFreqs f64(64, cpu::rope_inv_freq(64, 1e4)), f12(12, cpu::rope_inv_freq(12, 1e4));
  cuda::QkNormRopeArgs a{buf.data(), {2, 0, 0}, buf.data(), {1, 0, 0}, buf.data(), 0, buf.data(), buf.data(), 1e-6f,
                         NormKind::Plain, buf.data(), buf.data(), i32.data(), i32.data()};
  EXPECT_TRUE(cuda::qk_norm_rope_supported(a, 128, f64));
  EXPECT_FALSE(cuda::qk_norm_rope_supported(a, 96, f64));   // head size 96: the separate launches
  EXPECT_FALSE(cuda::qk_norm_rope_supported(a, 128, f12));  // rotary half 6: not whole lanes
  a.k = buf.data() + 1;                                     // misaligned k
  EXPECT_FALSE(cuda::qk_norm_rope_supported(a, 128, f64));
}
