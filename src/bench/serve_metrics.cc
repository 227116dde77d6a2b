// Serving benchmark metrics (contract: serve_metrics.h).
#include "bench/serve_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace moefold::bench {

double percentile(const std::vector<double>& sorted, double p) {
  MOEFOLD_CHECK(!sorted.empty(), "percentile of an empty list");
  MOEFOLD_CHECK(p >= 0 && p <= 100, "percentile {} outside [0, 100]", p);
  const double h = (double(sorted.size()) - 1) * p / 100.0;
  const size_t lo = size_t(std::floor(h));
  if (lo + 1 >= sorted.size()) return sorted.back();
  return sorted[lo] + (h - double(lo)) * (sorted[lo + 1] - sorted[lo]);
}

MetricSummary summarize(std::vector<double> values, const std::vector<double>& percentiles) {
  MetricSummary s;
  s.count = values.size();
  if (values.empty()) {
    for (double p : percentiles) s.percentiles.emplace_back(p, 0.0);
    return s;
  }
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / double(values.size());
  double sq = 0;
  for (double v : values) sq += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(sq / double(values.size()));
  s.median = percentile(values, 50);
  s.min = values.front();
  s.max = values.back();
  for (double p : percentiles) s.percentiles.emplace_back(p, percentile(values, p));
  return s;
}

double time_per_output_token(const RequestOutput& r) {
  if (!r.success || r.output_tokens < 2) return -1;
  return (r.latency_s - r.ttft_s) / double(r.output_tokens - 1);
}

int64_t peak_concurrency(const std::vector<RequestOutput>& outputs) {
  // Sweep over start (+1) and end (-1) events; at equal times ends come first.
  std::vector<std::pair<double, int>> events;
  events.reserve(outputs.size() * 2);
  for (const RequestOutput& r : outputs) {
    events.emplace_back(r.start_s, +1);
    events.emplace_back(r.start_s + r.latency_s, -1);
  }
  std::sort(events.begin(), events.end());
  int64_t now = 0, peak = 0;
  for (const auto& e : events) {
    now += e.second;
    peak = std::max(peak, now);
  }
  return peak;
}

BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<double>& percentiles) {
  MOEFOLD_CHECK(duration_s > 0, "benchmark duration must be > 0 (got {})", duration_s);
  BenchmarkMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  std::map<int64_t, int64_t> chunks_per_second;
  double first_start = 0;
  if (!outputs.empty()) {
    first_start = outputs.front().start_s;
    for (const RequestOutput& r : outputs) first_start = std::min(first_start, r.start_s);
  }
  for (const RequestOutput& r : outputs) {
    if (!r.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input += r.prompt_tokens;
    m.total_cached += r.cached_tokens;
    m.cached_reported = m.cached_reported || r.cached_tokens_from_usage;
    m.total_output += r.output_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.latency_s * 1e3);
    if (double t = time_per_output_token(r); t >= 0) tpot.push_back(t * 1e3);
    double t = r.start_s + r.ttft_s;
    ++chunks_per_second[int64_t(std::floor(t - first_start))];
    for (double gap : r.itl_s) {
      itl.push_back(gap * 1e3);
      t += gap;
      ++chunks_per_second[int64_t(std::floor(t - first_start))];
    }
  }
  m.prefix_cache_hit_rate = m.total_input > 0 ? double(m.total_cached) / double(m.total_input) : 0.0;
  m.request_throughput = double(m.completed) / duration_s;
  m.output_throughput = double(m.total_output) / duration_s;
  m.total_token_throughput = double(m.total_input + m.total_output) / duration_s;
  for (const auto& [second, n] : chunks_per_second) m.max_output_tokens_per_s = std::max(m.max_output_tokens_per_s, double(n));
  m.max_concurrent_requests = peak_concurrency(outputs);
  m.ttft = summarize(std::move(ttft), percentiles);
  m.tpot = summarize(std::move(tpot), percentiles);
  m.itl = summarize(std::move(itl), percentiles);
  m.e2el = summarize(std::move(e2el), percentiles);
  return m;
}

}  // namespace moefold::bench
