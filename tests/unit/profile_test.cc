// `moefold profile` on the CPU backend: the kernel table of the hybrid fixture (Gated DeltaNet + gated
// attention + MoE) has every category the workload exercises, shares that sum to 100%, and exact call
// counts per layer and step; --require-kernel passes for a kernel that ran and fails for one that did
// not, on `generate` and on `profile`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/load_model.h"
#include "runtime/kernel_table.h"
#include "runtime/profile_workload.h"
#include "fixture_util.h"

using namespace moefold;
using prof::Category;
using json = nlohmann::json;

namespace {

const std::string kHybrid = (test::kFixtures / "qwen3_5_moe").string();

int64_t calls(const prof::WindowProfile& p, const std::string& name) {
  for (const auto& k : p.kernels)
    if (k.name == name) return k.calls;
  return 0;
}

Roofline roofline(double copy, double gemm) {
  Roofline r;
  r.copy_bytes_per_s = copy;
  r.gemm_flops_per_s = gemm;
  return r;
}

double shares_sum(const prof::WindowProfile& p) {
  double s = p.idle_share();
  for (const CategoryTime& c : category_times(p)) s += c.exclusive_s / p.wall_s;
  return s;
}

struct Profiled {
  std::unique_ptr<Model> model;
  std::unique_ptr<ModelRunner> runner;
  ProfileOptions opt;
};

Profiled make(const std::vector<Workload>& ws, ProfileOptions opt) {
  Profiled p;
  p.opt = opt;
  const WorkloadNeeds n = workload_needs(ws, opt, 16);
  p.model = load_model(kHybrid, LoadFormat::Safetensors);
  p.runner = std::make_unique<ModelRunner>(*p.model, RunnerOptions{n.num_blocks, 16, n.max_seqs});
  return p;
}

void expect_categories(const prof::WindowProfile& p, const std::vector<Category>& present,
                       const std::vector<Category>& absent) {
  const auto cats = category_times(p);
  for (Category c : present) {
    EXPECT_GT(cats[size_t(c)].calls, 0) << prof::category_name(c);
    EXPECT_GT(cats[size_t(c)].exclusive_s, 0) << prof::category_name(c);
  }
  for (Category c : absent) EXPECT_EQ(cats[size_t(c)].calls, 0) << prof::category_name(c);
}

TEST(Profile, ParsesWorkloads) {
  const Workload d = parse_workload("decode:64x512");
  EXPECT_EQ(d.kind, Workload::Kind::Decode);
  EXPECT_EQ(d.batch, 64);
  EXPECT_EQ(d.prompt, 512);
  const Workload m = parse_workload("mixed:16x8192x1024");
  EXPECT_EQ(m.kind, Workload::Kind::Mixed);
  EXPECT_EQ(m.output, 1024);
  EXPECT_EQ(parse_workload("prefill:32768").prompt, 32768);
  for (const char* bad : {"prefill", "prefill:", "prefill:0", "prefill:12x3", "decode:4", "decode:4x", "mixed:1x2",
                          "serve:1", "decode:-1x5", "prefill:1e3"})
    EXPECT_THROW(parse_workload(bad), Error) << bad;
}

TEST(Profile, CpuPrefillTableHasEveryPrefillCategoryAndSharesSumTo100) {
  const std::vector<Workload> ws = {parse_workload("prefill:40")};
  Profiled p = make(ws, {});
  const WorkloadResult r = run_workload(*p.runner, ws[0], p.opt);
  const prof::WindowProfile& w = r.profile;
  EXPECT_NEAR(shares_sum(w), 1.0, 1e-4);
  EXPECT_GT(w.idle_s, 0.0);  // the host work between ops is measured, not assumed away
  EXPECT_LT(w.idle_s, w.wall_s);
  expect_categories(w,
                    {Category::RoutedExpertGemm, Category::DenseGemm, Category::AttentionPrefill, Category::DeltaNet,
                     Category::Conv, Category::NormRope, Category::MoeRouting, Category::Glue, Category::Sampling,
                     Category::Other},
                    {Category::AttentionDecode});
  // One step over 4 layers (2 DeltaNet, 2 attention, all MoE), one sequence, one sampled token.
  EXPECT_EQ(calls(w, "cpu::gated_delta_rule_chunked"), 2);
  EXPECT_EQ(calls(w, "cpu::gated_delta_rule_recurrent"), 0);
  EXPECT_EQ(calls(w, "cpu::paged_attention:prefill"), 2);
  EXPECT_EQ(calls(w, "cpu::moe_experts"), 4);
  EXPECT_EQ(calls(w, "cpu::linear:lm_head"), 1);
  EXPECT_EQ(calls(w, "cpu::sample_token"), 1);
  // rms_norm: 2 per layer, q and k norm per attention layer, the final norm of the one logits row.
  EXPECT_EQ(calls(w, "cpu::rms_norm"), 2 * 4 + 2 * 2 + 1);
  EXPECT_EQ(r.tokens, 40);
  EXPECT_GT(r.unprofiled_wall_s, 0.0);
}

TEST(Profile, CpuDecodeCallsPerLayerAndStep) {
  ProfileOptions opt;
  opt.steps = 3;
  opt.warmup = 1;
  const std::vector<Workload> ws = {parse_workload("decode:3x9")};
  Profiled p = make(ws, opt);
  const WorkloadResult r = run_workload(*p.runner, ws[0], opt);
  const prof::WindowProfile& w = r.profile;
  EXPECT_NEAR(shares_sum(w), 1.0, 1e-4);
  expect_categories(w,
                    {Category::RoutedExpertGemm, Category::DenseGemm, Category::AttentionDecode, Category::DeltaNet,
                     Category::Conv, Category::NormRope, Category::MoeRouting, Category::Sampling},
                    {Category::AttentionPrefill});
  const int64_t steps = 3, batch = 3, linear_layers = 2, attention_layers = 2, layers = 4;
  // Per sequence per layer: the CPU reference loops over sequences for conv, the delta rule, attention.
  EXPECT_EQ(calls(w, "cpu::gated_delta_rule_recurrent"), steps * linear_layers * batch);
  EXPECT_EQ(calls(w, "cpu::causal_conv1d_silu"), steps * linear_layers * batch);
  EXPECT_EQ(calls(w, "cpu::paged_attention:decode"), steps * attention_layers * batch);
  EXPECT_EQ(calls(w, "cpu::kv_cache_write"), steps * attention_layers * batch);
  // Per layer per step, all rows at once.
  EXPECT_EQ(calls(w, "cpu::moe_experts"), steps * layers);
  EXPECT_EQ(calls(w, "cpu::router_topk"), steps * layers);
  EXPECT_EQ(calls(w, "cpu::sample_token"), steps * batch);
  EXPECT_EQ(r.tokens, steps * batch);
  EXPECT_EQ(r.steps, 3);
  // The routed experts' work comes from the experts the step touched.
  for (const auto& k : w.kernels)
    if (k.name == "cpu::moe_experts") {
      EXPECT_GT(k.work.bytes, 0.0);
      EXPECT_DOUBLE_EQ(k.work.flops, double(steps) * layers * 2.0 * batch * 4 * 3 * 128 * 64);
    }
  // The table's JSON says the same.
  const json j = kernel_table_json(w, roofline(1e10, 1e11));
  double s = j["idle"]["share"].get<double>();
  for (const auto& c : j["categories"]) s += c["share"].get<double>();
  EXPECT_NEAR(s, 1.0, 1e-4);
  EXPECT_FALSE(format_kernel_table(w, roofline(1e10, 1e11), "idle").empty());
}

TEST(Profile, CpuMixedRunsThroughTheSchedulerWithPrefillAndDecode) {
  ProfileOptions opt;
  opt.max_batched_tokens = 16;  // forces chunked prefill of the 20-token prompts
  const std::vector<Workload> ws = {parse_workload("mixed:3x20x4")};
  Profiled p = make(ws, opt);
  const WorkloadResult r = run_workload(*p.runner, ws[0], opt);
  EXPECT_NEAR(shares_sum(r.profile), 1.0, 1e-4);
  expect_categories(r.profile, {Category::AttentionPrefill, Category::AttentionDecode, Category::Sampling}, {});
  EXPECT_EQ(calls(r.profile, "cpu::sample_token"), 3 * 4);  // every output token sampled once
  EXPECT_EQ(r.tokens, 3 * (20 + 4 - 1));                     // prompts + fed-back outputs (not the last)
  EXPECT_GT(r.steps, 4);
  EXPECT_EQ(p.runner->free_slots(), p.runner->options().max_seqs);  // every request released its slot
}

// ---- the command line ------------------------------------------------------------------------------

// stderr goes to a file unique to this test (CTest runs the tests of this binary in parallel processes).
int run(const std::string& args, std::string* err) {
  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("moefold_profile_test_err_" + name + "_" + std::to_string(::getpid())))
          .string();
  const std::string cmd = std::string(MOEFOLD_BINARY) + " " + args + " >/dev/null 2>" + path;
  const int rc = std::system(cmd.c_str());
  std::ifstream f(path);
  err->assign(std::istreambuf_iterator<char>(f), {});
  std::filesystem::remove(path);
  return rc;
}

TEST(RequireKernel, GeneratePassesForAKernelThatRanAndFailsForOneThatDidNot) {
  std::string err;
  const std::string gen = "generate --model " + kHybrid + " --prompt-ids 1,2,3 --ignore-eos ";
  // Three tokens: a prefill step and two decode steps.
  EXPECT_EQ(run(gen + "--max-tokens 3 --require-kernel cpu::paged_attention:decode --require-kernel cpu::moe_experts",
                &err),
            0)
      << err;
  // One token: the prefill step only, so decode attention never ran.
  EXPECT_NE(run(gen + "--max-tokens 1 --require-kernel cpu::paged_attention:decode", &err), 0);
  EXPECT_NE(err.find("error: kernel cpu::paged_attention:decode never ran (ran: "), std::string::npos) << err;
  EXPECT_NE(err.find("cpu::paged_attention:prefill"), std::string::npos) << err;
  // An unknown name fails at once, listing the known ones.
  EXPECT_NE(run(gen + "--max-tokens 1 --require-kernel no_such_kernel", &err), 0);
  EXPECT_NE(err.find("unknown kernel 'no_such_kernel' (known: "), std::string::npos) << err;
  EXPECT_NE(err.find("cpu::gated_delta_rule_chunked"), std::string::npos) << err;
}

TEST(RequireKernel, ProfileWritesJsonAndChecksKernels) {
  std::string err;
  const std::string out = (std::filesystem::temp_directory_path() / ("moefold_profile_test_" + std::to_string(::getpid()) + ".json")).string();
  std::filesystem::remove(out);
  const std::string prof = "profile --model " + kHybrid + " --roofline-gemm-size 128 --workload prefill:12 ";
  EXPECT_EQ(run(prof + "--workload decode:2x5 --steps 2 --json " + out +
                    " --require-kernel cpu::gated_delta_rule_chunked --require-kernel cpu::gated_delta_rule_recurrent",
                &err),
            0)
      << err;
  std::ifstream f(out);
  ASSERT_TRUE(f.good());
  const json j = json::parse(f);
  ASSERT_EQ(j["workloads"].size(), 2u);
  EXPECT_EQ(j["workloads"][0]["workload"], "prefill:12");
  EXPECT_GT(j["roofline"]["copy_bytes_per_s"].get<double>(), 0.0);
  for (const auto& w : j["workloads"]) {
    double s = w["idle"]["share"].get<double>();
    for (const auto& k : w["kernels"]) s += k["share"].get<double>();
    EXPECT_NEAR(s, 1.0, 1e-4) << w["workload"];
  }
  // A prefill-only profile never takes the recurrent (one-token) DeltaNet step.
  EXPECT_NE(run(prof + "--require-kernel cpu::gated_delta_rule_recurrent", &err), 0);
  EXPECT_NE(err.find("kernel cpu::gated_delta_rule_recurrent never ran"), std::string::npos) << err;
  EXPECT_NE(run(prof + "--workload decode:2", &err), 0);
  EXPECT_NE(err.find("expected prefill:N, decode:BxC or mixed:BxPxD"), std::string::npos) << err;
}

}  // namespace
