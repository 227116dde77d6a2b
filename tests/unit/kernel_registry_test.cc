// The kernel registry (launch counts, names, --require-kernel) and the profiler's window summary:
// exclusive time of overlapping intervals, idle as wall minus the union of intervals, shares summing
// to 100%.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "core/error.h"
#include "core/kernel_registry.h"
#include "core/profiler.h"

using namespace moefold;
using prof::Category;

namespace {

const prof::Kernel kA{"test::a", Category::DenseGemm};
const prof::Kernel kB{"test::b", Category::AttentionPrefill};
const prof::Kernel kC{"test::c", Category::Glue};
const prof::Kernel kNeverRuns{"test::never_runs", Category::Other};

double shares_sum(const prof::WindowProfile& p) {
  double s = p.idle_share();
  for (const auto& k : p.kernels) s += p.share(k);
  return s;
}

const prof::KernelTime* find(const prof::WindowProfile& p, const std::string& name) {
  for (const auto& k : p.kernels)
    if (k.name == name) return &k;
  return nullptr;
}

TEST(KernelRegistry, RegistersOnceAndCountsLaunches) {
  const prof::Kernel again{"test::a", Category::DenseGemm};
  EXPECT_EQ(again.id(), kA.id());
  EXPECT_NE(kA.id(), kB.id());
  const int64_t before = prof::find_kernel("test::a").launches;
  for (int i = 0; i < 5; ++i) prof::count(kA);
  EXPECT_EQ(prof::find_kernel("test::a").launches, before + 5);
  EXPECT_EQ(prof::find_kernel("test::a").category, Category::DenseGemm);
  EXPECT_EQ(prof::find_kernel("no such kernel").id, -1);
  EXPECT_EQ(prof::kernel_info(kB.id()).name, "test::b");
  // Registered at start-up (namespace-scope handles), before it ever ran.
  EXPECT_GE(prof::find_kernel("test::never_runs").id, 0);
  EXPECT_EQ(prof::find_kernel("test::never_runs").category, Category::Other);
}

TEST(KernelRegistry, RequireKernelPassesForARunKernelAndFailsOtherwise) {
  prof::reset_launch_counts();
  prof::count(kA);
  EXPECT_NO_THROW(prof::require_kernels_ran({"test::a"}));
  try {
    prof::require_kernels_ran({"test::a", "test::never_runs"});
    FAIL() << "a kernel that never ran passed";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("kernel test::never_runs never ran (ran: "), std::string::npos) << m;
    EXPECT_NE(m.find("test::a"), std::string::npos) << m;  // the kernels that did run are listed
  }
  try {
    prof::check_kernel_names({"test::typo"});
    FAIL() << "an unknown kernel name passed";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown kernel 'test::typo' (known: "), std::string::npos) << m;
    EXPECT_NE(m.find("test::never_runs"), std::string::npos) << m;  // known names are listed
  }
  EXPECT_THROW(prof::require_kernels_ran({"test::typo"}), Error);
}

TEST(Profiler, ExclusiveTimeSplitsOverlapsAndIdleIsWallMinusUnion) {
  // A [0, 10) and B [5, 15) overlap (two streams); C [20, 25); D partly outside the window; an untimed
  // call of C. Window [1000, 1040).
  const int64_t t0 = 1000;
  std::vector<prof::TimedCall> calls = {{kA.id(), t0 + 0, t0 + 10, {100, 1000}, true},
                                        {kB.id(), t0 + 5, t0 + 15, {50, 0}, true},
                                        {kC.id(), t0 + 20, t0 + 25, {10, 0}, true},
                                        {kC.id(), t0 + 38, t0 + 45, {0, 0}, true},
                                        {kC.id(), 0, 0, {1, 0}, false}};
  const prof::WindowProfile p = prof::summarise(t0, 40, calls);
  EXPECT_DOUBLE_EQ(p.wall_s, 40e-9);
  EXPECT_DOUBLE_EQ(p.busy_s, (15 + 5 + 2) * 1e-9);  // union: [0,15) + [20,25) + [38,40)
  EXPECT_DOUBLE_EQ(p.idle_s, 18e-9);
  const auto *a = find(p, "test::a"), *b = find(p, "test::b"), *c = find(p, "test::c");
  ASSERT_TRUE(a && b && c);
  EXPECT_DOUBLE_EQ(a->exclusive_s, 7.5e-9);  // 5 alone + half of the 5 shared
  EXPECT_DOUBLE_EQ(b->exclusive_s, 7.5e-9);
  EXPECT_DOUBLE_EQ(c->exclusive_s, 7e-9);    // 5 + the 2 inside the window
  EXPECT_DOUBLE_EQ(a->time_s, 10e-9);        // own durations are not split
  EXPECT_DOUBLE_EQ(c->time_s, 12e-9);
  EXPECT_EQ(c->calls, 3);
  EXPECT_EQ(c->untimed_calls, 1);
  EXPECT_DOUBLE_EQ(a->work.flops, 1000);
  EXPECT_DOUBLE_EQ(c->work.bytes, 10);  // untimed work is not summed into a rate
  EXPECT_NEAR(shares_sum(p), 1.0, 1e-12);
  EXPECT_EQ(p.kernels.front().name == "test::a" || p.kernels.front().name == "test::b", true);  // sorted by share
}

TEST(Profiler, NestedAndIdenticalIntervalsStillSumToWall) {
  const prof::WindowProfile p = prof::summarise(
      0, 100, {{kA.id(), 10, 90, {}, true}, {kB.id(), 20, 30, {}, true}, {kB.id(), 20, 30, {}, true},
               {kC.id(), 50, 50, {}, true}});
  EXPECT_DOUBLE_EQ(p.busy_s, 80e-9);
  EXPECT_DOUBLE_EQ(p.idle_s, 20e-9);
  EXPECT_NEAR(find(p, "test::b")->exclusive_s, 10e-9 * 2.0 / 3.0, 1e-21);
  EXPECT_NEAR(shares_sum(p), 1.0, 1e-12);
}

TEST(Profiler, ProfilerFlushTimeIsTakenOutOfWallAndIdle) {
  // A 100 ns span with 30 ns of flushes: wall 70, busy 40, idle 30.
  const prof::WindowProfile p =
      prof::summarise(0, 100, {{kA.id(), 0, 20, {}, true}, {kB.id(), 60, 80, {}, true}}, 30);
  EXPECT_DOUBLE_EQ(p.wall_s, 70e-9);
  EXPECT_DOUBLE_EQ(p.excluded_s, 30e-9);
  EXPECT_DOUBLE_EQ(p.busy_s, 40e-9);
  EXPECT_DOUBLE_EQ(p.idle_s, 30e-9);
  EXPECT_NEAR(shares_sum(p), 1.0, 1e-12);
}

TEST(Profiler, HostScopesTimeOpsOnlyInsideAWindowAndMeasureIdle) {
  {
    prof::HostScope s(kA);  // no window: counted, not recorded
  }
  prof::begin_window();
  EXPECT_TRUE(prof::timing_active());
  EXPECT_THROW(prof::begin_window(), Error);
  {
    prof::HostScope s(kA, [] { return prof::Work{1e6, 2e6}; });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // idle: no op runs
  {
    prof::HostScope s(kB, prof::Work{5, 0});
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const prof::WindowProfile p = prof::end_window();
  EXPECT_FALSE(prof::timing_active());
  EXPECT_EQ(p.timer, "steady_clock");
  ASSERT_EQ(p.kernels.size(), 2u);
  EXPECT_EQ(p.kernels[0].name, "test::a");
  EXPECT_EQ(p.kernels[0].calls, 1);
  EXPECT_GE(p.kernels[0].exclusive_s, 0.019);
  EXPECT_DOUBLE_EQ(p.kernels[0].work.flops, 2e6);
  EXPECT_GE(p.idle_s, 0.029);
  EXPECT_GE(p.wall_s, 0.059);
  EXPECT_NEAR(shares_sum(p), 1.0, 1e-9);
  EXPECT_THROW(prof::end_window(), Error);
}

TEST(Profiler, StepFactsAreScopedToTheThread) {
  EXPECT_EQ(prof::step_facts(), nullptr);
  const std::vector<int32_t> cu = {0, 3}, ctx = {5};
  {
    const prof::StepFacts f{3, cu, ctx};
    const prof::StepFactsScope scope(f);
    ASSERT_NE(prof::step_facts(), nullptr);
    EXPECT_EQ(prof::step_facts()->rows, 3);
    std::thread([] { EXPECT_EQ(prof::step_facts(), nullptr); }).join();
  }
  EXPECT_EQ(prof::step_facts(), nullptr);
}

}  // namespace
