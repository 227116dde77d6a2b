// Scheduler: iteration-level continuous batching over a ModelRunner.
//
// Requests wait in a FIFO queue and run in a set of at most max_num_seqs sequences. Every step():
//   1. fills a token budget (max_num_batched_tokens) with, in this order,
//        decode rows (one token) of running requests, oldest first,
//        prefill chunks of running requests whose prompt is not yet fully computed, oldest first,
//        prefill chunks of waiting requests admitted now (FIFO), while a DeltaNet state slot,
//        a running place and the KV pages of their first chunk are free (admission control);
//      a prompt longer than the budget or than max_prefill_chunk is split over several steps
//      (chunked prefill); with prefix caching, an admitted request starts after the prefix the
//      runner restores (ModelRunner::add_sequence), and for a hybrid model every chunk but a prompt's
//      last ends on the 64-token grid, where the chunked DeltaNet prefill takes state snapshots;
//   2. when the running requests' KV pages do not fit, preempts the youngest running request by
//      recompute: its pages and state slot are released (its prompt pages and snapshots stay in the
//      prefix cache) and it goes back to the front of the queue; when readmitted its prompt is
//      prefilled again (from the cache where it can) and its generated tokens are fed back as decode
//      rows, one per step, unsampled, so its state is rebuilt with the bits it had;
//   3. runs one ModelRunner::step_sample over all chunks, which samples a token inside the executor
//      (on the GPU for a CUDA executor) for every request whose known tokens are then all computed
//      (a partial prefill chunk samples nothing);
//   4. ends requests on EOS (unless ignore_eos), a stop_token_ids entry, max_tokens or the
//      context limit (max_model_len), releasing their pages and slot at once.
// Structured output: a request whose params carry a constraint has a GrammarMatcher. For each step
// its next-token bitmask is filled on a host worker thread while the executor runs the forward
// (RowSampling::token_bitmask / mask_ready), the sampled token is fed to the matcher, and the
// request ends with finish "stop" once the matcher terminates (a stop id after a complete match).
//
// A request's tokens never depend on the rest of the batch: every token is fed exactly once per
// residency, the sampler draws from (seed, position) only, and the model computes each sequence
// independently. Stop strings are text and are handled above (the server calls finish()).
//
// Not thread-safe: one thread (the engine loop, or a test) drives add/abort/step.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/grammar_constraint.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/sampling_params.h"
#include "runtime/stop_checker.h"

namespace moefold {

using RequestId = int64_t;

struct SchedulerOptions {
  int32_t max_num_seqs = 32;             ///< running requests at once; <= the runner's state slots
  int32_t max_num_batched_tokens = 2048; ///< token rows per step (decode rows + prefill chunks)
  int32_t max_prefill_chunk = 0;         ///< most prompt tokens of one request per step; 0 = budget
  int32_t max_model_len = 4096;          ///< prompt + generated tokens; <= the KV pool's capacity
};

/// One sampled token of one request, as step() reports it.
struct TokenOutput {
  RequestId id = -1;
  int32_t token = -1;
  float logprob = 0.0f;                     ///< raw log-softmax of the sampled token
  std::vector<TokenLogprob> top_logprobs;   ///< when params.logprobs && top_logprobs > 0
  FinishReason finish = FinishReason::kNone; ///< set when the request ended at this token
  std::string error;                         ///< non-empty: the request failed and was removed
  /// Prompt tokens the request's first admission restored from the prefix cache (0 without a hit).
  int32_t cached_tokens = 0;
};

/// One chunk of the last step (for tests and metrics).
struct ScheduledChunk {
  RequestId id;
  int32_t num_tokens;
  bool prefill;  ///< false for a one-token decode row
};

/// Pool usage and queue sizes at a point in time.
struct SchedulerStats {
  int32_t num_running = 0, num_waiting = 0;
  int32_t kv_blocks_used = 0, kv_blocks_total = 0;
  int32_t state_slots_used = 0, state_slots_total = 0;
  int64_t num_preemptions = 0;
  // Prefix cache (all zero with caching off).
  int64_t prefix_queried_tokens = 0;  ///< prompt tokens looked up at admissions
  int64_t prefix_hit_tokens = 0;      ///< of which restored from the cache
  int32_t prefix_cached_pages = 0;    ///< registered KV pages (held or evictable)
  int32_t prefix_snapshots = 0;       ///< DeltaNet state snapshots kept
  int64_t prefix_snapshot_bytes = 0;  ///< their memory
};

class Scheduler {
 public:
  /// `runner` must outlive the scheduler and be driven only through it. Throws Error if an option
  /// is out of range, max_num_seqs exceeds the runner's state slots, or max_model_len exceeds the
  /// KV pool (a lone request must always fit, so preemption always makes progress).
  Scheduler(ModelRunner& runner, SchedulerOptions opt);

  /// Token ids never sampled from now on (their logits become -inf before sampling; mask_tokens):
  /// e.g. the model vocabulary's padding ids that the tokenizer cannot decode. Logprobs are then those
  /// of the masked distribution.
  void set_masked_tokens(std::vector<int32_t> ids) { masked_tokens_ = std::move(ids); }

  /// Queues a request. `params.max_tokens` is capped by the context (max_model_len - prompt).
  /// Throws Error (nothing queued) for an empty prompt, a prompt of max_model_len tokens or more,
  /// a token id outside the vocabulary, invalid sampling parameters, or a params.constraint
  /// compiled for another vocabulary size.
  RequestId add(std::vector<int32_t> prompt, const SamplingParams& params);

  /// Removes a waiting or running request (client gone, or a stop string found above) and frees
  /// its KV pages and state slot. Returns false for an unknown (e.g. already finished) id.
  bool abort(RequestId id);

  /// Runs one iteration (see the file comment) and returns the tokens sampled in it, in the
  /// order of the batch. Empty when there is nothing to do. A model or sampler failure fails
  /// the requests concerned (TokenOutput::error) and never leaves pages or slots behind.
  std::vector<TokenOutput> step();

  /// True while a request is waiting or running.
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int32_t num_waiting() const { return int32_t(waiting_.size()); }
  int32_t num_running() const { return int32_t(running_.size()); }
  SchedulerStats stats() const;
  /// The chunks of the most recent step().
  const std::vector<ScheduledChunk>& last_step() const { return last_step_; }
  /// Tokens generated so far by a live request (throws Error for an unknown id).
  const std::vector<int32_t>& output(RequestId id) const;
  /// The effective max_tokens of a live request after the context cap.
  int32_t max_tokens(RequestId id) const;
  /// Prompt tokens of a live request served from the prefix cache at its first admission (0 while
  /// it waits for the first time; throws Error for an unknown id).
  int32_t cached_tokens(RequestId id) const;
  const SchedulerOptions& options() const { return opt_; }
  /// Host time spent filling grammar bitmasks in the last step (0 when no row was constrained),
  /// and how much of it the forward did not hide (the executor waited for the masks).
  double last_mask_fill_ms() const { return last_mask_fill_ms_; }
  double last_mask_wait_ms() const { return last_mask_wait_ms_; }

 private:
  struct Request {
    RequestId id;
    std::vector<int32_t> prompt;
    std::vector<int32_t> output;
    Sampler sampler;
    int32_t max_tokens;
    int32_t seq = -1;  ///< runner sequence while running
    std::optional<GrammarMatcher> matcher;  ///< when params.constraint is set
    bool admitted = false;      ///< admitted at least once (cached_tokens is then set)
    int32_t cached_tokens = 0;  ///< prompt tokens restored from the prefix cache at the first admission
  };
  struct Planned {
    RequestId id;
    int32_t num_tokens;
    bool prefill;
  };

  Request& get(RequestId id);
  /// Tokens of `r` not yet in the cache (all of prompt + output when waiting).
  int32_t uncomputed(const Request& r) const;
  /// Plans running requests' chunks; preempts the youngest until their pages fit.
  void plan_running(std::vector<Planned>& plan, int32_t& budget, int32_t& reserved);
  /// Admits waiting requests into the remaining budget.
  void plan_admissions(std::vector<Planned>& plan, int32_t& budget, int32_t& reserved);
  void preempt(RequestId id);
  /// Releases the request's runner sequence (if any) and forgets it.
  void remove(RequestId id);
  /// The first n of `left` uncomputed prompt tokens, after `computed`, to run in one chunk: n itself
  /// when it finishes the prompt (n == left), else cut back to end on the runner's prefill alignment
  /// (a hybrid model's 64-token snapshot grid); 0 when that leaves nothing and `may_skip`.
  int32_t aligned_chunk(int32_t computed, int32_t n, int32_t left, bool may_skip) const;
  /// Finish reason after `r` produced `token`, or kNone.
  FinishReason finish_reason(const Request& r, int32_t token) const;

  ModelRunner& runner_;
  SchedulerOptions opt_;
  std::vector<int32_t> masked_tokens_;
  std::vector<int32_t> eos_;
  int64_t vocab_;
  std::map<RequestId, Request> requests_;
  std::deque<RequestId> waiting_;
  std::vector<RequestId> running_;  ///< admission order: front is the oldest
  std::vector<ScheduledChunk> last_step_;
  RequestId next_id_ = 0;
  int64_t num_preemptions_ = 0;
  std::vector<uint32_t> masks_;  ///< grammar bitmasks of the step's constrained rows
  int mask_threads_ = default_mask_threads();
  double last_mask_fill_ms_ = 0, last_mask_wait_ms_ = 0;
};

}  // namespace moefold
