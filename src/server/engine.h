// Engine: the one thread that drives the scheduler. HTTP handler threads submit requests (each
// with n choices) and receive ChoiceEvents on a RequestChannel; the engine loop admits new
// requests, drops cancelled ones, runs Scheduler::step(), detokenizes every new token, applies
// stop strings with hold-back (StopChecker) and pushes the released text to the channel.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/scheduler.h"
#include "server/metrics.h"
#include "server/request_channel.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace moefold::server {

/// One sequence to generate: its prompt and its (validated) sampling parameters.
struct ChoiceSpec {
  std::vector<int32_t> prompt;
  SamplingParams params;
  bool skip_special_tokens = true;  ///< special tokens produce no text
};

struct EngineOptions {
  SchedulerOptions scheduler;
  std::vector<int32_t> masked_tokens;  ///< never sampled (Scheduler::set_masked_tokens)
  int32_t max_queue = 1024;  ///< sequences waiting for admission before submit() refuses
};

class Engine {
 public:
  /// Takes over `runner` (its KV pages and state slots, on any device) and starts the engine
  /// thread. `tokenizer` and `metrics` must outlive the engine. Throws Error for options that do
  /// not fit the runner.
  Engine(std::unique_ptr<ModelRunner> runner, const Tokenizer& tokenizer, EngineOptions opt, Metrics& metrics);
  /// Stops the thread; requests still in flight get an error event.
  ~Engine();

  /// Queues the choices of one request; their events arrive on the returned channel in order.
  /// Throws ApiError 400 when the request alone has more than max_queue sequences (it could never
  /// be queued), ApiError 503 when the queue is too full for it now.
  std::shared_ptr<RequestChannel> submit(std::vector<ChoiceSpec> choices);
  /// Wakes the engine so that it notices a cancelled channel promptly.
  void notify();
  /// Stops the engine thread (idempotent).
  void stop();

 private:
  struct Pending {
    std::shared_ptr<RequestChannel> channel;
    std::vector<ChoiceSpec> choices;
    std::chrono::steady_clock::time_point arrival;
  };
  struct Running {
    std::shared_ptr<RequestChannel> channel;
    int32_t index;
    Detokenizer detok;
    StopChecker stop;
    std::chrono::steady_clock::time_point arrival, last_token;
    bool first = true;
  };

  void loop();
  void admit(Pending& p);
  void drop_cancelled();
  void handle(TokenOutput& o);
  void fail_all(const std::string& message);
  void publish();

  const Tokenizer& tokenizer_;
  EngineOptions opt_;
  Metrics& metrics_;
  std::vector<int32_t> eos_;
  std::unique_ptr<ModelRunner> runner_;
  Scheduler scheduler_;
  std::map<RequestId, Running> running_;  // engine thread only
  std::vector<std::pair<std::shared_ptr<RequestChannel>, ChoiceEvent>> outbox_;  // events of this step

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> inbox_;
  int32_t inbox_choices_ = 0;
  int32_t waiting_ = 0;  ///< scheduler's waiting count after the last step
  bool wake_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace moefold::server
