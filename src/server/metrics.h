// Server metrics in the Prometheus text exposition format (version 0.0.4).
//
// Counters (monotonic since start):
//   moefold_requests_total{endpoint, status}       API requests answered, by HTTP status
//   moefold_request_finish_total{reason}           finished sequences (choices): stop, length, abort, error
//   moefold_prompt_tokens_total                     prompt tokens, as reported in usage
//   moefold_generation_tokens_total                 generated tokens, as reported in usage (aborted
//                                                   streams: the tokens generated before the abort)
//   moefold_preemptions_total                       requests preempted by recompute
//   moefold_prefix_cache_queries_total / _hits_total prompt tokens looked up in / served from the prefix cache
//   moefold_expert_routed_pairs_total{rank}         (row, expert) pairs each tensor/expert-parallel rank's
//                                                   routed experts computed (only with -tp > 1)
// Gauges (sampled after every engine step):
//   moefold_num_requests_running / moefold_num_requests_waiting
//   moefold_kv_cache_blocks_used / _total, moefold_kv_cache_usage_ratio
//   moefold_deltanet_state_slots_used / _total
//   moefold_prefix_cache_pages, moefold_prefix_cache_snapshots, moefold_prefix_cache_snapshot_bytes
// Histograms (seconds): moefold_time_to_first_token_seconds, moefold_inter_token_latency_seconds,
//   moefold_e2e_request_latency_seconds.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/scheduler.h"

namespace moefold::server {

/// A Prometheus histogram with fixed upper bounds (the +Inf bucket is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  /// Appends the _bucket/_sum/_count lines of metric `name` to `out`.
  void render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  ///< per bound, not cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

/// Thread-safe registry of the server's metrics.
class Metrics {
 public:
  Metrics();
  /// One answered API request (`endpoint` e.g. "/v1/completions").
  void count_request(const std::string& endpoint, int status);
  /// One finished sequence; `reason` is "stop", "length", "abort" or "error".
  void count_finish(const std::string& reason);
  /// Usage of one answered request.
  void add_tokens(int64_t prompt, int64_t generated);
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  void observe_e2e(double seconds);
  /// Latest scheduler state (pool usage, queue sizes, preemptions).
  void set_engine_stats(const SchedulerStats& s);
  SchedulerStats engine_stats() const;
  /// Routed (row, expert) pairs computed per tensor/expert-parallel rank so far (empty: one rank).
  void set_expert_load(std::vector<int64_t> pairs_per_rank);
  /// The whole exposition text.
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finishes_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
  SchedulerStats stats_;
  std::vector<int64_t> expert_load_;
};

}  // namespace moefold::server
