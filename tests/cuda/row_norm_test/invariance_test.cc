// Batch invariance of the norm and RoPE kernels: one probe token's output bits are the same when it is
// computed alone (a 1-row launch), as row 0 of a 256-row bucket with 1 live row, inside 256 rows and
// inside 4100 rows at other positions, among different random neighbours, with different live counts
// (all rows live, the probe the last live row, the probe well inside the live part), and for rms_norm /
// add_rms_norm at 1, 2 and 4 rows per thread (MOEFOLD_NORM_ROWS_PER_THREAD). A reduction order
// that depended on the row count, the live count, the grid or the row's place in its block would show
// here. Kernels: rms_norm at widths 2048 / 576 / 64 (rows sharing a warp) / 4100 (2 vectors per thread) /
// 8191 (the loop form), add_rms_norm 2048 (h and x), the per-head q norm in the fused q_proj layout,
// gated_rms_norm 32 x 128 and RoPE (Qwen3.6 shapes).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "cuda/row_norm_test/row_norm_test_util.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/gated_rms_norm.h"
#include "ops/cuda/rope.h"

using namespace moefold;
using namespace moefold::test;
using namespace moefold::test::rownorm;

namespace {

struct Placement {
  int64_t cap, live, pos;  // live < 0: nullptr (all cap rows live)
  uint64_t neighbours;     // seed of the other rows
  int rows_per_thread;     // MOEFOLD_NORM_ROWS_PER_THREAD for rms_norm / add_rms_norm (from 1024 rows on)
};

const Placement kPlacements[] = {
    {1, -1, 0, 0, 1},         {256, 1, 0, 11, 1},         {256, 256, 137, 12, 1},  {256, 138, 137, 13, 2},
    {256, 200, 7, 14, 4},     {4100, -1, 4000, 15, 1},    {4100, 4001, 4000, 16, 1}, {4100, 3000, 5, 17, 1},
    {4100, -1, 4000, 18, 2},  {4100, 4001, 4000, 19, 4},  {4100, 3000, 5, 20, 2},  {4100, 4099, 1023, 21, 4},
};

/// Sets MOEFOLD_NORM_ROWS_PER_THREAD for its lifetime (read by each launch).
struct RowsPerThread {
  explicit RowsPerThread(int n) { setenv("MOEFOLD_NORM_ROWS_PER_THREAD", std::to_string(n).c_str(), 1); }
  ~RowsPerThread() { unsetenv("MOEFOLD_NORM_ROWS_PER_THREAD"); }
};

/// Rows [cap, width] of random values (seed) with the probe's width values at row pos.
std::vector<float> place(const std::vector<float>& probe, int64_t cap, int64_t pos, uint64_t seed, float amp) {
  const size_t w = probe.size();
  auto v = rand_bf16(size_t(cap) * w, seed, amp);
  std::copy(probe.begin(), probe.end(), v.begin() + ptrdiff_t(size_t(pos) * w));
  return v;
}

std::vector<uint16_t> row_bits(const std::vector<uint16_t>& b, int64_t pos, size_t w) {
  return std::vector<uint16_t>(b.begin() + ptrdiff_t(size_t(pos) * w), b.begin() + ptrdiff_t(size_t(pos + 1) * w));
}

/// Runs f(placement) -> the probe's output bits for every placement; counts those that differ from the
/// first (alone) and prints one contract line.
void expect_invariant(const std::string& kernel, const std::string& shape,
                      const std::function<std::vector<uint16_t>(const Placement&)>& f) {
  const auto alone = [&] {
    RowsPerThread rpt(kPlacements[0].rows_per_thread);
    return f(kPlacements[0]);
  }();
  size_t nan = 0;
  for (uint16_t b : alone) nan += (b & 0x7F80) == 0x7F80;  // not finite: never passes
  size_t differing = nan ? 1 : 0;
  for (size_t i = 1; i < std::size(kPlacements); ++i) {
    RowsPerThread rpt(kPlacements[i].rows_per_thread);
    const auto got = f(kPlacements[i]);
    if (got != alone) {
      ++differing;
      ADD_FAILURE() << kernel << " " << shape << ": placement cap=" << kPlacements[i].cap
                    << " live=" << kPlacements[i].live << " pos=" << kPlacements[i].pos
                    << " rows_per_thread=" << kPlacements[i].rows_per_thread << " differs";
    }
  }
  EXPECT_TRUE(contract_exact(kernel + "_batch_invariant", shape + ",placements=12", differing));
}

DeviceBuffer<int32_t> live_of(const Placement& p) { return dev_count(p.live < 0 ? p.cap : p.live); }

}  // namespace

TEST(RowNormInvariance, RmsNormAndAddRmsNorm) {
  MOEFOLD_REQUIRE_GPU();
  for (int64_t dim : {2048, 576, 64, 4100, 8191}) {
    const auto probe = rand_bf16(size_t(dim), 900 + uint64_t(dim), 3.0f), w = rand_bf16(size_t(dim), 901, 0.5f);
    expect_invariant("rms_norm", fmt::format("dim={}", dim), [&](const Placement& p) {
      auto x = place(probe, p.cap, p.pos, p.neighbours, 3.0f);
      const int64_t live = p.live < 0 ? p.cap : p.live;
      return row_bits(run_rms_norm(x, w, p.cap, live, dim, true, p.live < 0), p.pos, size_t(dim));
    });
  }
  const int64_t dim = 2048;
  const auto ph = rand_bf16(size_t(dim), 910, 4.0f), py = rand_bf16(size_t(dim), 911, 2.0f);
  const auto w = rand_bf16(size_t(dim), 912, 0.5f);
  for (int out = 0; out < 2; ++out)
    expect_invariant(out ? "add_rms_norm_x" : "add_rms_norm_h", "dim=2048", [&](const Placement& p) {
      auto h = place(ph, p.cap, p.pos, p.neighbours, 4.0f), y = place(py, p.cap, p.pos, p.neighbours + 100, 2.0f);
      const int64_t live = p.live < 0 ? p.cap : p.live;
      auto [hb, xb] = run_add_rms_norm(h, y, w, p.cap, live, dim, true, p.live < 0);
      return row_bits(out ? xb : hb, p.pos, size_t(dim));
    });
}

TEST(RowNormInvariance, HeadNormGatedNormRope) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t Hq = 16, Hkv = 2, D = 256, Hv = 32, Dv = 128;
  // q_norm on the query halves of the fused [T, Hq, 2D] rows, in place.
  const auto pq = rand_bf16(size_t(Hq * 2 * D), 920, 3.0f), wq = rand_bf16(size_t(D), 921, 0.5f);
  expect_invariant("rms_norm_heads", "heads=16,D=256,stride=2D", [&](const Placement& p) {
    auto qg = place(pq, p.cap, p.pos, p.neighbours, 3.0f);
    auto d = dev_bf16(qg), dw = dev_bf16(wq);
    auto dl = live_of(p);
    cuda::rms_norm(d.data(), dw.data(), d.data(), p.cap, D, 1e-6f, cpu::NormKind::ZeroCentred,
                   p.live < 0 ? nullptr : dl.data(), nullptr, cuda::HeadRows{Hq, 2 * Hq * D, 2 * D});
    device_sync();
    return row_bits(host_bits(d), p.pos, size_t(Hq * 2 * D));
  });
  // gated_rms_norm over Hv value heads of Dv, z read from a wider fused row.
  const int64_t zs = Hv * Dv + 64;
  const auto px = rand_bf16(size_t(Hv * Dv), 930, 2.0f), pz = rand_bf16(size_t(zs), 931, 3.0f);
  const auto wg = rand_bf16(size_t(Dv), 932, 1.0f);
  expect_invariant("gated_rms_norm", "heads=32,dim=128", [&](const Placement& p) {
    auto x = place(px, p.cap, p.pos, p.neighbours, 2.0f), z = place(pz, p.cap, p.pos, p.neighbours + 100, 3.0f);
    auto dx = dev_bf16(x), dz = dev_bf16(z), dw = dev_bf16(wg);
    DeviceBuffer<bf16> dy(x.size());
    dy.fill_bytes(0xFF);
    auto dl = live_of(p);
    cuda::gated_rms_norm(dx.data(), dz.data(), dw.data(), dy.data(), p.cap, Hv, Dv, 1e-6f,
                         p.live < 0 ? nullptr : dl.data(), nullptr, zs);
    device_sync();
    return row_bits(host_bits(dy), p.pos, size_t(Hv * Dv));
  });
  // RoPE on q (fused layout) and k at one position.
  const auto pk = rand_bf16(size_t(Hkv * D), 941, 2.0f);
  cuda::RopeFreqs freqs(64, cpu::rope_inv_freq(64, 1e7));
  expect_invariant("rope", "Hq=16,Hkv=2,D=256,rot=64", [&](const Placement& p) {
    auto qg = place(pq, p.cap, p.pos, p.neighbours, 2.0f), k = place(pk, p.cap, p.pos, p.neighbours + 100, 2.0f);
    std::vector<int32_t> pos(size_t(p.cap));
    for (int64_t t = 0; t < p.cap; ++t) pos[size_t(t)] = int32_t(mix64(p.neighbours + uint64_t(t)) % 100000);
    pos[size_t(p.pos)] = 77777;
    auto dq = dev_bf16(qg), dk = dev_bf16(k);
    auto dpos = cuda::to_device(pos);
    auto dl = live_of(p);
    cuda::apply_rope(dq.data(), cuda::HeadRows{Hq, 2 * Hq * D, 2 * D}, dk.data(), cuda::HeadRows{Hkv}, dpos.data(),
                     p.cap, D, freqs, p.live < 0 ? nullptr : dl.data(), nullptr);
    device_sync();
    auto b = row_bits(host_bits(dq), p.pos, size_t(Hq * 2 * D));
    auto kb = row_bits(host_bits(dk), p.pos, size_t(Hkv * D));
    b.insert(b.end(), kb.begin(), kb.end());
    return b;
  });
}
