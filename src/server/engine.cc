// Engine loop (contract: engine.h).
#include "server/engine.h"

#include "parallel/cpu_parallel_executor.h"

#include "core/error.h"
#include "server/api_error.h"

namespace moefold::server {

using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

Engine::Engine(std::unique_ptr<ModelRunner> runner, const Tokenizer& tokenizer, EngineOptions opt, Metrics& metrics)
    : tokenizer_(tokenizer), opt_(opt), metrics_(metrics), eos_(runner->config().eos_token_ids),
      runner_(std::move(runner)), scheduler_(*runner_, opt.scheduler) {
  scheduler_.set_masked_tokens(opt_.masked_tokens);
  publish();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { stop(); }

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestChannel> Engine::submit(std::vector<ChoiceSpec> choices) {
  auto ch = std::make_shared<RequestChannel>(int32_t(choices.size()));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) throw ApiError(503, "The server is shutting down.", "service_unavailable", "", "shutting_down");
    // More sequences than the queue can ever hold: no retry can succeed, so this is the client's
    // error (400), not an overload (503 + Retry-After).
    if (int64_t(choices.size()) > opt_.max_queue)
      throw ApiError(400,
                     fmt::format("This request asks for {} sequences (n x prompts) but the server queues at most {} "
                                 "(--max-queue); lower 'n' or send fewer prompts per request.",
                                 choices.size(), opt_.max_queue),
                     "invalid_request_error", "n", "too_many_sequences");
    const int64_t queued = int64_t(waiting_) + inbox_choices_ + int64_t(choices.size());
    if (queued > opt_.max_queue)
      throw ApiError(503,
                     fmt::format("The server is overloaded: {} sequences are already waiting (limit {}). "
                                 "Retry later.",
                                 waiting_ + inbox_choices_, opt_.max_queue),
                     "service_unavailable", "", "queue_full");
    inbox_choices_ += int32_t(choices.size());
    inbox_.push_back({ch, std::move(choices), Clock::now()});
  }
  cv_.notify_all();
  return ch;
}

void Engine::notify() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void Engine::admit(Pending& p) {
  for (size_t i = 0; i < p.choices.size(); ++i) {
    ChoiceSpec& c = p.choices[i];
    try {
      StopChecker stop(c.params, eos_);
      const RequestId id = scheduler_.add(std::move(c.prompt), c.params);
      running_.emplace(id, Running{p.channel, int32_t(i), Detokenizer(tokenizer_, c.skip_special_tokens),
                                   std::move(stop), p.arrival, p.arrival});
    } catch (const std::exception& e) {
      ChoiceEvent ev;
      ev.index = int32_t(i);
      ev.error = e.what();
      p.channel->push(std::move(ev));
      metrics_.count_finish("error");
    }
  }
}

void Engine::drop_cancelled() {
  for (auto it = running_.begin(); it != running_.end();) {
    if (it->second.channel->cancelled()) {
      scheduler_.abort(it->first);
      metrics_.count_finish("abort");
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

void Engine::handle(TokenOutput& o) {
  auto it = running_.find(o.id);
  if (it == running_.end()) return;
  Running& r = it->second;
  ChoiceEvent ev;
  ev.index = r.index;
  if (!o.error.empty()) {
    ev.error = o.error;
    outbox_.emplace_back(r.channel, std::move(ev));
    metrics_.count_finish("error");
    running_.erase(it);
    return;
  }
  const auto now = Clock::now();
  if (r.first) metrics_.observe_ttft(seconds(now - r.arrival));
  else metrics_.observe_itl(seconds(now - r.last_token));
  r.first = false;
  r.last_token = now;
  ev.tokens.push_back({o.token, o.logprob, std::move(o.top_logprobs)});
  ev.cached_tokens = o.cached_tokens;
  try {
    std::string delta;
    try {
      delta = r.detok.feed(o.token);
    } catch (const Error&) {
      // An id the tokenizer has no token for (a padded vocabulary): it has no text.
    }
    if (o.finish != FinishReason::kNone) delta += r.detok.flush();
    StopUpdate u = r.stop.on_token(o.token, delta);
    ev.text = std::move(u.text);
    ev.finish = u.finish;
    if (ev.finish == FinishReason::kNone && o.finish != FinishReason::kNone) {
      StopUpdate f = r.stop.finish(o.finish);  // the context limit, which the checker cannot see
      ev.text += f.text;
      ev.finish = o.finish;
    }
  } catch (const std::exception& e) {
    ev.error = std::string("detokenization failed: ") + e.what();
  }
  const bool done = ev.finished();
  if (done && o.finish == FinishReason::kNone) scheduler_.abort(o.id);  // a stop string or an error
  if (done) metrics_.count_finish(ev.error.empty() ? std::string(finish_reason_name(ev.finish)) : "error");
  outbox_.emplace_back(r.channel, std::move(ev));
  if (done) running_.erase(it);
}

void Engine::fail_all(const std::string& message) {
  for (auto& [id, r] : running_) {
    scheduler_.abort(id);
    ChoiceEvent ev;
    ev.index = r.index;
    ev.error = message;
    r.channel->push(std::move(ev));
  }
  running_.clear();
}

void Engine::publish() {
  SchedulerStats s = scheduler_.stats();
  metrics_.set_engine_stats(s);
  if (auto load = expert_load_per_rank(runner_->executor()); !load.empty()) metrics_.set_expert_load(std::move(load));
  std::lock_guard<std::mutex> lk(mu_);
  waiting_ = s.num_waiting;
}

void Engine::loop() {
  for (;;) {
    std::vector<Pending> incoming;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || wake_ || !inbox_.empty() || scheduler_.has_work(); });
      if (stop_) break;
      incoming.swap(inbox_);
      inbox_choices_ = 0;
      wake_ = false;
    }
    for (Pending& p : incoming) admit(p);
    drop_cancelled();
    try {
      std::vector<TokenOutput> outs = scheduler_.step();
      for (TokenOutput& o : outs) handle(o);
    } catch (const std::exception& e) {
      // Not expected (the scheduler reports per-request failures itself); never take the server down.
      fail_all(std::string("internal error: ") + e.what());
    }
    // Publish pool usage before the events go out, so that a client that has its answer sees
    // its pages and slot released in /metrics.
    publish();
    for (auto& [channel, ev] : outbox_) channel->push(std::move(ev));
    outbox_.clear();
  }
  fail_all("The server is shutting down.");
  std::lock_guard<std::mutex> lk(mu_);
  for (Pending& p : inbox_) {
    for (size_t i = 0; i < p.choices.size(); ++i) {
      ChoiceEvent ev;
      ev.index = int32_t(i);
      ev.error = "The server is shutting down.";
      p.channel->push(std::move(ev));
    }
  }
  inbox_.clear();
}

}  // namespace moefold::server
