// Metrics of `moefold bench serve`, computed the way vLLM's `vllm bench serve` computes them:
//
//   TTFT  time from sending a request to its first chunk with content
//   ITL   gaps between consecutive content chunks of a request (all requests' gaps pooled)
//   TPOT  per request (e2e latency - TTFT) / (output tokens - 1), requests with > 1 output token
//   E2EL  time from sending a request to its last content chunk (trailing usage / [DONE] events excluded)
//   throughputs: completed requests, output tokens, input + output tokens per second of the
//   whole run (first send to last completion)
//
// Percentiles interpolate linearly between order statistics (numpy's default), std is the
// population standard deviation (numpy's default). Latencies are reported in milliseconds.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moefold::bench {

/// What one request of a benchmark run measured. Times are seconds; `start_s` is relative to the
/// start of the run.
struct RequestOutput {
  bool success = false;
  std::string error;            ///< why it failed (empty on success)
  double start_s = 0;           ///< when it was sent
  double ttft_s = 0;            ///< to the first content chunk (0 if none arrived)
  double latency_s = 0;         ///< to the last content chunk (a failed request: to the failure)
  std::vector<double> itl_s;    ///< gaps between consecutive content chunks
  int64_t prompt_tokens = 0;    ///< from the server's usage, else the client's count (0: unknown)
  int64_t output_tokens = 0;    ///< from the server's usage, else the number of content chunks
  bool prompt_tokens_from_usage = false;
  bool output_tokens_from_usage = false;
  int64_t cached_tokens = 0;    ///< usage.prompt_tokens_details.cached_tokens (prefix-cache hits)
  bool cached_tokens_from_usage = false;
  std::string generated_text;   ///< the content chunks' text joined (a multi-turn client sends it back)
};

/// Summary of one latency metric over a run, in milliseconds. All zero when `count` is 0.
struct MetricSummary {
  size_t count = 0;
  double mean = 0, median = 0, std = 0, min = 0, max = 0;
  std::vector<std::pair<double, double>> percentiles;  ///< (percentile in [0, 100], value)
};

/// Everything a run reports.
struct BenchmarkMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;  ///< tokens of completed requests
  int64_t total_cached = 0;  ///< prompt tokens the server reported as served from its prefix cache
  bool cached_reported = false;  ///< some completed request reported cached_tokens
  double prefix_cache_hit_rate = 0;  ///< total_cached / total_input (0 when nothing was reported)
  double duration_s = 0;
  double request_throughput = 0;      ///< completed requests / s
  double output_throughput = 0;       ///< output tokens / s
  double total_token_throughput = 0;  ///< (input + output tokens) / s
  double max_output_tokens_per_s = 0; ///< most content chunks received in one whole second of the run
  int64_t max_concurrent_requests = 0;  ///< most requests in flight at one instant (sent, not finished)
  MetricSummary ttft, tpot, itl, e2el;
};

/// The p-th percentile (p in [0, 100]) of `sorted` (ascending, non-empty), interpolated linearly
/// between order statistics like numpy.percentile. Throws moefold::Error on an empty input or p
/// outside [0, 100].
double percentile(const std::vector<double>& sorted, double p);

/// Count, mean, median, population std, min, max and the given percentiles of `values` (any
/// order; the unit is kept). Empty `values` give a summary of zeros with the percentiles listed.
MetricSummary summarize(std::vector<double> values, const std::vector<double>& percentiles);

/// TPOT of one request in seconds: (latency - ttft) / (output_tokens - 1); -1 when the request
/// failed or has fewer than 2 output tokens.
double time_per_output_token(const RequestOutput& r);

/// Most requests in flight at one instant, intervals [start_s, start_s + latency_s) of every
/// request (failed ones included: they held a connection too). A request that ends exactly when
/// another starts does not overlap it.
int64_t peak_concurrency(const std::vector<RequestOutput>& outputs);

/// All metrics of a run that took `duration_s` seconds (> 0), latency summaries with the given
/// percentiles. Token totals and latencies count completed requests only.
BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<double>& percentiles);

}  // namespace moefold::bench
