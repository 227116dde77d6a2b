// Exposed time per kernel from kernel records (core/kernel_timeline.h): hand-built timelines whose
// answers are known, including PDL-style overlap, idle gaps, kernels outside every step, and names.
#include "core/kernel_timeline.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

using namespace moefold;
using prof::KernelRecord;
using prof::StepWindow;

namespace {

KernelRecord rec(const std::string& name, int64_t start, int64_t end, int grid = 1) {
  KernelRecord r;
  r.name = name;
  r.start_ns = start;
  r.end_ns = end;
  r.grid = {grid, 1, 1};
  r.in_graph = true;
  return r;
}

const prof::TimelineRow& row(const prof::TimelineSummary& s, const std::string& name, int grid = 1) {
  for (const auto& r : s.rows)
    if (r.name == name && r.grid[0] == grid) return r;
  throw std::runtime_error("no row " + name);
}

}  // namespace

TEST(KernelTimeline, SerialKernelsWithGaps) {
  // One step [0, 10000): a 1000..3000, gap, b 4000..5000, c 5000..8000; host until 10000.
  std::vector<KernelRecord> r = {rec("a", 1000, 3000), rec("b", 4000, 5000), rec("c", 5000, 8000)};
  std::vector<StepWindow> w = {{0, 10000}};
  auto s = prof::summarize_timeline(r, w);
  ASSERT_EQ(s.steps, 1);
  EXPECT_DOUBLE_EQ(s.wall_us, 10.0);
  EXPECT_DOUBLE_EQ(s.span_us, 7.0);
  EXPECT_DOUBLE_EQ(s.gap_us, 1.0);
  EXPECT_DOUBLE_EQ(s.host_us, 3.0);
  EXPECT_DOUBLE_EQ(s.kernels, 3.0);
  EXPECT_DOUBLE_EQ(row(s, "a").exposed_us_per_step, 2.0);
  EXPECT_DOUBLE_EQ(row(s, "b").exposed_us_per_step, 1.0);
  EXPECT_DOUBLE_EQ(row(s, "c").exposed_us_per_step, 3.0);
  EXPECT_EQ(s.rows.front().name, "c");  // largest exposed first
  EXPECT_DOUBLE_EQ(row(s, "c").exposed_share, 0.3);
}

TEST(KernelTimeline, EarlyLaunchedKernelIsChargedOnlyPastItsPredecessor) {
  // PDL: b starts at 1500 while a runs until 5000, waits, ends at 6000: b is 4.5 us long, exposed 1 us.
  // c starts under b and ends before it (never happens on one stream, but must not count negative).
  std::vector<KernelRecord> r = {rec("a", 1000, 5000), rec("b", 1500, 6000), rec("c", 2000, 5500)};
  std::vector<StepWindow> w = {{0, 7000}};
  auto s = prof::summarize_timeline(r, w);
  EXPECT_DOUBLE_EQ(row(s, "a").exposed_us_per_step, 4.0);
  EXPECT_DOUBLE_EQ(row(s, "b").exposed_us_per_step, 1.0);
  EXPECT_DOUBLE_EQ(row(s, "c").exposed_us_per_step, 0.0);
  EXPECT_DOUBLE_EQ(row(s, "b").mean_duration_us, 4.5);
  EXPECT_DOUBLE_EQ(s.gap_us, 0.0);
  double exposed = 0;
  for (const auto& x : s.rows) exposed += x.exposed_us_per_step;
  EXPECT_DOUBLE_EQ(exposed + s.gap_us, s.span_us);  // the identity the table rests on
}

TEST(KernelTimeline, StepsAveragedAndKernelsKeyedByGrid) {
  // Two steps; g runs with two grids (two GEMM shapes). A record before the first window and one
  // between windows are ignored; windows given out of order.
  std::vector<KernelRecord> r = {rec("x", -500, -100),        rec("g", 100, 300, 8),  rec("g", 300, 700, 16),
                                 rec("between", 1100, 1150), rec("g", 2100, 2300, 8), rec("g", 2300, 2900, 16)};
  std::vector<StepWindow> w = {{2000, 3000}, {0, 1000}};
  auto s = prof::summarize_timeline(r, w);
  ASSERT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.kernels, 2.0);
  EXPECT_DOUBLE_EQ(row(s, "g", 8).calls_per_step, 1.0);
  EXPECT_DOUBLE_EQ(row(s, "g", 8).exposed_us_per_step, 0.2);
  EXPECT_DOUBLE_EQ(row(s, "g", 16).exposed_us_per_step, 0.5);
  EXPECT_DOUBLE_EQ(row(s, "g", 16).mean_duration_us, 0.5);
  EXPECT_DOUBLE_EQ(s.span_us, 0.7);
  EXPECT_EQ(s.rows.size(), 2u);
  auto j = prof::timeline_to_json(s);
  EXPECT_EQ(j["kernels"].size(), 2u);
  EXPECT_EQ(j["steps"], 2);
  const std::string table = prof::format_timeline(s, 1);
  EXPECT_NE(table.find("(the other kernels)"), std::string::npos);
  EXPECT_NE(table.find("16"), std::string::npos);
}

TEST(KernelTimeline, EmptyAndBadWindows) {
  std::vector<KernelRecord> r = {rec("a", 10, 20)};
  std::vector<StepWindow> none;
  EXPECT_EQ(prof::summarize_timeline(r, none).steps, 0);
  std::vector<StepWindow> empty = {{100, 200}};
  EXPECT_EQ(prof::summarize_timeline(r, empty).steps, 0);
  EXPECT_NE(prof::format_timeline(prof::summarize_timeline(r, empty)).find("no kernel"), std::string::npos);
  std::vector<StepWindow> overlap = {{0, 100}, {50, 150}};
  EXPECT_THROW(prof::summarize_timeline(r, overlap), Error);
  std::vector<StepWindow> backwards = {{100, 0}};
  EXPECT_THROW(prof::summarize_timeline(r, backwards), Error);
}

TEST(KernelTimeline, ShortNames) {
  EXPECT_EQ(prof::shorten_kernel_name("void moefold::cuda::(anonymous namespace)::moe_stream_kernel<true, 4>("
                                      "moefold::cuda::MoeStreamArgs)"),
            "moe_stream_kernel<true, 4>");
  EXPECT_EQ(prof::shorten_kernel_name("void moefold::cuda::rms_norm_kernel<(int)8>(__nv_bfloat16 const*, int)"),
            "rms_norm_kernel<(int)8>");
  EXPECT_EQ(prof::shorten_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32"), "sm90_xmma_gemm_bf16bf16_bf16f32");
  const std::string longname(100, 'k');
  const std::string cut = prof::shorten_kernel_name(longname, 20);
  EXPECT_EQ(cut.size(), 20u);
  EXPECT_EQ(cut.substr(17), "...");
}

TEST(KernelTimeline, HostCallsPerStep) {
  // Two steps with kernels; a third window has none, so its host calls do not count.
  std::vector<KernelRecord> r = {rec("a", 100, 200), rec("a", 1100, 1200)};
  std::vector<prof::HostCall> h = {{"cudaGraphLaunch", 10, 30},      {"cudaMemcpyAsync", 40, 50},
                                   {"cudaMemcpyAsync", 50, 70},      {"cudaGraphLaunch", 1010, 1050},
                                   {"cudaStreamSynchronize", 1300, 1900}, {"cudaGraphLaunch", 2010, 2090}};
  std::vector<StepWindow> w = {{0, 1000}, {1000, 2000}, {2000, 3000}};
  auto s = prof::summarize_timeline(r, w, h);
  ASSERT_EQ(s.steps, 2);
  ASSERT_EQ(s.host_calls.size(), 3u);
  EXPECT_EQ(s.host_calls[0].name, "cudaStreamSynchronize");
  EXPECT_DOUBLE_EQ(s.host_calls[0].us_per_step, 0.3);
  EXPECT_EQ(s.host_calls[1].name, "cudaGraphLaunch");
  EXPECT_DOUBLE_EQ(s.host_calls[1].calls_per_step, 1.0);
  EXPECT_DOUBLE_EQ(s.host_calls[1].mean_us, 0.03);
  EXPECT_DOUBLE_EQ(s.host_call_us, 0.3 + 0.03 + 0.015);
  EXPECT_NE(prof::format_timeline(s).find("cudaMemcpyAsync"), std::string::npos);
  EXPECT_EQ(prof::timeline_to_json(s)["host_calls"].size(), 3u);
}

TEST(KernelTimeline, CsvListsEachStepsKernelsInOrderWithGapsAndExposedTime) {
  // Step 0 [0, 10000): b (PDL, starts under a) and a gap before c; step 1 [20000, 30000): d; a kernel
  // outside every window (e) is not listed; max_steps 1 drops step 1.
  std::vector<KernelRecord> r = {rec("b", 1500, 6000, 4), rec("a,x<1, 2>", 1000, 5000), rec("c", 7000, 8000),
                                 rec("d", 21000, 22000), rec("e", 15000, 16000)};
  std::vector<StepWindow> w = {{20000, 30000}, {0, 10000}};
  const std::string all = prof::timeline_csv(r, w, 10);
  EXPECT_EQ(all,
            "step,index,kernel,grid,start_us,end_us,gap_us,exposed_us\n"
            "0,0,\"a,x<1, 2>\",1x1x1,0.000,4.000,0.000,4.000\n"
            "0,1,\"b\",4x1x1,0.500,5.000,0.000,1.000\n"
            "0,2,\"c\",1x1x1,6.000,7.000,1.000,1.000\n"
            "1,0,\"d\",1x1x1,0.000,1.000,0.000,1.000\n");
  const std::string one = prof::timeline_csv(r, w, 1);
  EXPECT_EQ(one.find("\"d\""), std::string::npos);
  EXPECT_NE(one.find("\"c\""), std::string::npos);
}
