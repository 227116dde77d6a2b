// RequestChannel: what the engine thread sends to the HTTP handler of one request. The engine
// pushes one ChoiceEvent per generated token (per choice of the request); the handler waits for
// events and writes them out, and marks the channel cancelled when its client goes away.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/stop_checker.h"

namespace moefold::server {

/// One sampled token with its log-probabilities.
struct GeneratedToken {
  int32_t id = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  ///< the most likely alternatives, when requested
};

/// Progress of one choice.
struct ChoiceEvent {
  int32_t index = 0;                   ///< choice index within the request
  std::string text;                    ///< text released now (stop-string hold-back applied)
  std::vector<GeneratedToken> tokens;  ///< tokens sampled since the previous event
  FinishReason finish = FinishReason::kNone;
  std::string error;                   ///< non-empty: the choice failed (it is finished)
  int32_t cached_tokens = 0;           ///< prompt tokens served from the prefix cache (usage)
  bool finished() const { return finish != FinishReason::kNone || !error.empty(); }
};

class RequestChannel {
 public:
  explicit RequestChannel(int32_t num_choices) : open_(num_choices) {}

  /// Engine side: appends an event and wakes the waiting handler.
  void push(ChoiceEvent e) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (e.finished()) --open_;
      events_.push_back(std::move(e));
    }
    cv_.notify_all();
  }

  /// Handler side: waits up to `timeout` for events and moves all pending ones to `out`
  /// (appending). Returns true if any event was taken.
  bool wait_pop(std::vector<ChoiceEvent>& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return !events_.empty(); });
    if (events_.empty()) return false;
    for (auto& e : events_) out.push_back(std::move(e));
    events_.clear();
    return true;
  }

  /// True once every choice has pushed its final event (events may still be pending).
  bool all_finished() const {
    std::lock_guard<std::mutex> lk(mu_);
    return open_ <= 0;
  }

  /// Marks the request abandoned by its client; the engine drops it at its next step.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceEvent> events_;
  int32_t open_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace moefold::server
