// Contract test of cuda::gated_rms_norm against cpu::gated_rms_norm on bf16-rounded random inputs,
// with a live token count below capacity: padding rows stay poisoned.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda/contract.h"
#include "ops/cpu/norm.h"
#include "ops/cuda/device_buffer.h"
#include "ops/cuda/gated_rms_norm.h"
#include "test_util.h"

using namespace moefold;

void check_gated_rms_norm(std::initializer_list<int64_t> token_counts) {
  for (int64_t tokens : token_counts) {
    const int64_t heads = 4, dim = 128, cap = tokens + 3;
    auto xf = test::randn(cap * heads * dim, 1 + tokens, 2.0f), zf = test::randn(cap * heads * dim, 2 + tokens);
    auto wf = test::randn(dim, 3, 0.3f, 1.0f);
    auto xb = cuda::to_bf16_host(xf), zb = cuda::to_bf16_host(zf), wb = cuda::to_bf16_host(wf);
    xf = cuda::bf16_to_f32_host(xb);
    zf = cuda::bf16_to_f32_host(zb);
    wf = cuda::bf16_to_f32_host(wb);
    auto x = cuda::to_device(xb), z = cuda::to_device(zb), w = cuda::to_device(wb);
    cuda::DeviceBuffer<__nv_bfloat16> y(cap * heads * dim);
    y.fill_bytes(0xFF);
    cuda::DeviceBuffer<int32_t> live(1);
    int32_t n = int32_t(tokens);
    live.upload(&n, 1);
    cuda::gated_rms_norm(x.data(), z.data(), w.data(), y.data(), cap, heads, dim, 1e-6f, live.data(), nullptr);
    auto out = cuda::download_f32(y);
    std::vector<float> ref(tokens * heads * dim);
    cpu::gated_rms_norm(xf.data(), zf.data(), wf.data(), ref.data(), tokens * heads, dim, 1e-6f);
    std::vector<float> live_out(out.begin(), out.begin() + tokens * heads * dim);
    EXPECT_TRUE(test::contract("gated_rms_norm", "tokens=" + std::to_string(tokens) + ",heads=4,dim=128",
                               test::rel_err(live_out, ref), 1e-2));
    auto raw = y.download();
    size_t touched = 0;
    for (size_t i = tokens * heads * dim; i < raw.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, &raw[i], 2);
      touched += bits != 0xFFFF;
    }
    EXPECT_TRUE(test::contract_exact("gated_rms_norm_padding", "tokens=" + std::to_string(tokens), touched));
    // z read in place from a wider row (a fused projection's output): the same bytes.
    const int64_t zs = heads * dim + 24;
    std::vector<__nv_bfloat16> zw(size_t(cap * zs), zb[0]);
    for (int64_t t = 0; t < cap; ++t)
      std::copy_n(zb.begin() + t * heads * dim, heads * dim, zw.begin() + t * zs);
    auto zd = cuda::to_device(zw);
    cuda::DeviceBuffer<__nv_bfloat16> y2(cap * heads * dim);
    y2.fill_bytes(0xFF);
    cuda::gated_rms_norm(x.data(), zd.data(), w.data(), y2.data(), cap, heads, dim, 1e-6f, live.data(), nullptr, zs);
    auto raw2 = y2.download();
    EXPECT_TRUE(test::contract_exact("gated_rms_norm_strided_z_equal", "tokens=" + std::to_string(tokens),
                                     size_t(std::memcmp(raw.data(), raw2.data(), raw.size() * 2) != 0)));
  }
}

TEST(GatedRmsNorm, MatchesCpuAndLeavesPaddingUntouched) {
  MOEFOLD_REQUIRE_GPU();
  check_gated_rms_norm({1, 2, 17, 64, 65, 1000});
}

TEST(GatedRmsNormSmall, SanitizerCase) {
  MOEFOLD_REQUIRE_GPU();
  check_gated_rms_norm({3});
}
