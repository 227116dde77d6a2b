// gated_delta_net_test: the causal conv1d kernels (prefill varlen, decode) against cpu::causal_conv1d_silu.
#include "cuda/gated_delta_net_test/gdn_test_util.h"

#include <optional>

namespace gdn_test {
namespace {

// Causal conv1d, varlen prefill: live sequences `lens` in a launch of capacity lens+3 sequences and
// rows+37 rows, distinct non-identity slots, random initial conv state. Runs the kernel the environment
// selects (MOEFOLD_CONV_PREFILL, MOEFOLD_CONV_TILE_ROWS) and returns its name; y_out / st_out (when given)
// receive the padded run's whole y (padding rows included) and state pool.
std::string conv_prefill_case(int C, const std::vector<int>& lens, uint64_t seed, std::vector<uint16_t>* y_out = nullptr,
                              std::vector<uint16_t>* st_out = nullptr) {
  const int S = int(lens.size()), cap = S + 3, Km1 = kConvK - 1;
  const auto cu = cu_of(lens);
  const int rows = cu[size_t(S)], cap_rows = rows + 37;
  const auto w = round_bf16(moefold::test::randn(size_t(C) * kConvK, seed, 0.5f));
  const auto x = round_bf16(moefold::test::randn(size_t(cap_rows) * C, seed + 1));
  const int nslots = 2 * cap + 1;
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = nslots - 1 - 2 * s;
  const auto st0 = to_bf16(moefold::test::randn(size_t(nslots) * C * Km1, seed + 2));
  const size_t se = size_t(C) * Km1;

  Dev<uint16_t> dx(to_bf16(x)), dw(to_bf16(w)), dy(size_t(cap_rows) * C), dst(st0);
  Dev<int32_t> dcu(cu_padded(lens, cap, cap_rows)), dslots(slots), dns(std::vector<int32_t>{S});
  dy.poison();
  moefold::cuda::causal_conv1d_silu_prefill(dx.bf(), dw.bf(), dcu.p, dslots.p, dns.p, cap_rows, dst.bf(), dy.bf(), C,
                                            kConvK, nullptr);
  const auto y = dy.down();
  const auto st = dst.down();

  std::vector<float> yref(size_t(rows) * C), stref = from_bf16(st0);
  for (int s = 0; s < S; ++s)
    moefold::cpu::causal_conv1d_silu(x.data() + size_t(cu[size_t(s)]) * C, w.data(),
                                     stref.data() + size_t(slots[size_t(s)]) * se,
                                     yref.data() + size_t(cu[size_t(s)]) * C, lens[size_t(s)], C, kConvK);
  const std::string kernel = moefold::cuda::detail::causal_conv1d_prefill_kernel_name(dx.p, dy.p, C, kConvK, 0);
  const std::string shape = "C=" + std::to_string(C) + ",K=4,lens=" + lens_str(lens) + ",cap_rows=" +
                            std::to_string(cap_rows) + ",cap_seqs=" + std::to_string(cap) + ",kernel=" + kernel;
  EXPECT_TRUE(contract("conv1d_prefill.y", shape, rel_err(from_bf16(slice(y, 0, size_t(rows) * C)), yref), kTolBf16));
  // The new state is a copy of bf16 inputs: exact. Slots of padding sequences stay untouched.
  size_t bad_state = 0;
  const auto stref_bf = to_bf16(stref);
  for (int s = 0; s < nslots; ++s) bad_state += byte_mismatches(st, stref_bf, size_t(s) * se, se);
  EXPECT_TRUE(contract_exact("conv1d_prefill.state+padding_slots", shape, bad_state));
  EXPECT_TRUE(contract_exact("conv1d_prefill.padding_rows", shape,
                             unpoisoned(y, size_t(rows) * C, size_t(cap_rows - rows) * C)));
  // Unpadded run (capacity = live) gives the same bytes.
  Dev<uint16_t> dy2(size_t(rows) * C), dst2(st0);
  Dev<int32_t> dcu2(cu), dslots2(slice(slots, 0, size_t(S)));
  dy2.poison();
  moefold::cuda::causal_conv1d_silu_prefill(dx.bf(), dw.bf(), dcu2.p, dslots2.p, dns.p, rows, dst2.bf(), dy2.bf(), C,
                                            kConvK, nullptr);
  const auto y2 = dy2.down();
  const auto st2 = dst2.down();
  EXPECT_TRUE(contract_exact("conv1d_prefill.unpadded_equal", shape,
                             byte_mismatches(y, y2, 0, size_t(rows) * C) + byte_mismatches(st, st2, 0, st.size())));
  // x read in place from a wider row (a fused projection's output): the same bytes.
  const int xs = C + 40;
  std::vector<uint16_t> xw(size_t(cap_rows) * xs, 0xFFFF);
  const auto xb = to_bf16(x);
  for (int r = 0; r < cap_rows; ++r) std::copy_n(xb.begin() + size_t(r) * C, C, xw.begin() + size_t(r) * xs);
  Dev<uint16_t> dxw(xw), dy3(size_t(cap_rows) * C), dst3(st0);
  dy3.poison();
  moefold::cuda::causal_conv1d_silu_prefill(dxw.bf(), dw.bf(), dcu.p, dslots.p, dns.p, cap_rows, dst3.bf(), dy3.bf(),
                                            C, kConvK, nullptr, xs);
  EXPECT_TRUE(contract_exact("conv1d_prefill.strided_x_equal", shape + ",x_stride=" + std::to_string(xs),
                             byte_mismatches(y, dy3.down(), 0, y.size()) + byte_mismatches(st, dst3.down(), 0, st.size())));
  if (y_out) *y_out = y;
  if (st_out) *st_out = st;
  return kernel;
}

// Every prefill kernel on the same inputs: the vectorised one, the row-tile one (the default) at 4, 8 and
// 16 rows per thread, the scalar one. Each runs the whole contract above, and its padded run's y (every
// row, padding included) and state pool must equal the vectorised kernel's bit for bit (same fp32
// arithmetic in the same order). Where C is not a multiple of 8 every setting falls back to the scalar kernel.
void conv_prefill_kernels_case(int C, const std::vector<int>& lens, uint64_t seed) {
  std::vector<uint16_t> y_ref, st_ref;
  std::string ref;
  {
    ScopedEnv e("MOEFOLD_CONV_PREFILL", "vec");
    ref = conv_prefill_case(C, lens, seed, &y_ref, &st_ref);
  }
  EXPECT_EQ(ref, C % 8 == 0 ? "vec" : "scalar");
  struct Variant {
    const char *mode, *rows, *want;
  };
  for (const Variant v : {Variant{"tile", "4", "tile4"}, Variant{"tile", "8", "tile8"}, Variant{"tile", "16", "tile16"},
                          Variant{"scalar", "8", "scalar"}}) {
    ScopedEnv e0("MOEFOLD_CONV_PREFILL", v.mode), e1("MOEFOLD_CONV_TILE_ROWS", v.rows);
    std::vector<uint16_t> y, st;
    const std::string kernel = conv_prefill_case(C, lens, seed, &y, &st);
    EXPECT_EQ(kernel, C % 8 == 0 ? v.want : "scalar");
    const size_t mis = y.size() != y_ref.size() || st.size() != st_ref.size()
                           ? size_t(1) << 40
                           : byte_mismatches(y, y_ref, 0, y.size()) + byte_mismatches(st, st_ref, 0, st.size());
    EXPECT_TRUE(contract_exact("conv1d_prefill.kernel_eq_" + ref, "C=" + std::to_string(C) + ",K=4,lens=" +
                                   lens_str(lens) + ",kernel=" + kernel, mis));
  }
}

// Causal conv1d decode: batch `live` in capacity live+3.
void conv_decode_case(int C, int live, uint64_t seed) {
  const int cap = live + 3, Km1 = kConvK - 1, nslots = 2 * cap + 1;
  const size_t se = size_t(C) * Km1;
  const auto w = round_bf16(moefold::test::randn(size_t(C) * kConvK, seed, 0.5f));
  const auto x = round_bf16(moefold::test::randn(size_t(cap) * C, seed + 1));
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = (s * 2 + 1) % nslots;
  const auto st0 = to_bf16(moefold::test::randn(size_t(nslots) * se, seed + 2));
  Dev<uint16_t> dx(to_bf16(x)), dw(to_bf16(w)), dy(size_t(cap) * C), dst(st0);
  Dev<int32_t> dslots(slots), dns(std::vector<int32_t>{live});
  dy.poison();
  moefold::cuda::causal_conv1d_silu_decode(dx.bf(), dw.bf(), dslots.p, dns.p, cap, dst.bf(), dy.bf(), C, kConvK,
                                           nullptr);
  const auto y = dy.down();
  const auto st = dst.down();
  std::vector<float> yref(size_t(live) * C), stref = from_bf16(st0);
  for (int s = 0; s < live; ++s)
    moefold::cpu::causal_conv1d_silu(x.data() + size_t(s) * C, w.data(), stref.data() + size_t(slots[size_t(s)]) * se,
                                     yref.data() + size_t(s) * C, 1, C, kConvK);
  const std::string shape = "C=" + std::to_string(C) + ",K=4,batch=" + std::to_string(live) + ",cap=" +
                            std::to_string(cap);
  EXPECT_TRUE(contract("conv1d_decode.y", shape, rel_err(from_bf16(slice(y, 0, size_t(live) * C)), yref), kTolBf16));
  EXPECT_TRUE(contract_exact("conv1d_decode.state+padding_slots", shape, byte_mismatches(st, to_bf16(stref), 0, st.size())));
  EXPECT_TRUE(contract_exact("conv1d_decode.padding_rows", shape, unpoisoned(y, size_t(live) * C, size_t(cap - live) * C)));
  Dev<uint16_t> dy2(size_t(live) * C), dst2(st0);
  dy2.poison();
  moefold::cuda::causal_conv1d_silu_decode(dx.bf(), dw.bf(), dslots.p, dns.p, live, dst2.bf(), dy2.bf(), C, kConvK,
                                           nullptr);
  EXPECT_TRUE(contract_exact("conv1d_decode.unpadded_equal", shape,
                             byte_mismatches(y, dy2.down(), 0, size_t(live) * C) +
                                 byte_mismatches(st, dst2.down(), 0, st.size())));
  // x read in place from a wider row (a fused projection's output): the same bytes.
  const int xs = C + 40;
  std::vector<uint16_t> xw(size_t(cap) * xs, 0xFFFF);
  const auto xb = to_bf16(x);
  for (int r = 0; r < cap; ++r) std::copy_n(xb.begin() + size_t(r) * C, C, xw.begin() + size_t(r) * xs);
  Dev<uint16_t> dxw(xw), dy3(size_t(cap) * C), dst3(st0);
  dy3.poison();
  moefold::cuda::causal_conv1d_silu_decode(dxw.bf(), dw.bf(), dslots.p, dns.p, cap, dst3.bf(), dy3.bf(), C, kConvK,
                                           nullptr, xs);
  EXPECT_TRUE(contract_exact("conv1d_decode.strided_x_equal", shape + ",x_stride=" + std::to_string(xs),
                             byte_mismatches(y, dy3.down(), 0, y.size()) + byte_mismatches(st, dst3.down(), 0, st.size())));
}

}  // namespace
}  // namespace gdn_test

using namespace gdn_test;  // NOLINT(google-build-using-namespace): the helpers above

TEST(GdnConv, PrefillSmall) {
  MOEFOLD_REQUIRE_GPU();
  conv_prefill_case(int(conv_dim(kSmall)), {1, 0, 2, 3, 17, 64, 65, 130}, 101);
}

TEST(GdnConv, Prefill) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<int> lens = kLens;
  lens.insert(lens.begin() + 2, {0, 3});
  conv_prefill_case(int(conv_dim(kSmall)), lens, 111);
  conv_prefill_case(int(conv_dim(kReal)), lens, 121);
}

// C not a multiple of 8: the scalar prefill kernel (the others take the vectorised one).
TEST(GdnConv, PrefillScalarSmall) {
  MOEFOLD_REQUIRE_GPU();
  conv_prefill_case(100, {1, 0, 2, 3, 17, 64, 65, 130}, 131);
}

// The prefill kernels against each other (and the CPU): sequences of 0 .. 130 rows that start and end at
// every offset of the 4 / 8 / 16-row tiles, many in one tile, 0- and 1-token ones, initial states.
TEST(GdnConv, PrefillKernelsSmall) {
  MOEFOLD_REQUIRE_GPU();
  conv_prefill_kernels_case(int(conv_dim(kSmall)), {1, 0, 2, 3, 17, 64, 65, 130}, 161);
  conv_prefill_kernels_case(int(conv_dim(kSmall)), {5, 1, 0, 2, 9, 8, 16, 33, 7, 3, 4, 1, 1, 0, 15, 31}, 163);
  conv_prefill_kernels_case(100, {1, 0, 2, 3, 17, 64}, 165);  // C % 8 != 0: the scalar kernel for all
}

// The 35B shape (C = 8192) at the lengths (1 .. 4100 rows, with 0 and 3 inside the batch).
TEST(GdnConv, PrefillKernels) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<int> lens = kLens;
  lens.insert(lens.begin() + 2, {0, 3});
  conv_prefill_kernels_case(int(conv_dim(kReal)), lens, 171);
}

// Which prefill kernel runs (host-side choice: no GPU needed): the row-tile one by default where K = 4,
// C and x_stride are multiples of 8 and x, y 16-byte aligned (MOEFOLD_CONV_TILE_ROWS 4 / 8 / 16, anything
// else 8); MOEFOLD_CONV_PREFILL=vec the vectorised one under the same conditions; =scalar the scalar one.
TEST(GdnConv, PrefillKernelSelection) {
  alignas(16) static uint16_t buf[64];
  const void *al = buf, *un = buf + 1;
  const auto name = [](const void* x, const void* y, int C, int K, int64_t xs) {
    return std::string(moefold::cuda::detail::causal_conv1d_prefill_kernel_name(x, y, C, K, xs));
  };
  // The switches as found (restored at the end, so that a run of the binary under them keeps them).
  std::vector<std::pair<const char*, std::optional<std::string>>> saved;
  for (const char* n : {"MOEFOLD_CONV_PREFILL", "MOEFOLD_CONV_TILE_ROWS"}) {
    const char* v = std::getenv(n);
    saved.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
    unsetenv(n);
  }
  EXPECT_EQ(name(al, al, 256, 4, 0), "tile8");
  EXPECT_EQ(name(al, al, 256, 4, 12352), "tile8");
  EXPECT_EQ(name(al, al, 100, 4, 0), "scalar");
  EXPECT_EQ(name(al, al, 256, 3, 0), "scalar");
  EXPECT_EQ(name(al, al, 256, 4, 260), "scalar");
  EXPECT_EQ(name(un, al, 256, 4, 0), "scalar");
  EXPECT_EQ(name(al, un, 256, 4, 0), "scalar");
  {
    ScopedEnv e("MOEFOLD_CONV_PREFILL", "tile");
    EXPECT_EQ(name(al, al, 256, 4, 0), "tile8");
    EXPECT_EQ(name(al, al, 100, 4, 0), "scalar");
    EXPECT_EQ(name(un, al, 256, 4, 0), "scalar");
    for (auto [rows, want] : {std::pair{"4", "tile4"}, std::pair{"8", "tile8"}, std::pair{"16", "tile16"},
                              std::pair{"5", "tile8"}}) {
      ScopedEnv r("MOEFOLD_CONV_TILE_ROWS", rows);
      EXPECT_EQ(name(al, al, 8192, 4, 12352), want);
    }
  }
  {
    ScopedEnv e("MOEFOLD_CONV_PREFILL", "vec");
    EXPECT_EQ(name(al, al, 256, 4, 0), "vec");
    EXPECT_EQ(name(al, al, 100, 4, 0), "scalar");
  }
  {
    ScopedEnv e("MOEFOLD_CONV_PREFILL", "scalar");
    EXPECT_EQ(name(al, al, 256, 4, 0), "scalar");
  }
  for (const auto& [n, v] : saved)
    if (v) setenv(n, v->c_str(), 1);
}

TEST(GdnConv, DecodeSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (int b : {1, 17}) conv_decode_case(int(conv_dim(kSmall)), b, 131 + uint64_t(b));
}

TEST(GdnConv, Decode) {
  MOEFOLD_REQUIRE_GPU();
  for (int b : {1, 17, 64}) {
    conv_decode_case(int(conv_dim(kSmall)), b, 141 + uint64_t(b));
    conv_decode_case(int(conv_dim(kReal)), b, 151 + uint64_t(b));
  }
}
