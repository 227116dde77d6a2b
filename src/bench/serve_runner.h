// One run of a serving benchmark: sends requests at their arrival times (arrival_schedule.h),
// never more than --max-concurrency at once, each on its own thread, and collects what each
// measured. Like `vllm bench serve`, a request that arrives while the concurrency limit is reached
// waits for a free place (in arrival order) and its TTFT counts from when it is actually sent.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/progress_bar.h"
#include "bench/serve_metrics.h"

namespace moefold::bench {

/// Sends request `index` now; `run_start` is the zero of the times in the result. Must not throw
/// (a failure is a RequestOutput with success = false).
using SendFn = std::function<RequestOutput(size_t index, std::chrono::steady_clock::time_point run_start)>;

struct RunResult {
  std::vector<RequestOutput> outputs;  ///< one per request, in request order
  double duration_s = 0;               ///< from the run's start to the end of its last request
};

/// Runs `arrivals.size()` requests: request i is sent no earlier than arrivals[i] seconds after
/// the start (non-decreasing times) and only while fewer than `max_concurrency` requests are in
/// flight (0: no limit). `bar` (may be null) ticks once per finished request. An exception from
/// `send` or a thread that cannot start becomes a failed request. Throws moefold::Error for
/// max_concurrency < 0.
RunResult run_requests(const std::vector<double>& arrivals, int64_t max_concurrency, const SendFn& send,
                       ProgressBar* bar);

/// Sends turn `turn` of conversation `conv` now, given the replies (generated_text) of its turns
/// 0..turn-1. Must not throw (a failure is a RequestOutput with success = false).
using TurnFn = std::function<RequestOutput(size_t conv, size_t turn, const std::vector<std::string>& replies,
                                           std::chrono::steady_clock::time_point run_start)>;

/// Runs `num_conversations` conversations of `num_turns` turns (a multi-turn benchmark): at most
/// `max_concurrency` conversations at once (0: all), each on its own thread sending its turns one
/// after another, turn t + 1 as soon as turn t's reply is complete. A failed turn ends its
/// conversation: its later turns are not sent and are recorded as failed ("not sent: ..."). outputs
/// are in order conv * num_turns + turn; `bar` ticks once per turn (sent or not). An exception from
/// `send` becomes a failed turn. Throws moefold::Error for max_concurrency < 0.
RunResult run_conversations(size_t num_conversations, size_t num_turns, int64_t max_concurrency, const TurnFn& send,
                            ProgressBar* bar);

}  // namespace moefold::bench
