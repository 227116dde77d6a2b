// Contract tests of the multi-thread-per-row norm kernels against fp64 CPU references on bf16-rounded
// random inputs: rms_norm (dense, in place, per-head strided rows), add_rms_norm (the rounded residual
// bitwise, the norm within bf16 tolerance) and gated_rms_norm, over row widths 6..8200 that take every
// layout of row_norm.cuh (rows sharing a warp, whole warps per row, 2 vectors per thread, the loop
// form; vector widths 8/4/2/1, incl. by misaligned pointers), rows 1, 2, 17, 128, 4100, a live count
// below the capacity (padding rows stay poisoned / untouched); rms_norm / add_rms_norm also at 2 and 4
// rows per thread (MOEFOLD_NORM_ROWS_PER_THREAD). Outputs are poisoned with NaN before
// each run; the check is the worst row's relative error (NaN never passes). Tolerance 1e-2 (bf16).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cuda/row_norm_test/row_norm_test_util.h"
#include "ops/cuda/gated_rms_norm.h"

using namespace moefold;
using namespace moefold::test;
using namespace moefold::test::rownorm;

namespace {

constexpr double kTol = 1e-2;

/// The worst per-row ||got - ref|| / ||ref|| over rows [0, rows) of width dim (inf on NaN).
double worst_row_err(const std::vector<float>& got, const std::vector<double>& ref, int64_t rows, int64_t dim) {
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < dim; ++i) {
      const double g = got[size_t(r * dim + i)], e = ref[size_t(r * dim + i)];
      if (!std::isfinite(g)) return INFINITY;
      num += (g - e) * (g - e);
      den += e * e;
    }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-300)));
  }
  return worst;
}

void check_rms_norm(int64_t rows, int64_t dim, bool zc, int64_t x_off, bool in_place, uint64_t seed) {
  const int64_t cap = rows + 3;  // 3 padding rows
  auto x = rand_bf16(size_t(cap * dim), seed, 3.0f), w = rand_bf16(size_t(dim), seed + 1, 0.5f);
  auto bits = run_rms_norm(x, w, cap, rows, dim, zc, false, x_off, in_place);
  auto ref = ref_rms_norm(x, w, rows, dim, 1e-6, zc);
  const std::string shape = fmt::format("rows={},cap={},dim={},off={}{}", rows, cap, dim, x_off, in_place ? ",in_place" : "");
  const std::string k = zc ? "rms_norm_zc" : "rms_norm";
  EXPECT_TRUE(contract(k, shape, worst_row_err(bits_to_f32(bits, 0, size_t(rows * dim)), ref, rows, dim), kTol));
  size_t bad = 0;  // padding rows: poisoned (out of place) or the input (in place), bit for bit
  for (size_t i = size_t(rows * dim); i < bits.size(); ++i)
    bad += in_place ? bits_to_f32(bits[i]) != x[i] : bits[i] != 0xFFFF;
  EXPECT_TRUE(contract_exact(k + "_padding", shape, bad));
}

void check_add_rms_norm(int64_t rows, int64_t dim, bool zc, uint64_t seed) {
  const int64_t cap = rows + 3;
  auto h = rand_bf16(size_t(cap * dim), seed, 4.0f), y = rand_bf16(size_t(cap * dim), seed + 1, 2.0f);
  auto w = rand_bf16(size_t(dim), seed + 2, 0.5f);
  auto [hb, xb] = run_add_rms_norm(h, y, w, cap, rows, dim, zc, false);
  std::vector<float> hs(size_t(rows * dim));
  for (size_t i = 0; i < hs.size(); ++i) hs[i] = bf16_to_f32(f32_to_bf16(h[i] + y[i]));
  size_t hmis = 0;
  for (size_t i = 0; i < hb.size(); ++i) hmis += bits_to_f32(hb[i]) != (i < hs.size() ? hs[i] : h[i]);
  const std::string shape = fmt::format("rows={},cap={},dim={}", rows, cap, dim);
  EXPECT_TRUE(contract_exact("add_rms_norm_residual", shape, hmis));
  auto ref = ref_rms_norm(hs, w, rows, dim, 1e-6, zc);
  EXPECT_TRUE(contract("add_rms_norm", shape, worst_row_err(bits_to_f32(xb, 0, hs.size()), ref, rows, dim), kTol));
  EXPECT_TRUE(contract_exact("add_rms_norm_padding", shape, touched(xb, hs.size(), xb.size())));
}

// Per-head norm in place on the query halves of a fused [T, H, 2D] projection output.
void check_head_norm(int64_t T, int64_t H, int64_t D, uint64_t seed) {
  const int64_t cap = T + 2;
  auto qg = rand_bf16(size_t(cap * H * 2 * D), seed, 3.0f), w = rand_bf16(size_t(D), seed + 1, 0.5f);
  auto dqg = dev_bf16(qg), dw = dev_bf16(w);
  auto dl = dev_count(T);
  cuda::rms_norm(dqg.data(), dw.data(), dqg.data(), cap, D, 1e-6f, cpu::NormKind::ZeroCentred, dl.data(), nullptr,
                 cuda::HeadRows{H, 2 * H * D, 2 * D});
  device_sync();
  auto out = host_bits(dqg);
  std::vector<float> q(size_t(T * H * D)), got(q.size());
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t i = 0; i < D; ++i) {
      q[size_t(r * D + i)] = qg[size_t(r * 2 * D + i)];
      got[size_t(r * D + i)] = bits_to_f32(out[size_t(r * 2 * D + i)]);
    }
  auto ref = ref_rms_norm(q, w, T * H, D, 1e-6, true);
  size_t bad = 0;  // gate halves and padding tokens: bit-identical to the input
  for (int64_t r = 0; r < cap * H; ++r)
    for (int64_t i = 0; i < 2 * D; ++i)
      if ((i >= D || r >= T * H) && bits_to_f32(out[size_t(r * 2 * D + i)]) != qg[size_t(r * 2 * D + i)]) ++bad;
  const std::string shape = fmt::format("T={},cap={},heads={},D={},stride=2D", T, cap, H, D);
  EXPECT_TRUE(contract("rms_norm_heads_inplace", shape, worst_row_err(got, ref, T * H, D), kTol));
  EXPECT_TRUE(contract_exact("rms_norm_heads_untouched", shape, bad));
}

void check_gated(int64_t T, int64_t H, int64_t D, int64_t z_extra, uint64_t seed) {
  const int64_t cap = T + 2, zs = H * D + z_extra;
  auto x = rand_bf16(size_t(cap * H * D), seed, 2.0f), z = rand_bf16(size_t(cap * zs), seed + 1, 3.0f);
  auto w = rand_bf16(size_t(D), seed + 2, 1.0f);
  auto dx = dev_bf16(x), dz = dev_bf16(z), dw = dev_bf16(w);
  DeviceBuffer<bf16> dy(x.size());
  dy.fill_bytes(0xFF);
  auto dl = dev_count(T);
  cuda::gated_rms_norm(dx.data(), dz.data(), dw.data(), dy.data(), cap, H, D, 1e-6f, dl.data(), nullptr, zs);
  device_sync();
  auto bits = host_bits(dy);
  std::vector<float> zd(size_t(T * H * D));
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(z.begin() + t * zs, H * D, zd.begin() + t * H * D);
  auto ref = ref_gated(x, zd, w, T * H, D, 1e-6);
  const std::string shape = fmt::format("T={},cap={},heads={},dim={},z_stride={}", T, cap, H, D, zs);
  EXPECT_TRUE(contract("gated_rms_norm", shape,
                       worst_row_err(bits_to_f32(bits, 0, size_t(T * H * D)), ref, T * H, D), kTol));
  EXPECT_TRUE(contract_exact("gated_rms_norm_padding", shape, touched(bits, size_t(T * H * D), bits.size())));
}

const std::vector<int64_t> kRowCounts = {1, 2, 17, 128, 4100};
// 64..8192 incl. 2048 (Qwen3.5/3.6 hidden) and 576 (SmolLM2); odd multiples of the vector width (1000,
// 2056, 1500 -> V=4, 6 -> V=2, 77 / 13 -> V=1), 4100 (V=4, 2 vectors per thread), 8200 (V=8, 2 per
// thread), 8191 (V=1, the loop form).
const std::vector<int64_t> kDims = {64, 128, 256, 576, 1000, 2048, 2056, 4096, 8192, 1500, 6, 77, 13, 4100, 8200, 8191};

}  // namespace

TEST(RowNorm, RmsNormWidthsAndRows) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 10;
  for (int64_t dim : kDims)
    for (int64_t rows : kRowCounts) {
      if (rows == 4100 && dim > 2056 && dim != 8192) continue;  // keep the run short
      check_rms_norm(rows, dim, (seed & 1) != 0, 0, false, seed);
      seed += 3;
    }
}

TEST(RowNorm, RmsNormInPlaceAndMisaligned) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 2000;
  for (int64_t rows : {1, 17, 128}) {
    check_rms_norm(rows, 2048, true, 0, true, seed++);   // x == y
    check_rms_norm(rows, 2048, true, 1, false, seed++);  // V = 1: 2048 vectors, 2 per thread
    check_rms_norm(rows, 2048, false, 2, false, seed++);  // V = 2: 1024 threads
    check_rms_norm(rows, 576, true, 4, true, seed++);     // V = 4, in place
  }
}

TEST(RowNorm, AddRmsNormWidthsAndRows) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 3000;
  for (int64_t dim : kDims)
    for (int64_t rows : kRowCounts) {
      if (rows == 4100 && dim > 2056 && dim != 8192) continue;
      check_add_rms_norm(rows, dim, (seed & 1) != 0, seed);
      seed += 3;
    }
}

TEST(RowNorm, HeadNormsInPlace) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 4000;
  for (int64_t T : kRowCounts) {
    check_head_norm(T, 16, 256, seed++);  // Qwen3.5/3.6 q_norm in the fused q_proj output
    check_head_norm(T, 2, 256, seed++);
    check_head_norm(T, 3, 64, seed++);
    check_head_norm(T, 5, 128, seed++);
  }
}

TEST(RowNorm, GatedRmsNorm) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 5000;
  for (int64_t T : kRowCounts) {
    check_gated(T, 32, 128, 0, seed++);      // Qwen3.6 DeltaNet output norm
    check_gated(T, 32, 128, 24 * 128, seed++);  // z inside the fused projection row
    check_gated(T, 4, 64, 0, seed++);
    check_gated(T, 2, 256, 8, seed++);
    check_gated(T, 1, 1024, 0, seed++);
    check_gated(T, 3, 77, 0, seed++);        // V = 1
    check_gated(T, 5, 96, 3, seed++);        // odd z stride: V = 1
  }
}

/// Sets MOEFOLD_NORM_ROWS_PER_THREAD for its lifetime (read by each launch).
struct RowsPerThread {
  explicit RowsPerThread(int n) { setenv("MOEFOLD_NORM_ROWS_PER_THREAD", std::to_string(n).c_str(), 1); }
  ~RowsPerThread() { unsetenv("MOEFOLD_NORM_ROWS_PER_THREAD"); }
};

// 2 and 4 rows per thread (from 1024 norm rows on; one vector per thread): the same contract.
TEST(RowNorm, RowsPerThreadVariants) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 6000;
  for (int rt : {2, 4}) {
    RowsPerThread env(rt);
    for (int64_t dim : {2048, 576, 64, 6, 1000}) {
      check_rms_norm(4100, dim, true, 0, false, seed++);
      check_rms_norm(1025, dim, false, 0, true, seed++);
      check_add_rms_norm(4100, dim, true, seed++);
      check_add_rms_norm(1030, dim, false, seed++);
    }
    check_head_norm(129, 16, 256, seed++);  // 2064 norm rows
  }
}

TEST(RowNormSmall, SanitizerCases) {
  MOEFOLD_REQUIRE_GPU();
  for (int64_t dim : {13, 64, 576, 2048, 4100, 8191}) {
    check_rms_norm(3, dim, true, 0, false, 70 + uint64_t(dim));
    check_add_rms_norm(3, dim, false, 80 + uint64_t(dim));
  }
  check_rms_norm(2, 2048, true, 1, false, 90);
  check_head_norm(3, 3, 64, 91);
  check_gated(3, 4, 128, 24, 92);
  check_gated(2, 3, 77, 0, 93);
  for (int rt : {2, 4}) {
    RowsPerThread env(rt);
    check_rms_norm(1030, 64, true, 0, false, 94);
    check_add_rms_norm(1030, 576, true, 95);
  }
}
