// The profiler on the GPU: CUDA event timing of every launch of the hybrid fixture's forward, placed on
// one timeline with the host's CPU sampler. Every kernel category the workload exercises appears, the
// per-kernel times plus the measured idle time equal the wall time, launch counts are exact per layer
// and step, and the routed-expert work comes from the plan's real counts. Skips without a GPU.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "core/kernel_registry.h"
#include "cuda/contract.h"
#include "fixture_util.h"
#include "models/cuda/cuda_executor.h"
#include "ops/cuda/device_buffer.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/launch_scope.h"
#include "runtime/kernel_table.h"
#include "runtime/profile_workload.h"

using namespace moefold;
using prof::Category;

namespace {

const std::string kHybrid = (test::kFixtures / "qwen3_5_moe").string();

const prof::KernelTime* find(const prof::WindowProfile& p, const std::string& name) {
  for (const auto& k : p.kernels)
    if (k.name == name) return &k;
  return nullptr;
}
int64_t calls(const prof::WindowProfile& p, const std::string& name) {
  const auto* k = find(p, name);
  return k ? k->calls : 0;
}

std::unique_ptr<ModelRunner> gpu_runner(const WorkloadNeeds& n) {
  CudaExecutorOptions o;
  o.num_blocks = n.num_blocks;
  o.block_size = 16;
  o.num_slots = n.max_seqs;
  o.max_rows = n.max_rows;
  o.max_blocks_per_seq = n.max_blocks_per_seq;
  o.max_logits_rows = n.max_seqs;
  return std::make_unique<ModelRunner>(make_cuda_executor(kHybrid, LoadFormat::Safetensors, 0, o),
                                       RunnerOptions{n.num_blocks, 16, n.max_seqs});
}

/// Checks shared by every window: one timeline, exclusive times + idle = wall, nothing untimed.
void expect_consistent(const prof::WindowProfile& p, const std::string& what) {
  EXPECT_EQ(p.timer, "steady_clock+cuda_events") << what;
  double excl = 0, own = 0;
  for (const auto& k : p.kernels) {
    excl += k.exclusive_s;
    own += k.time_s;
    EXPECT_EQ(k.untimed_calls, 0) << what << " " << k.name;
    EXPECT_LE(k.time_s, p.wall_s) << what << " " << k.name;
  }
  EXPECT_NEAR(excl + p.idle_s, p.wall_s, 1e-9 * p.wall_s + 1e-12) << what;
  EXPECT_NEAR(excl, p.busy_s, 1e-9 * p.wall_s + 1e-12) << what;
  EXPECT_GT(p.idle_s, 0.0) << what;
  // One stream (sampling on the same stream): the intervals barely overlap,
  // so the union is the sum of the calls' own times up to the host/device anchor's few microseconds.
  EXPECT_LE(own, p.busy_s * 1.05 + 50e-6) << what;
  const double share = std::accumulate(p.kernels.begin(), p.kernels.end(), p.idle_share(),
                                       [&](double s, const prof::KernelTime& k) { return s + p.share(k); });
  EXPECT_TRUE(test::contract("profile_shares_sum", what, std::abs(share - 1.0), 1e-6));
}

void expect_categories(const prof::WindowProfile& p, const std::vector<Category>& present, const std::string& what) {
  const auto cats = category_times(p);
  for (Category c : present) {
    EXPECT_GT(cats[size_t(c)].calls, 0) << what << " " << prof::category_name(c);
    EXPECT_GT(cats[size_t(c)].exclusive_s, 0) << what << " " << prof::category_name(c);
  }
}

TEST(ProfilerGpu, HybridPrefillAndDecodeTables) {
  MOEFOLD_REQUIRE_GPU();
  ProfileOptions opt;
  opt.steps = 3;
  opt.warmup = 1;
  const std::vector<Workload> ws = {parse_workload("prefill:40"), parse_workload("decode:2x8")};
  const WorkloadNeeds needs = workload_needs(ws, opt, 16);
  auto runner = gpu_runner(needs);
  prof::set_device_timer(cuda::cuda_event_timer());
  prof::reset_launch_counts();

  const WorkloadResult pre = run_workload(*runner, ws[0], opt);
  std::printf("%s\n", format_kernel_table(pre.profile, Roofline{}, "GPU idle between kernels").c_str());
  expect_consistent(pre.profile, "prefill:40");
  expect_categories(pre.profile,
                    {Category::RoutedExpertGemm, Category::DenseGemm, Category::AttentionPrefill, Category::DeltaNet,
                     Category::Conv, Category::NormRope, Category::MoeRouting, Category::Glue, Category::Sampling,
                     Category::Other},
                    "prefill:40");
  EXPECT_EQ(calls(pre.profile, "attn_fa_kernel"), 2);      // 2 attention layers, one launch each
  EXPECT_EQ(calls(pre.profile, "gdn_prefill_kernel"), 2);  // 2 DeltaNet layers
  // The lm_head, one pass: the batch-invariant decode GEMM (up to 256 rows; cuda_executor.h).
  EXPECT_EQ(calls(pre.profile, "decode_gemm_kernel:f32out"), 1);
  EXPECT_EQ(calls(pre.profile, "argmax_kernel"), 1);       // greedy sampling on the GPU (DeviceSampler)
  EXPECT_EQ(calls(pre.profile, "cpu::sample_token"), 0);   // the host samples nothing

  const WorkloadResult dec = run_workload(*runner, ws[1], opt);
  std::printf("%s\n", format_kernel_table(dec.profile, Roofline{}, "GPU idle between kernels").c_str());
  expect_consistent(dec.profile, "decode:2x8");
  expect_categories(dec.profile,
                    {Category::RoutedExpertGemm, Category::DenseGemm, Category::AttentionDecode, Category::DeltaNet,
                     Category::Conv, Category::NormRope, Category::MoeRouting, Category::Glue, Category::Sampling},
                    "decode:2x8");
  const int64_t steps = 3, layers = 4, linear_layers = 2, attention_layers = 2, batch = 2;
  EXPECT_EQ(calls(dec.profile, "gdn_decode_kernel"), steps * linear_layers);
  EXPECT_EQ(calls(dec.profile, "conv1d_decode_kernel"), steps * linear_layers);
  EXPECT_EQ(calls(dec.profile, "attn_kernel:decode"), steps * attention_layers);
  EXPECT_EQ(calls(dec.profile, "attn_fa_kernel"), 0);
  EXPECT_EQ(calls(dec.profile, "router_topk_plan_kernel"), steps * layers);  // decode: top-k + plan fused
  EXPECT_EQ(calls(dec.profile, "profiler:moe_counts_snapshot"), steps * layers);
  EXPECT_EQ(calls(dec.profile, "argmax_kernel"), steps);  // one launch for the batch's rows per step
  EXPECT_EQ(calls(dec.profile, "cpu::sample_token"), 0);
  // Expert GEMM work from the plan's counts: batch * k pairs per layer, not the capacity's. Batch
  // invariance (the executor's default) runs the 16-row expert tiles, never the small-batch GEMV.
  EXPECT_EQ(calls(dec.profile, "moe_gemv_gate_up_kernel"), 0);
  const auto* gu = find(dec.profile, "moe_gemm_kernel:gate_up:bm16");
  ASSERT_NE(gu, nullptr) << "decode-size capacity must run the 16-row expert tiles";
  EXPECT_EQ(gu->calls, steps * layers);
  const double H = 128, I = 64, k = 4;
  EXPECT_DOUBLE_EQ(gu->work.flops, double(steps * layers) * 2.0 * batch * k * H * 2 * I);
  EXPECT_GT(gu->work.bytes, 0.0);
  EXPECT_LE(gu->work.bytes, double(steps * layers) * (16 * 2 * I * H * 2 + batch * H * 2 + batch * k * I * 2));

  // Launch counts outside windows too: --require-kernel's evidence.
  EXPECT_NO_THROW(prof::require_kernels_ran({"attn_fa_kernel", "attn_kernel:decode", "gdn_decode_kernel"}));
  try {
    prof::require_kernels_ran({"attn_kernel:prefill"});  // the CUDA-core prefill variant never ran
    FAIL() << "a kernel that never ran passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel attn_kernel:prefill never ran (ran: "), std::string::npos) << e.what();
  }
  prof::set_device_timer(nullptr);
}

TEST(ProfilerGpu, SmallOneKernelWindow) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t rows = 17, dim = 256;
  std::vector<float> h(size_t(rows * dim), 0.5f), w(size_t(dim), 1.0f);
  auto x = cuda::to_device_bf16(h), wd = cuda::to_device_bf16(w);
  cuda::DeviceBuffer<__nv_bfloat16> y(size_t(rows * dim));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  prof::set_device_timer(cuda::cuda_event_timer());
  const int64_t before = prof::find_kernel("rms_norm_kernel").launches;
  prof::begin_window();
  cuda::rms_norm(x.data(), wd.data(), y.data(), rows, dim, 1e-6f, cuda::NormKind::Plain, nullptr, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const prof::WindowProfile p = prof::end_window();
  prof::set_device_timer(nullptr);
  cudaStreamDestroy(stream);
  EXPECT_EQ(prof::find_kernel("rms_norm_kernel").launches, before + 1);
  const auto* k = find(p, "rms_norm_kernel");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->calls, 1);
  EXPECT_EQ(k->untimed_calls, 0);
  EXPECT_GT(k->time_s, 0.0);
  EXPECT_DOUBLE_EQ(k->work.bytes, double(rows * dim) * 4 + dim * 2);  // no step: all rows live
  EXPECT_NEAR(k->exclusive_s + p.idle_s, p.wall_s, 1e-12);
}

}  // namespace
