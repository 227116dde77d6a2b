// Tests of one serving benchmark run without a server (src/bench/serve_runner.h): every request
// is sent exactly once, results stay in request order, the concurrency limit is never exceeded
// (checked by the fake sender itself, not by timing), failures from the sender are contained;
// and the progress bar's text (src/bench/progress_bar.h).
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "bench/progress_bar.h"
#include "bench/serve_runner.h"
#include "core/error.h"

namespace moefold::bench {
namespace {

/// A sender that records how many calls overlap; each call yields a few times so that overlaps
/// can happen when they are allowed.
struct FakeSender {
  std::atomic<int> in_flight{0}, peak{0}, calls{0};
  RequestOutput operator()(size_t i) {
    const int now = ++in_flight;
    int p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    ++calls;
    for (int k = 0; k < 50; ++k) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    RequestOutput r;
    r.success = true;
    r.output_tokens = int64_t(i);  // lets the test check the order of the results
    r.latency_s = 0.001;
    --in_flight;
    return r;
  }
};

TEST(RunRequests, ConcurrencyLimitIsNeverExceeded) {
  for (int64_t limit : {1, 3}) {
    FakeSender fake;
    const std::vector<double> arrivals(24, 0.0);  // all at once: only the limit holds them back
    const RunResult res = run_requests(arrivals, limit, [&](size_t i, auto) { return fake(i); }, nullptr);
    EXPECT_EQ(fake.calls.load(), 24);
    EXPECT_LE(fake.peak.load(), limit);
    ASSERT_EQ(res.outputs.size(), 24u);
    for (size_t i = 0; i < res.outputs.size(); ++i) EXPECT_EQ(res.outputs[i].output_tokens, int64_t(i));
    EXPECT_GT(res.duration_s, 0);
  }
  FakeSender unlimited;
  run_requests(std::vector<double>(16, 0.0), 0, [&](size_t i, auto) { return unlimited(i); }, nullptr);
  EXPECT_EQ(unlimited.calls.load(), 16);
}

// A limit beyond what a semaphore counts (--max-concurrency accepts up to 2^40) must neither wrap
// to 0 (every request would wait forever) nor to a small number: it means "no limit".
TEST(RunRequests, HugeConcurrencyLimitIsNoLimit) {
  for (int64_t limit : {int64_t(1) << 32, (int64_t(1) << 32) + 1, int64_t(1) << 40}) {
    FakeSender fake;
    const RunResult res = run_requests(std::vector<double>(6, 0.0), limit, [&](size_t i, auto) { return fake(i); }, nullptr);
    EXPECT_EQ(fake.calls.load(), 6) << limit;
    ASSERT_EQ(res.outputs.size(), 6u);
    for (const RequestOutput& r : res.outputs) EXPECT_TRUE(r.success) << limit;
  }
}

TEST(RunRequests, ArrivalTimesAreRespectedAndFailuresContained) {
  // Request i may not be sent before arrivals[i]: the sender sees the time since the start.
  const std::vector<double> arrivals = {0.0, 0.02, 0.04, 0.06};
  std::vector<double> sent(arrivals.size());
  const RunResult res = run_requests(
      arrivals, 0,
      [&](size_t i, std::chrono::steady_clock::time_point start) {
        sent[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (i == 2) throw std::runtime_error("boom");
        RequestOutput r;
        r.success = true;
        return r;
      },
      nullptr);
  for (size_t i = 0; i < arrivals.size(); ++i) EXPECT_GE(sent[i], arrivals[i]) << i;
  EXPECT_TRUE(res.outputs[1].success);
  EXPECT_FALSE(res.outputs[2].success);
  EXPECT_NE(res.outputs[2].error.find("boom"), std::string::npos);
  EXPECT_THROW(run_requests({0.0}, -1, [](size_t, auto) { return RequestOutput{}; }, nullptr), Error);
}

// Conversations: turns of one conversation are sequential and carry the earlier replies, at most
// max_concurrency conversations overlap, a failed turn ends its conversation (later turns not sent).
TEST(RunConversations, TurnsInOrderWithRepliesConcurrencyAndFailures) {
  std::atomic<int> in_flight{0}, peak{0}, sent{0};
  std::mutex mu;
  std::vector<std::vector<size_t>> turns_seen(6);
  const RunResult res = run_conversations(
      6, 4, 2,
      [&](size_t c, size_t t, const std::vector<std::string>& replies, auto) {
        const int now = ++in_flight;
        int p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {
        }
        ++sent;
        EXPECT_EQ(replies.size(), t);
        for (size_t k = 0; k < replies.size(); ++k) EXPECT_EQ(replies[k], "c" + std::to_string(c) + "t" + std::to_string(k));
        {
          std::lock_guard<std::mutex> lock(mu);
          turns_seen[c].push_back(t);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        RequestOutput r;
        --in_flight;
        if (c == 3 && t == 1) throw std::runtime_error("boom");
        r.success = true;
        r.generated_text = "c" + std::to_string(c) + "t" + std::to_string(t);
        return r;
      },
      nullptr);
  EXPECT_LE(peak.load(), 2);
  EXPECT_EQ(sent.load(), 5 * 4 + 2);  // conversation 3 stops after its failed turn 1
  ASSERT_EQ(res.outputs.size(), 24u);
  for (size_t c = 0; c < 6; ++c) {
    for (size_t t = 0; t < 4; ++t) {
      const RequestOutput& o = res.outputs[c * 4 + t];
      if (c == 3 && t >= 1) {
        EXPECT_FALSE(o.success);
        EXPECT_NE(o.error.find(t == 1 ? "boom" : "not sent"), std::string::npos) << o.error;
      } else {
        EXPECT_EQ(o.generated_text, "c" + std::to_string(c) + "t" + std::to_string(t));
      }
    }
    EXPECT_EQ(turns_seen[c], c == 3 ? std::vector<size_t>({0, 1}) : std::vector<size_t>({0, 1, 2, 3}));
  }
  EXPECT_THROW(run_conversations(1, 1, -1, [](size_t, size_t, const auto&, auto) { return RequestOutput{}; }, nullptr),
               Error);
}

TEST(ProgressBar, RendersFractionCountsAndRate) {
  const std::string s = ProgressBar::render("A1", 37, 100, 5.0);
  EXPECT_EQ(s.rfind("A1  37%|", 0), 0u) << s;
  EXPECT_NE(s.find("| 37/100 [00:05<00:08, 7.40 req/s]"), std::string::npos) << s;
  const std::string done = ProgressBar::render("", 4, 4, 3700.0);
  EXPECT_NE(done.find("100%|"), std::string::npos) << done;
  EXPECT_NE(done.find("[1:01:40<00:00"), std::string::npos) << done;
  EXPECT_NE(ProgressBar::render("", 0, 10, 0.0).find("<?,"), std::string::npos);  // no rate yet: no ETA
  ProgressBar off(3, false);  // disabled: ticking is harmless and prints nothing
  off.tick();
  off.close();
}

}  // namespace
}  // namespace moefold::bench
