// Tests of the serving benchmark's metric math (src/bench/serve_metrics.h): numpy-style
// percentiles, TPOT / ITL / TTFT from synthetic request records, peak concurrency, throughputs;
// and of the report and A/B comparison built on them (serve_report.h, ab_comparison.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "bench/ab_comparison.h"
#include "bench/serve_metrics.h"
#include "bench/serve_report.h"
#include "core/error.h"

namespace moefold::bench {
namespace {

TEST(Percentile, InterpolatesLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], p): 50 -> 2.5, 90 -> 3.7, 99 -> 3.97, 0 -> 1, 100 -> 4.
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  // numpy.percentile([10, 20, 30, 40, 50], 25) = 20; 62.5 -> 35.
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30, 40, 50}, 25), 20);
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30, 40, 50}, 62.5), 35);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_THROW(percentile({}, 50), Error);
  EXPECT_THROW(percentile(v, 101), Error);
  EXPECT_THROW(percentile(v, -1), Error);
}

TEST(Summarize, MeanMedianPopulationStdAndOrderedPercentiles) {
  const MetricSummary s = summarize({4, 1, 3, 2}, {50, 90, 99});
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_NEAR(s.std, std::sqrt(1.25), 1e-12);  // numpy.std([1,2,3,4]) (ddof 0)
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  ASSERT_EQ(s.percentiles.size(), 3u);
  EXPECT_DOUBLE_EQ(s.percentiles[0].first, 50);
  EXPECT_LE(s.percentiles[0].second, s.percentiles[1].second);
  EXPECT_LE(s.percentiles[1].second, s.percentiles[2].second);
  const MetricSummary e = summarize({}, {99});
  EXPECT_EQ(e.count, 0u);
  EXPECT_EQ(e.mean, 0);
  ASSERT_EQ(e.percentiles.size(), 1u);
  EXPECT_EQ(e.percentiles[0].second, 0);
}

/// A successful request sent at `start` whose chunks arrive at the absolute times `chunks`, ending
/// at `end`, with `tokens` output tokens.
RequestOutput request(double start, std::vector<double> chunks, double end, int64_t tokens, int64_t prompt = 10) {
  RequestOutput r;
  r.success = true;
  r.start_s = start;
  r.ttft_s = chunks.front() - start;
  for (size_t i = 1; i < chunks.size(); ++i) r.itl_s.push_back(chunks[i] - chunks[i - 1]);
  r.latency_s = end - start;
  r.output_tokens = tokens;
  r.prompt_tokens = prompt;
  return r;
}

TEST(Tpot, ExcludesTheFirstTokenAndNeedsTwoTokens) {
  // ttft 0.5 s, e2e 2.5 s, 5 tokens: (2.5 - 0.5) / 4 = 0.5 s.
  const RequestOutput r = request(1.0, {1.5, 2.0, 2.5, 3.0, 3.5}, 3.5, 5);
  EXPECT_DOUBLE_EQ(time_per_output_token(r), 0.5);
  EXPECT_EQ(time_per_output_token(request(0, {0.2}, 0.2, 1)), -1);
  RequestOutput failed = r;
  failed.success = false;
  EXPECT_EQ(time_per_output_token(failed), -1);
}

TEST(PeakConcurrency, CountsOverlapsExactlyAndBackToBackIsOne) {
  std::vector<RequestOutput> seq = {request(0, {0.1}, 1, 1), request(1, {1.1}, 2, 1), request(2, {2.1}, 3, 1)};
  EXPECT_EQ(peak_concurrency(seq), 1);
  std::vector<RequestOutput> overlap = {request(0, {0.1}, 2, 1), request(0.5, {0.6}, 1.5, 1), request(1, {1.1}, 3, 1),
                                        request(2.5, {2.6}, 4, 1)};
  EXPECT_EQ(peak_concurrency(overlap), 3);  // at t in [1, 1.5)
  RequestOutput failed;  // failed requests held a connection too
  failed.start_s = 0.2;
  failed.latency_s = 0.1;
  overlap.push_back(failed);
  EXPECT_EQ(peak_concurrency(overlap), 3);
  EXPECT_EQ(peak_concurrency({}), 0);
}

TEST(CalculateMetrics, ThroughputsLatenciesAndFailures) {
  std::vector<RequestOutput> outs = {
      request(0.0, {0.1, 0.2, 0.4}, 0.4, 3, 10),  // ttft 100 ms, itl 100, 200 ms, tpot (400-100)/2 = 150 ms
      request(0.5, {0.8, 1.05}, 1.05, 2, 20),     // ttft 300 ms, itl 250 ms, tpot 250 ms
      request(1.0, {1.2}, 1.2, 1, 30),            // ttft 200 ms, no itl, no tpot
  };
  RequestOutput failed;
  failed.error = "HTTP 400: too long";
  failed.start_s = 1.5;
  failed.latency_s = 0.01;
  failed.prompt_tokens = 999;
  outs.push_back(failed);
  const BenchmarkMetrics m = calculate_metrics(outs, 2.0, {50, 100});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 60);  // the failed request's tokens do not count
  EXPECT_EQ(m.total_output, 6);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 33.0);
  EXPECT_EQ(m.ttft.count, 3u);
  EXPECT_NEAR(m.ttft.mean, 200, 1e-9);
  EXPECT_NEAR(m.ttft.median, 200, 1e-9);
  EXPECT_NEAR(m.ttft.max, 300, 1e-9);
  EXPECT_EQ(m.itl.count, 3u);  // gaps of all requests pooled
  EXPECT_NEAR(m.itl.mean, 550.0 / 3, 1e-9);
  EXPECT_NEAR(m.itl.min, 100, 1e-9);
  EXPECT_EQ(m.tpot.count, 2u);
  EXPECT_NEAR(m.tpot.mean, 200, 1e-9);
  EXPECT_NEAR(m.tpot.percentiles[1].second, 250, 1e-9);
  EXPECT_EQ(m.e2el.count, 3u);
  EXPECT_NEAR(m.e2el.mean, (400 + 550 + 200) / 3.0, 1e-9);
  EXPECT_EQ(m.max_concurrent_requests, 2);  // 0-0.4, 0.5-1.05, 1.0-1.2, 1.5-1.51
  // Chunks per whole second since the first send: [0, 1): 0.1 0.2 0.4 0.8 -> 4; [1, 2): 1.05 1.2 -> 2.
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 4);
  EXPECT_THROW(calculate_metrics(outs, 0, {50}), Error);
}

TEST(ReportOptions, ParseMetricNamesAndPercentiles) {
  EXPECT_EQ(parse_metric_names("e2el, ttft,ttft"), (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_THROW(parse_metric_names("ttft,latency"), Error);
  EXPECT_THROW(parse_metric_names(""), Error);
  EXPECT_EQ(parse_percentiles("50,90,99.9"), (std::vector<double>{50, 90, 99.9}));
  EXPECT_THROW(parse_percentiles("50,abc"), Error);
  EXPECT_THROW(parse_percentiles("101"), Error);
  EXPECT_THROW(parse_percentiles("9x"), Error);
  EXPECT_EQ(percentile_word(99), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");
}

TEST(Report, TableAndJsonCarryTheNumbers) {
  std::vector<RequestOutput> outs = {request(0.0, {0.1, 0.2, 0.4}, 0.4, 3), request(0.5, {0.8, 1.0}, 1.0, 2)};
  RequestOutput failed;
  failed.error = "HTTP 400: too long";
  outs.push_back(failed);
  const BenchmarkMetrics m = calculate_metrics(outs, 2.0, {50, 99});
  ReportContext ctx;
  ctx.request_rate = INFINITY;
  ctx.max_concurrency = 4;
  const std::string text = format_result(m, outs, {"ttft", "itl"}, ctx);
  EXPECT_NE(text.find("=========== Serving Benchmark Result ============"), std::string::npos) << text;
  EXPECT_NE(text.find("Successful requests:                     2"), std::string::npos) << text;
  EXPECT_NE(text.find("Failed requests:                         1"), std::string::npos) << text;
  EXPECT_NE(text.find("Maximum request concurrency:             4"), std::string::npos) << text;
  EXPECT_EQ(text.find("Request rate configured"), std::string::npos) << "an infinite rate is not printed";
  EXPECT_NE(text.find("P99 TTFT (ms):"), std::string::npos) << text;
  EXPECT_NE(text.find("Inter-token Latency"), std::string::npos) << text;
  EXPECT_EQ(text.find("TPOT"), std::string::npos) << "tpot was not selected";
  EXPECT_NE(text.find("failed x1: HTTP 400: too long"), std::string::npos) << text;

  const auto j = metrics_json(m, outs);
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_output_tokens"], 5);
  EXPECT_DOUBLE_EQ(j["mean_ttft_ms"].get<double>(), m.ttft.mean);
  EXPECT_DOUBLE_EQ(j["p99_e2el_ms"].get<double>(), m.e2el.percentiles[1].second);  // all four metrics in the JSON
  EXPECT_TRUE(j.contains("std_tpot_ms"));
  EXPECT_EQ(j["errors"]["HTTP 400: too long"], 1);
  const auto r = requests_json(outs);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[1]["end_s"].get<double>(), 1.0);
  EXPECT_EQ(r[0]["itl_ms"].size(), 2u);
}

TEST(AbComparison, RatiosPerPairWithSpread) {
  std::vector<RequestOutput> one = {request(0, {0.1, 0.2}, 0.2, 2)};
  const BenchmarkMetrics a1 = calculate_metrics(one, 1.0, {99});
  const BenchmarkMetrics b1 = calculate_metrics(one, 0.5, {99});  // twice the throughput
  const BenchmarkMetrics b2 = calculate_metrics(one, 0.4, {99});
  const BenchmarkMetrics a2 = calculate_metrics(one, 1.0, {99});
  const std::vector<AbRow> rows = compare_ab(a1, b1, b2, a2, {"ttft"});
  ASSERT_EQ(rows.size(), 3u + 3u);  // 3 throughputs + mean, median, p99 of ttft
  const AbRow& req = rows[0];
  EXPECT_EQ(req.key, "request_throughput");
  EXPECT_DOUBLE_EQ(*req.pair1, 2.0);
  EXPECT_DOUBLE_EQ(*req.pair2, 2.5);
  EXPECT_DOUBLE_EQ(*req.mean(), 2.25);
  EXPECT_DOUBLE_EQ(*req.min(), 2.0);
  EXPECT_DOUBLE_EQ(*req.max(), 2.5);
  EXPECT_EQ(rows[3].key, "mean_ttft_ms");
  EXPECT_DOUBLE_EQ(*rows[3].pair1, 1.0);  // same latencies
  EXPECT_EQ(rows[5].key, "p99_ttft_ms");

  BenchmarkMetrics zero;  // a run where nothing completed: no ratio, never a division by zero
  zero.duration_s = 1;
  const auto none = compare_ab(zero, b1, b2, zero, {"ttft"});
  EXPECT_FALSE(none[0].pair1.has_value());
  EXPECT_FALSE(none[0].mean().has_value());
  const auto j = ab_json(none);
  EXPECT_TRUE(j["request_throughput"]["ratio_pair1"].is_null());
  const std::string text = format_ab(rows, "http://a (m)", "http://b (m)");
  EXPECT_NE(text.find("A/B comparison"), std::string::npos);
  EXPECT_NE(text.find("2.250"), std::string::npos) << text;  // the mean ratio
  EXPECT_NE(text.find("0.500"), std::string::npos) << text;  // the spread
}

}  // namespace
}  // namespace moefold::bench
