// Serving benchmark reports (contract: serve_report.h).
#include "bench/serve_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace moefold::bench {

namespace {

std::vector<std::string> split_csv(const std::string& csv) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= csv.size()) {
    size_t j = csv.find(',', i);
    if (j == std::string::npos) j = csv.size();
    std::string item = csv.substr(i, j - i);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    i = j + 1;
  }
  return out;
}

struct MetricInfo {
  const char* name;    // TTFT
  const char* header;  // Time to First Token
};

MetricInfo info(const std::string& metric) {
  if (metric == "ttft") return {"TTFT", "Time to First Token"};
  if (metric == "tpot") return {"TPOT", "Time per Output Token (excl. 1st token)"};
  if (metric == "itl") return {"ITL", "Inter-token Latency"};
  return {"E2EL", "End-to-end Latency"};
}

const MetricSummary& summary(const BenchmarkMetrics& m, const std::string& metric) {
  if (metric == "ttft") return m.ttft;
  if (metric == "tpot") return m.tpot;
  if (metric == "itl") return m.itl;
  return m.e2el;
}

std::string row(const std::string& label, const std::string& value) { return fmt::format("{:<40} {:<10}\n", label, value); }
std::string row(const std::string& label, double value) { return row(label, fmt::format("{:.2f}", value)); }

}  // namespace

std::vector<std::string> parse_metric_names(const std::string& csv) {
  const std::vector<std::string> items = split_csv(csv);
  MOEFOLD_CHECK(!items.empty(), "--percentile-metrics is empty (choose from ttft,tpot,itl,e2el)");
  for (const std::string& s : items)
    MOEFOLD_CHECK(std::find(kLatencyMetrics.begin(), kLatencyMetrics.end(), s) != kLatencyMetrics.end(),
                  "--percentile-metrics: unknown metric '{}' (choose from ttft,tpot,itl,e2el)", s);
  std::vector<std::string> out;
  for (const std::string& m : kLatencyMetrics)
    if (std::find(items.begin(), items.end(), m) != items.end()) out.push_back(m);
  return out;
}

std::vector<double> parse_percentiles(const std::string& csv) {
  const std::vector<std::string> items = split_csv(csv);
  MOEFOLD_CHECK(!items.empty(), "--metric-percentiles is empty (expected e.g. 50,90,99)");
  std::vector<double> out;
  for (const std::string& s : items) {
    double v = 0;
    size_t used = 0;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MOEFOLD_CHECK(used == s.size() && std::isfinite(v), "--metric-percentiles: '{}' is not a number", s);
    MOEFOLD_CHECK(v >= 0 && v <= 100, "--metric-percentiles: {} is outside [0, 100]", s);
    out.push_back(v);
  }
  return out;
}

std::string percentile_word(double p) {
  if (p == std::floor(p)) return fmt::format("{}", int64_t(p));
  return fmt::format("{}", p);
}

std::vector<NamedValue> headline_values(const BenchmarkMetrics& m, const std::vector<std::string>& metrics) {
  std::vector<NamedValue> out = {
      {"request_throughput", "Request throughput (req/s)", m.request_throughput},
      {"output_throughput", "Output token throughput (tok/s)", m.output_throughput},
      {"total_token_throughput", "Total Token throughput (tok/s)", m.total_token_throughput},
  };
  for (const std::string& metric : metrics) {
    const MetricSummary& s = summary(m, metric);
    const std::string name = info(metric).name;
    out.push_back({"mean_" + metric + "_ms", "Mean " + name + " (ms)", s.mean});
    out.push_back({"median_" + metric + "_ms", "Median " + name + " (ms)", s.median});
    for (const auto& [p, v] : s.percentiles) {
      const std::string w = percentile_word(p);
      out.push_back({fmt::format("p{}_{}_ms", w, metric), fmt::format("P{} {} (ms)", w, name), v});
    }
  }
  return out;
}

std::string format_result(const BenchmarkMetrics& m, const std::vector<RequestOutput>& outputs,
                          const std::vector<std::string>& metrics, const ReportContext& ctx) {
  std::string s = fmt::format("{:=^50}\n", " " + ctx.title + " ");
  s += row("Successful requests:", std::to_string(m.completed));
  s += row("Failed requests:", std::to_string(m.failed));
  if (ctx.max_concurrency > 0) s += row("Maximum request concurrency:", std::to_string(ctx.max_concurrency));
  if (std::isfinite(ctx.request_rate)) s += row("Request rate configured (RPS):", ctx.request_rate);
  s += row("Benchmark duration (s):", m.duration_s);
  s += row("Total input tokens:", std::to_string(m.total_input));
  s += row("Total generated tokens:", std::to_string(m.total_output));
  if (m.cached_reported) {
    s += row("Prefix cache hit tokens:", std::to_string(m.total_cached));
    s += row("Prefix cache hit rate (%):", 100.0 * m.prefix_cache_hit_rate);
  }
  s += row("Request throughput (req/s):", m.request_throughput);
  s += row("Output token throughput (tok/s):", m.output_throughput);
  s += row("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  s += row("Peak concurrent requests:", double(m.max_concurrent_requests));
  s += row("Total Token throughput (tok/s):", m.total_token_throughput);
  for (const std::string& metric : metrics) {
    const MetricInfo mi = info(metric);
    const MetricSummary& ms = summary(m, metric);
    s += fmt::format("{:-^50}\n", mi.header);
    s += row(fmt::format("Mean {} (ms):", mi.name), ms.mean);
    s += row(fmt::format("Median {} (ms):", mi.name), ms.median);
    for (const auto& [p, v] : ms.percentiles) s += row(fmt::format("P{} {} (ms):", percentile_word(p), mi.name), v);
  }
  s += std::string(50, '=') + "\n";
  std::map<std::string, int64_t> errors;
  for (const RequestOutput& r : outputs)
    if (!r.success) ++errors[r.error];
  int shown = 0;
  for (const auto& [msg, n] : errors) {
    if (shown++ == 3) {
      s += fmt::format("  ... and {} other error messages\n", errors.size() - 3);
      break;
    }
    s += fmt::format("  failed x{}: {}\n", n, msg);
  }
  return s;
}

nlohmann::ordered_json metrics_json(const BenchmarkMetrics& m, const std::vector<RequestOutput>& outputs) {
  nlohmann::ordered_json j;
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["total_cached_tokens"] = m.total_cached;
  j["prefix_cache_hit_rate"] = m.prefix_cache_hit_rate;
  j["request_throughput"] = m.request_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  bool in_usage = true, out_usage = true;
  std::map<std::string, int64_t> errors;
  for (const RequestOutput& r : outputs) {
    if (!r.success) {
      ++errors[r.error];
      continue;
    }
    in_usage = in_usage && r.prompt_tokens_from_usage;
    out_usage = out_usage && r.output_tokens_from_usage;
  }
  j["input_tokens_from_usage"] = in_usage;
  j["output_tokens_from_usage"] = out_usage;
  for (const std::string& metric : kLatencyMetrics) {
    const MetricSummary& s = summary(m, metric);
    j["count_" + metric] = s.count;
    j["mean_" + metric + "_ms"] = s.mean;
    j["median_" + metric + "_ms"] = s.median;
    j["std_" + metric + "_ms"] = s.std;
    j["min_" + metric + "_ms"] = s.min;
    j["max_" + metric + "_ms"] = s.max;
    for (const auto& [p, v] : s.percentiles) j[fmt::format("p{}_{}_ms", percentile_word(p), metric)] = v;
  }
  j["errors"] = errors;
  return j;
}

nlohmann::ordered_json requests_json(const std::vector<RequestOutput>& outputs) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const RequestOutput& r : outputs) {
    std::vector<double> itl_ms;
    for (double g : r.itl_s) itl_ms.push_back(g * 1e3);
    a.push_back({{"success", r.success},
                 {"error", r.error},
                 {"start_s", r.start_s},
                 {"end_s", r.start_s + r.latency_s},
                 {"ttft_ms", r.ttft_s * 1e3},
                 {"latency_ms", r.latency_s * 1e3},
                 {"prompt_tokens", r.prompt_tokens},
                 {"cached_tokens", r.cached_tokens},
                 {"output_tokens", r.output_tokens},
                 {"itl_ms", itl_ms}});
  }
  return a;
}

}  // namespace moefold::bench
