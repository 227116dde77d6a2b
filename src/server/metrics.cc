// Prometheus metrics registry (contract: metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

#include <cmath>

namespace moefold::server {

namespace {

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25,
                                            0.5,   0.75,   1.0,   2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0};
const std::vector<double> kE2eBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0};

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (v <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += v;
}

void Histogram::render(const std::string& name, std::string& out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, num(bounds_[i]), cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, num(sum_), name, count_);
}

Metrics::Metrics() : ttft_(kLatencyBounds), itl_(kLatencyBounds), e2e_(kE2eBounds) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_finish(const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  ++finishes_[reason];
}

void Metrics::add_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lk(mu_);
  prompt_tokens_ += prompt;
  generation_tokens_ += generated;
}

void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  ttft_.observe(s);
}
void Metrics::observe_itl(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  itl_.observe(s);
}
void Metrics::observe_e2e(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  e2e_.observe(s);
}

void Metrics::set_engine_stats(const SchedulerStats& s) {
  std::lock_guard<std::mutex> lk(mu_);
  stats_ = s;
}

void Metrics::set_expert_load(std::vector<int64_t> pairs_per_rank) {
  std::lock_guard<std::mutex> lk(mu_);
  expert_load_ = std::move(pairs_per_rank);
}

SchedulerStats Metrics::engine_stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string out;
  header(out, "moefold_requests_total", "counter", "API requests answered, by endpoint and HTTP status.");
  for (const auto& [key, v] : requests_)
    out += fmt::format("moefold_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, v);
  header(out, "moefold_request_finish_total", "counter", "Finished sequences (choices) by finish reason.");
  for (const char* r : {"stop", "length", "abort", "error"}) {
    auto it = finishes_.find(r);
    out += fmt::format("moefold_request_finish_total{{reason=\"{}\"}} {}\n", r, it == finishes_.end() ? 0 : it->second);
  }
  header(out, "moefold_prompt_tokens_total", "counter", "Prompt tokens of answered requests (usage.prompt_tokens).");
  out += fmt::format("moefold_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "moefold_generation_tokens_total", "counter",
         "Generated tokens of answered requests (usage.completion_tokens).");
  out += fmt::format("moefold_generation_tokens_total {}\n", generation_tokens_);
  header(out, "moefold_preemptions_total", "counter", "Requests preempted by recompute when KV pages ran out.");
  out += fmt::format("moefold_preemptions_total {}\n", stats_.num_preemptions);
  header(out, "moefold_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.");
  out += fmt::format("moefold_prefix_cache_queries_total {}\n", stats_.prefix_queried_tokens);
  header(out, "moefold_prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.");
  out += fmt::format("moefold_prefix_cache_hits_total {}\n", stats_.prefix_hit_tokens);
  if (!expert_load_.empty()) {
    header(out, "moefold_expert_routed_pairs_total", "counter",
           "Routed (row, expert) pairs computed by each tensor/expert-parallel rank's experts.");
    for (size_t r = 0; r < expert_load_.size(); ++r)
      out += fmt::format("moefold_expert_routed_pairs_total{{rank=\"{}\"}} {}\n", r, expert_load_[r]);
  }

  auto gauge = [&](const char* name, const char* help, double v) {
    header(out, name, "gauge", help);
    out += fmt::format("{} {}\n", name, num(v));
  };
  gauge("moefold_num_requests_running", "Sequences in the running batch.", stats_.num_running);
  gauge("moefold_num_requests_waiting", "Sequences waiting for admission (queued or preempted).", stats_.num_waiting);
  gauge("moefold_kv_cache_blocks_used", "KV-cache pages in use.", stats_.kv_blocks_used);
  gauge("moefold_kv_cache_blocks_total", "KV-cache pages in the pool.", stats_.kv_blocks_total);
  gauge("moefold_kv_cache_usage_ratio", "Fraction of KV-cache pages in use.",
        stats_.kv_blocks_total ? double(stats_.kv_blocks_used) / stats_.kv_blocks_total : 0.0);
  gauge("moefold_deltanet_state_slots_used", "DeltaNet state slots in use.", stats_.state_slots_used);
  gauge("moefold_deltanet_state_slots_total", "DeltaNet state slots in the pool.", stats_.state_slots_total);
  gauge("moefold_prefix_cache_pages", "KV pages indexed by the prefix cache (held or evictable).",
        stats_.prefix_cached_pages);
  gauge("moefold_prefix_cache_snapshots", "DeltaNet state snapshots kept by the prefix cache.", stats_.prefix_snapshots);
  gauge("moefold_prefix_cache_snapshot_bytes", "Memory of the prefix cache's DeltaNet state snapshots.",
        double(stats_.prefix_snapshot_bytes));

  header(out, "moefold_time_to_first_token_seconds", "histogram", "Time from arrival to the first generated token.");
  ttft_.render("moefold_time_to_first_token_seconds", out);
  header(out, "moefold_inter_token_latency_seconds", "histogram", "Time between consecutive tokens of a sequence.");
  itl_.render("moefold_inter_token_latency_seconds", out);
  header(out, "moefold_e2e_request_latency_seconds", "histogram", "Time from arrival to the end of the response.");
  e2e_.render("moefold_e2e_request_latency_seconds", out);
  return out;
}

}  // namespace moefold::server
