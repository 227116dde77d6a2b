// Contract tests of grammar-constrained sampling on the GPU against the CPU definition
// (runtime/sampler.h apply_token_bitmask): apply_token_bitmask_rows must produce the same bytes as
// the CPU step on every live constrained row and leave unconstrained and padding rows untouched; the
// whole DeviceSampler with RowSampling::token_bitmask (and a mask_ready hook) must return the tokens
// the CPU Sampler returns on the bitmask-masked rows (0 mismatches), never a disallowed token, and
// fail only the constrained rows when mask_ready throws. The perf test times the kernel and the
// DeviceSampler call with bitmasks at batch 1 and 64 for the 35B vocabulary (V = 248,320).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "models/cuda/device_sampler.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/sampling.h"
#include "runtime/sampler.h"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

void sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

std::vector<float> make_logits(int64_t R, int64_t V, uint64_t seed) {
  auto v = randn(size_t(R * V), seed, 2.0f);
  for (float& x : v) x = std::round(x * 16.0f) / 16.0f;
  return v;
}

/// A bitmask allowing about one id in `keep` (at least one id), words beyond V random garbage bits.
std::vector<uint32_t> make_bitmask(int64_t V, uint64_t seed, uint64_t keep) {
  const int64_t W = bitmask_words(V);
  std::vector<uint32_t> m(size_t(W), 0u);
  for (int64_t t = 0; t < V; ++t)
    if (mix64(seed * 0x9E37ull + uint64_t(t)) % keep == 0) m[size_t(t / 32)] |= 1u << (t % 32);
  m[size_t((V - 1) / 32)] |= 1u << ((V - 1) % 32);
  if (V % 32) m[size_t(W - 1)] |= ~0u << (V % 32);  // bits past V: must be ignored
  return m;
}

void check_kernel(int64_t R, int64_t V, int64_t live, uint64_t seed) {
  const auto x = make_logits(R, V, seed);
  const int64_t W = bitmask_words(V);
  std::vector<int32_t> mask_row(size_t(R), -1);
  std::vector<uint32_t> masks;
  for (int64_t r = 0; r < R; ++r) {
    if (r % 3 == 1) continue;  // unconstrained rows
    mask_row[size_t(r)] = int32_t(masks.size() / size_t(W));
    const auto m = make_bitmask(V, seed + uint64_t(r), r % 2 ? 7 : 2);
    masks.insert(masks.end(), m.begin(), m.end());
  }
  auto dx = cuda::to_device(x);
  auto dm = cuda::to_device(masks.empty() ? std::vector<uint32_t>{0u} : masks);
  auto dr = cuda::to_device(mask_row);
  auto dl = cuda::to_device(std::vector<int32_t>{int32_t(live)});
  cu::apply_token_bitmask_rows(dx.data(), R, V, 0, dm.data(), dr.data(), dl.data(), nullptr);
  sync();
  const auto got = dx.download();
  size_t bad = 0;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> want(x.begin() + r * V, x.begin() + (r + 1) * V);
    if (r < live && mask_row[size_t(r)] >= 0)
      apply_token_bitmask(want, std::span<const uint32_t>(masks.data() + size_t(mask_row[size_t(r)]) * W, size_t(W)));
    bad += std::memcmp(got.data() + r * V, want.data(), size_t(V) * sizeof(float)) != 0;
  }
  EXPECT_TRUE(contract_exact("token_bitmask", fmt::format("rows={},live={},V={}", R, live, V), bad));
}

}  // namespace

TEST(TokenBitmask, KernelMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  check_kernel(1, 5, 1, 1);
  check_kernel(4, 33, 4, 2);
  check_kernel(7, 1000, 5, 3);        // padding rows stay untouched
  check_kernel(16, 248320, 16, 4);    // the 35B vocabulary
  check_kernel(3, 151936 + 7, 3, 5);  // V not a multiple of 32
}

// The whole DeviceSampler: tokens equal the CPU sampler's on the bitmask-masked rows, for greedy and
// sampled rows with penalties and logprobs, mixed with unconstrained rows; mask_ready is called.
TEST(TokenBitmask, DeviceSamplerMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  for (int64_t V : {int64_t(50), int64_t(4099), int64_t(248320)}) {
    const int64_t R = 12, W = bitmask_words(V);
    const auto x = make_logits(R, V, 77 + uint64_t(V));
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(R));
    std::vector<SamplingParams> params(static_cast<size_t>(R));
    const std::vector<int32_t> prompt = {1, 2, 3, int32_t(V - 1)}, output = {4, 5, 4};
    for (int64_t r = 0; r < R; ++r) {
      SamplingParams& p = params[size_t(r)];
      p.temperature = r % 2 ? 0.8f : 0.0f;
      p.top_k = r % 4 == 1 ? 20 : 0;
      p.top_p = r % 4 == 3 ? 0.9f : 1.0f;
      p.seed = int64_t(r);
      if (r % 5 == 0) p.repetition_penalty = 1.3f, p.presence_penalty = 0.5f;
      if (r % 3 == 0) p.logprobs = true, p.top_logprobs = 3;
      if (r % 4 != 2) masks[size_t(r)] = make_bitmask(V, 1000 + uint64_t(r), r % 2 ? 3 : 50);
    }
    std::vector<Sampler> samplers;
    for (const auto& p : params) samplers.emplace_back(p);
    int ready_calls = 0;
    const std::function<void()> ready = [&] { ++ready_calls; };
    std::vector<RowSampling> rows(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      rows[size_t(r)].sampler = &samplers[size_t(r)];
      rows[size_t(r)].prompt = prompt;
      rows[size_t(r)].output = output;
      if (!masks[size_t(r)].empty()) {
        rows[size_t(r)].token_bitmask = masks[size_t(r)];
        rows[size_t(r)].mask_ready = &ready;
      }
    }
    const std::vector<int32_t> masked = {0};
    auto dx = cuda::to_device(x);
    DeviceSampler ds(R, V);
    std::vector<SampleResult> got;
    ds.sample(dx.data(), rows, masked, got, nullptr);
    EXPECT_GE(ready_calls, 1);
    size_t bad = 0, disallowed = 0;
    for (int64_t r = 0; r < R; ++r) {
      std::vector<float> row(x.begin() + r * V, x.begin() + (r + 1) * V);
      mask_tokens(row, masked);
      if (!masks[size_t(r)].empty()) apply_token_bitmask(row, masks[size_t(r)]);
      const SampleResult want = samplers[size_t(r)].sample(row, prompt, output);
      ASSERT_TRUE(got[size_t(r)].error.empty()) << got[size_t(r)].error;
      bad += got[size_t(r)].token != want.token;
      if (!masks[size_t(r)].empty())
        disallowed += !bitmask_allows(std::span<const uint32_t>(masks[size_t(r)].data(), size_t(W)), got[size_t(r)].token);
    }
    EXPECT_EQ(disallowed, 0u) << "V=" << V;
    EXPECT_TRUE(contract_exact("device_sampler_bitmask", fmt::format("rows={},V={}", R, V), bad));
  }
}

TEST(TokenBitmask, FailedMaskFailsOnlyConstrainedRows) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t R = 3, V = 100;
  const auto x = make_logits(R, V, 5);
  SamplingParams p;
  p.temperature = 0;
  const Sampler s(p);
  const auto m = make_bitmask(V, 9, 4);
  const std::function<void()> ready = [] { throw Error("matcher exploded"); };
  std::vector<RowSampling> rows(static_cast<size_t>(R));
  for (auto& r : rows) r.sampler = &s;
  rows[1].token_bitmask = m;
  rows[1].mask_ready = &ready;
  auto dx = cuda::to_device(x);
  DeviceSampler ds(R, V);
  std::vector<SampleResult> got;
  ds.sample(dx.data(), rows, {}, got, nullptr);
  EXPECT_TRUE(got[0].error.empty());
  EXPECT_TRUE(got[2].error.empty());
  EXPECT_NE(got[1].error.find("matcher exploded"), std::string::npos) << got[1].error;
  EXPECT_EQ(got[1].token, -1);
}

// Cost of the masked-logits step on the GPU and of the DeviceSampler call with bitmasks (uploads of
// the masks included), batch 1 and 64, V = 248,320.
TEST(TokenBitmaskPerf, DISABLED_Timing) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t V = 248320, W = bitmask_words(V);
  for (int64_t R : {1, 64}) {
    auto dx = cuda::to_device(make_logits(R, V, 31));
    std::vector<uint32_t> masks;
    std::vector<int32_t> mask_row(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      const auto m = make_bitmask(V, uint64_t(r), 4);
      masks.insert(masks.end(), m.begin(), m.end());
      mask_row[size_t(r)] = int32_t(r);
    }
    auto dm = cuda::to_device(masks);
    auto dr = cuda::to_device(mask_row);
    double us = time_us([&] { cu::apply_token_bitmask_rows(dx.data(), R, V, 0, dm.data(), dr.data(), nullptr, nullptr); });
    perf_line("token_bitmask", fmt::format("rows={},V={}", R, V), us, "-");
    SamplingParams greedy;
    greedy.temperature = 0;
    const Sampler s(greedy);
    std::vector<RowSampling> plain(static_cast<size_t>(R)), masked(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      plain[size_t(r)].sampler = masked[size_t(r)].sampler = &s;
      masked[size_t(r)].token_bitmask = std::span<const uint32_t>(masks.data() + size_t(r * W), size_t(W));
    }
    DeviceSampler ds(R, V);
    std::vector<SampleResult> out;
    us = time_us([&] { ds.sample(dx.data(), plain, {}, out, nullptr); });
    perf_line("device_sampler", fmt::format("rows={},V={},greedy", R, V), us, "-");
    us = time_us([&] { ds.sample(dx.data(), masked, {}, out, nullptr); });
    perf_line("device_sampler", fmt::format("rows={},V={},greedy+bitmask", R, V), us, "-");
  }
}
