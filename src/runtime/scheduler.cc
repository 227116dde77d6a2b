// Continuous-batching scheduler (contract: scheduler.h).
#include "runtime/scheduler.h"

#include <cmath>
#include <span>

#include <algorithm>
#include <chrono>
#include <future>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace moefold {

Scheduler::Scheduler(ModelRunner& runner, SchedulerOptions opt)
    : runner_(runner), opt_(opt), eos_(runner.config().eos_token_ids),
      vocab_(runner.config().vocab_size) {
  const RunnerOptions& r = runner.options();
  MOEFOLD_CHECK(opt_.max_num_seqs >= 1, "max_num_seqs must be at least 1, got {}", opt_.max_num_seqs);
  MOEFOLD_CHECK(opt_.max_num_batched_tokens >= 1, "max_num_batched_tokens must be at least 1, got {}",
                opt_.max_num_batched_tokens);
  MOEFOLD_CHECK(opt_.max_prefill_chunk >= 0, "max_prefill_chunk must be >= 0, got {}", opt_.max_prefill_chunk);
  MOEFOLD_CHECK(opt_.max_model_len >= 2, "max_model_len must be at least 2, got {}", opt_.max_model_len);
  MOEFOLD_CHECK(opt_.max_num_seqs <= r.max_seqs, "max_num_seqs {} exceeds the runner's {} state slots",
                opt_.max_num_seqs, r.max_seqs);
  const int64_t capacity = int64_t(r.num_blocks) * r.block_size;
  MOEFOLD_CHECK(opt_.max_model_len <= capacity,
                "max_model_len {} exceeds the KV cache ({} pages of {} tokens = {} tokens)", opt_.max_model_len,
                r.num_blocks, r.block_size, capacity);
}

RequestId Scheduler::add(std::vector<int32_t> prompt, const SamplingParams& params) {
  MOEFOLD_CHECK(!prompt.empty(), "the prompt is empty");
  MOEFOLD_CHECK(int64_t(prompt.size()) < opt_.max_model_len,
                "the prompt has {} tokens; the context holds {} (at least one must remain for output)",
                prompt.size(), opt_.max_model_len);
  for (int32_t t : prompt)
    MOEFOLD_CHECK(t >= 0 && t < vocab_, "token id {} is outside the vocabulary [0, {})", t, vocab_);
  SamplingParams p = params;
  const int32_t room = opt_.max_model_len - int32_t(prompt.size());
  p.max_tokens = std::min(p.max_tokens.value_or(room), room);
  Sampler sampler(p);  // validates
  std::optional<GrammarMatcher> matcher;
  if (p.constraint) {
    matcher.emplace(p.constraint);
    MOEFOLD_CHECK(matcher->vocab_size() == vocab_, "the request's constraint was compiled for {} token ids, the model has {}",
                  matcher->vocab_size(), vocab_);
  }
  const RequestId id = next_id_++;
  requests_.emplace(id, Request{id, std::move(prompt), {}, std::move(sampler), *p.max_tokens, -1, std::move(matcher)});
  waiting_.push_back(id);
  return id;
}

Scheduler::Request& Scheduler::get(RequestId id) {
  auto it = requests_.find(id);
  MOEFOLD_CHECK(it != requests_.end(), "unknown request id {}", id);
  return it->second;
}

const std::vector<int32_t>& Scheduler::output(RequestId id) const {
  auto it = requests_.find(id);
  MOEFOLD_CHECK(it != requests_.end(), "unknown request id {}", id);
  return it->second.output;
}

int32_t Scheduler::max_tokens(RequestId id) const {
  auto it = requests_.find(id);
  MOEFOLD_CHECK(it != requests_.end(), "unknown request id {}", id);
  return it->second.max_tokens;
}

int32_t Scheduler::cached_tokens(RequestId id) const {
  auto it = requests_.find(id);
  MOEFOLD_CHECK(it != requests_.end(), "unknown request id {}", id);
  return it->second.cached_tokens;
}

int32_t Scheduler::aligned_chunk(int32_t computed, int32_t n, int32_t left, bool may_skip) const {
  const int32_t a = runner_.prefill_alignment();
  if (n >= left || a <= 1) return n;
  const int32_t cut = ((computed + n) / a) * a - computed;
  if (cut > 0) return cut;
  return may_skip ? 0 : n;  // off the grid: this request takes no more snapshots
}

int32_t Scheduler::uncomputed(const Request& r) const {
  const int32_t total = int32_t(r.prompt.size() + r.output.size());
  if (r.seq < 0) return total;
  return total - runner_.sequence(r.seq).num_computed;
}

void Scheduler::remove(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (it->second.seq >= 0) {
    runner_.release(it->second.seq);
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else {
    auto w = std::find(waiting_.begin(), waiting_.end(), id);
    if (w != waiting_.end()) waiting_.erase(w);
  }
  requests_.erase(it);
}

bool Scheduler::abort(RequestId id) {
  if (!requests_.count(id)) return false;
  remove(id);
  return true;
}

void Scheduler::preempt(RequestId id) {
  Request& r = get(id);
  runner_.release(r.seq);
  r.seq = -1;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_front(id);
  ++num_preemptions_;
}

void Scheduler::plan_running(std::vector<Planned>& plan, int32_t& budget, int32_t& reserved) {
  const int32_t chunk_cap = opt_.max_prefill_chunk > 0 ? opt_.max_prefill_chunk : std::numeric_limits<int32_t>::max();
  for (;;) {  // restarts after each preemption, which frees pages
    plan.clear();
    budget = opt_.max_num_batched_tokens;
    reserved = 0;
    const int32_t free = runner_.free_blocks();
    bool preempted = false;
    for (int pass = 0; pass < 2 && !preempted; ++pass) {
      const bool decode_pass = pass == 0;
      for (RequestId id : running_) {
        if (budget == 0) break;
        const Request& r = requests_.at(id);
        const SequenceState& sq = runner_.sequence(r.seq);
        // Decode rows: generated tokens, including those a preempted request feeds back.
        const int32_t left = sq.num_computed >= sq.prompt_len ? int32_t(sq.tokens.size()) - sq.num_computed
                                                              : sq.prompt_len - sq.num_computed;
        if (left <= 0 || (sq.num_computed >= sq.prompt_len) != decode_pass) continue;
        int32_t n = std::min({left, budget, decode_pass ? 1 : chunk_cap});
        if (!decode_pass) {
          n = aligned_chunk(sq.num_computed, n, left, !plan.empty());
          if (n == 0) continue;  // runs next step, from a fresh budget
        }
        const int32_t need = runner_.blocks_needed(r.seq, n);
        if (reserved + need > free) {
          preempt(running_.back());
          preempted = true;
          break;
        }
        plan.push_back({id, n, !decode_pass});
        reserved += need;
        budget -= n;
      }
    }
    if (!preempted) return;
  }
}

void Scheduler::plan_admissions(std::vector<Planned>& plan, int32_t& budget, int32_t& reserved) {
  const int32_t chunk_cap = opt_.max_prefill_chunk > 0 ? opt_.max_prefill_chunk : std::numeric_limits<int32_t>::max();
  const int32_t bs = runner_.options().block_size;
  while (!waiting_.empty() && budget > 0 && int32_t(running_.size()) < opt_.max_num_seqs &&
         runner_.free_slots() > 0) {
    Request& r = requests_.at(waiting_.front());
    std::vector<int32_t> tokens = r.prompt;
    tokens.insert(tokens.end(), r.output.begin(), r.output.end());
    const int32_t plen = int32_t(r.prompt.size());
    const ModelRunner::PrefixMatch hit =
        runner_.match_prefix(std::span(tokens).first(size_t(plen)), tokens.size() > size_t(plen));
    // The prompt's first chunk, or (its prompt all restored) the first generated token fed back.
    const int32_t left = hit.tokens < plen ? plen - hit.tokens : 1;
    const int32_t n = aligned_chunk(hit.tokens, std::min({left, budget, chunk_cap}), left, !plan.empty());
    if (n == 0) break;  // FIFO: it starts next step, from a fresh budget
    // Its first chunk's new pages, plus the cached pages it revives (they stop being free).
    const int32_t need = (hit.tokens + n + bs - 1) / bs - hit.tokens / bs + hit.idle_pages;
    if (reserved + need > runner_.free_blocks()) break;  // FIFO: later requests wait behind it
    r.seq = runner_.add_sequence(std::move(tokens), plen);
    if (!r.admitted) {
      r.admitted = true;
      r.cached_tokens = runner_.sequence(r.seq).num_cached;
    }
    MOEFOLD_CHECK(runner_.sequence(r.seq).num_computed == hit.tokens,
                  "prefix cache: admission restored {} tokens, {} were matched", runner_.sequence(r.seq).num_computed,
                  hit.tokens);
    running_.push_back(r.id);
    waiting_.pop_front();
    plan.push_back({r.id, n, hit.tokens < plen});
    reserved += need;
    budget -= n;
  }
}

FinishReason Scheduler::finish_reason(const Request& r, int32_t token) const {
  const SamplingParams& p = r.sampler.params();
  if (!p.ignore_eos && std::find(eos_.begin(), eos_.end(), token) != eos_.end()) return FinishReason::kStop;
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end())
    return FinishReason::kStop;
  if (int32_t(r.output.size()) >= r.max_tokens) return FinishReason::kLength;
  if (int64_t(r.prompt.size() + r.output.size()) >= opt_.max_model_len) return FinishReason::kLength;
  return FinishReason::kNone;
}

std::vector<TokenOutput> Scheduler::step() {
  last_step_.clear();
  std::vector<TokenOutput> outs;
  std::vector<Planned> plan;
  int32_t budget = 0, reserved = 0;
  plan_running(plan, budget, reserved);
  plan_admissions(plan, budget, reserved);
  if (plan.empty()) return outs;

  // One sampling row per chunk: the chunks that complete their request's known tokens sample (decode
  // rows, last prefill chunks); a partial prefill chunk's row is computed but not sampled.
  std::vector<ModelRunner::Work> work;
  std::vector<RowSampling> sampling;
  std::vector<size_t> rows;  // plan indices of the sampled chunks
  for (size_t i = 0; i < plan.size(); ++i) {
    const Planned& p = plan[i];
    const Request& r = requests_.at(p.id);
    work.push_back({r.seq, p.num_tokens, false});
    last_step_.push_back({p.id, p.num_tokens, p.prefill});
    RowSampling rs;
    if (uncomputed(r) == p.num_tokens) {
      rs.sampler = &r.sampler;
      rs.prompt = r.prompt;
      rs.output = r.output;
      rows.push_back(i);
    }
    sampling.push_back(rs);
  }
  // Grammar bitmasks of the constrained rows, filled on a worker thread while the forward runs; the
  // executor waits for them (mask_ready) just before it samples.
  using clock = std::chrono::steady_clock;
  std::vector<std::pair<size_t, GrammarMatcher*>> constrained;  // (plan index, matcher)
  for (size_t i : rows) {
    Request& r = requests_.at(plan[i].id);
    if (r.matcher) constrained.push_back({i, &*r.matcher});
  }
  const size_t W = size_t(bitmask_words(vocab_));
  std::shared_future<double> fill;
  std::function<void()> mask_ready;
  last_mask_fill_ms_ = last_mask_wait_ms_ = 0;
  if (!constrained.empty()) {
    masks_.resize(constrained.size() * W);
    for (size_t k = 0; k < constrained.size(); ++k)
      sampling[constrained[k].first].token_bitmask = std::span<const uint32_t>(masks_.data() + k * W, W);
    fill = std::async(std::launch::async, [this, &constrained, W] {
             const auto t0 = clock::now();
             std::vector<GrammarMatcher*> ms;
             for (const auto& c : constrained) ms.push_back(c.second);
             fill_next_token_bitmasks(ms, std::span<uint32_t>(masks_.data(), constrained.size() * W), mask_threads_);
             return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
           }).share();
    mask_ready = [this, fill] {
      const auto t0 = clock::now();
      fill.get();  // rethrows a fill failure
      last_mask_wait_ms_ += std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    };
    for (size_t k = 0; k < constrained.size(); ++k) sampling[constrained[k].first].mask_ready = &mask_ready;
  }
  // The worker reads the matchers and writes masks_: it must be done before either changes again.
  auto join_fill = [&] {
    if (!fill.valid()) return;
    fill.wait();
    try {
      last_mask_fill_ms_ = fill.get();
    } catch (const std::exception&) {
    }
  };
  std::vector<SampleResult> results;
  try {
    runner_.step_sample(work, sampling, masked_tokens_, results);
  } catch (const std::exception& e) {
    join_fill();
    // Fail the requests of this batch so that the rest can go on (their pages are released).
    for (const Planned& p : plan) {
      TokenOutput o;
      o.id = p.id;
      o.error = std::string("model step failed: ") + e.what();
      outs.push_back(std::move(o));
      remove(p.id);
    }
    return outs;
  }
  join_fill();

  // Apply the sampled tokens in plan order.
  for (size_t j = 0; j < rows.size(); ++j) {
    SampleResult& s = results[rows[j]];
    Request& r = requests_.at(plan[rows[j]].id);
    TokenOutput o;
    o.id = r.id;
    if (!s.error.empty()) {
      o.error = "sampling failed: " + s.error;
      outs.push_back(std::move(o));
      remove(r.id);
      continue;
    }
    if (r.matcher && !r.matcher->accept_token(s.token)) {
      o.error = fmt::format("sampling failed: token {} violates the request's {} constraint", s.token,
                            r.matcher->compiled_kind());
      outs.push_back(std::move(o));
      remove(r.id);
      continue;
    }
    o.token = s.token;
    o.cached_tokens = r.cached_tokens;
    o.logprob = s.logprob;
    o.top_logprobs = std::move(s.top_logprobs);
    r.output.push_back(o.token);
    o.finish = finish_reason(r, o.token);
    if (o.finish == FinishReason::kNone && r.matcher && r.matcher->is_terminated()) o.finish = FinishReason::kStop;
    if (o.finish == FinishReason::kNone) {
      runner_.append_token(r.seq, o.token);
    } else {
      remove(r.id);
    }
    outs.push_back(std::move(o));
  }
  return outs;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  const RunnerOptions& r = runner_.options();
  s.num_running = int32_t(running_.size());
  s.num_waiting = int32_t(waiting_.size());
  s.kv_blocks_total = r.num_blocks;
  s.kv_blocks_used = r.num_blocks - runner_.free_blocks();
  s.state_slots_total = r.max_seqs;
  s.state_slots_used = r.max_seqs - runner_.free_slots();
  s.num_preemptions = num_preemptions_;
  const PrefixCacheStats p = runner_.prefix_cache_stats();
  s.prefix_queried_tokens = p.queried_tokens;
  s.prefix_hit_tokens = p.hit_tokens;
  s.prefix_cached_pages = p.cached_pages;
  s.prefix_snapshots = p.snapshots;
  s.prefix_snapshot_bytes = p.snapshot_bytes;
  return s;
}

}  // namespace moefold
