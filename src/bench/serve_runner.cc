// One serving benchmark run (contract: serve_runner.h).
#include "bench/serve_runner.h"

#include <algorithm>
#include <atomic>
#include <semaphore>
#include <system_error>
#include <thread>

#include "core/error.h"

namespace moefold::bench {

RunResult run_requests(const std::vector<double>& arrivals, int64_t max_concurrency, const SendFn& send,
                       ProgressBar* bar) {
  using Clock = std::chrono::steady_clock;
  MOEFOLD_CHECK(max_concurrency >= 0, "--max-concurrency must be >= 1 (got {})", max_concurrency);
  RunResult result;
  result.outputs.resize(arrivals.size());
  // A limit of at least the number of requests holds nothing back (and a semaphore counts only up
  // to max(): libstdc++'s stores an int, so 2^32 would wrap to 0 and every request would wait).
  const bool limited = max_concurrency > 0 && uint64_t(max_concurrency) < arrivals.size();
  // The dispatcher (this thread) is the only one that acquires, so places go in arrival order.
  std::counting_semaphore<> places(
      limited ? std::ptrdiff_t(std::min<int64_t>(max_concurrency, std::counting_semaphore<>::max())) : 0);
  std::vector<std::thread> threads;
  threads.reserve(arrivals.size());
  const Clock::time_point start = Clock::now();
  auto run_one = [&](size_t i) {
    try {
      result.outputs[i] = send(i, start);
    } catch (const std::exception& e) {
      result.outputs[i].error = std::string("request failed: ") + e.what();
      result.outputs[i].start_s = std::chrono::duration<double>(Clock::now() - start).count();
    }
    if (limited) places.release();
    if (bar) bar->tick();
  };
  for (size_t i = 0; i < arrivals.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i])));
    if (limited) places.acquire();
    try {
      threads.emplace_back(run_one, i);
    } catch (const std::system_error& e) {
      result.outputs[i].error = std::string("could not start a request thread: ") + e.what();
      result.outputs[i].start_s = std::chrono::duration<double>(Clock::now() - start).count();
      if (limited) places.release();
      if (bar) bar->tick();
    }
  }
  for (std::thread& t : threads) t.join();
  result.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

RunResult run_conversations(size_t num_conversations, size_t num_turns, int64_t max_concurrency, const TurnFn& send,
                            ProgressBar* bar) {
  using Clock = std::chrono::steady_clock;
  MOEFOLD_CHECK(max_concurrency >= 0, "--max-concurrency must be >= 1 (got {})", max_concurrency);
  RunResult result;
  result.outputs.resize(num_conversations * num_turns);
  const size_t workers = max_concurrency > 0 ? std::min<size_t>(size_t(max_concurrency), num_conversations)
                                             : num_conversations;
  std::atomic<size_t> next{0};
  const Clock::time_point start = Clock::now();
  auto since_start = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  auto worker = [&] {
    for (size_t c; (c = next.fetch_add(1)) < num_conversations;) {
      std::vector<std::string> replies;
      for (size_t t = 0; t < num_turns; ++t) {
        RequestOutput& out = result.outputs[c * num_turns + t];
        if (replies.size() < t) {  // an earlier turn failed
          out.error = "not sent: turn " + std::to_string(replies.size()) + " of this conversation failed";
          out.start_s = since_start();
        } else {
          try {
            out = send(c, t, replies, start);
          } catch (const std::exception& e) {
            out = RequestOutput{};
            out.error = std::string("request failed: ") + e.what();
            out.start_s = since_start();
          }
          if (out.success) replies.push_back(out.generated_text);
        }
        if (bar) bar->tick();
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers; ++i) {
    try {
      threads.emplace_back(worker);
    } catch (const std::system_error&) {
      if (threads.empty()) throw;
      break;  // fewer conversations at once; the started workers take the rest
    }
  }
  for (std::thread& t : threads) t.join();
  result.duration_s = since_start();
  return result;
}

}  // namespace moefold::bench
