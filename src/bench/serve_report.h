// Reports of `moefold bench serve`: the text table in the layout of vLLM's "Serving Benchmark
// Result", the same numbers as JSON (vLLM's key names: mean_ttft_ms, p99_itl_ms, ...), and the
// option parsing of --percentile-metrics / --metric-percentiles.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/serve_metrics.h"

namespace moefold::bench {

/// The latency metrics a report can show, in report order.
inline const std::vector<std::string> kLatencyMetrics = {"ttft", "tpot", "itl", "e2el"};

/// Parses a comma-separated subset of ttft,tpot,itl,e2el (kept in report order, duplicates
/// dropped). Throws moefold::Error naming an unknown name, or for an empty list.
std::vector<std::string> parse_metric_names(const std::string& csv);

/// Parses comma-separated percentiles, each in [0, 100] ("50,90,99", "99.9"). Throws
/// moefold::Error for a non-number, a value outside the range, or an empty list.
std::vector<double> parse_percentiles(const std::string& csv);

/// How vLLM spells a percentile in labels and keys: "99" for 99.0, "99.9" for 99.9.
std::string percentile_word(double p);

/// One number of a run: JSON key, label in the text report, value.
struct NamedValue {
  std::string key, label;
  double value = 0;
};

/// The numbers an A/B comparison shows, in report order: request, output and total token
/// throughput, then for each of `metrics` its mean, median and percentiles (ms).
std::vector<NamedValue> headline_values(const BenchmarkMetrics& m, const std::vector<std::string>& metrics);

/// What the text report says about the run's settings.
struct ReportContext {
  std::string title = "Serving Benchmark Result";
  double request_rate = 0;      ///< requests/s; infinite: not printed
  int64_t max_concurrency = 0;  ///< 0: not printed
};

/// The "Serving Benchmark Result" table (vLLM's layout, plus a failed-requests line and the
/// first distinct error messages when requests failed), for the selected latency metrics.
std::string format_result(const BenchmarkMetrics& m, const std::vector<RequestOutput>& outputs,
                          const std::vector<std::string>& metrics, const ReportContext& ctx);

/// Every number of `m` under vLLM's keys (duration, completed, failed, total_input_tokens,
/// request_throughput, ..., and for all four latency metrics mean/median/std/min/max and each
/// percentile, in ms), plus `errors` ({message: count}) and whether the token counts came from the
/// servers' usage.
nlohmann::ordered_json metrics_json(const BenchmarkMetrics& m, const std::vector<RequestOutput>& outputs);

/// One object per request: success, error, start_s, end_s, ttft_ms, latency_ms, prompt_tokens,
/// output_tokens, itl_ms.
nlohmann::ordered_json requests_json(const std::vector<RequestOutput>& outputs);

}  // namespace moefold::bench
