// ModelRunner: owns the KV pages and DeltaNet state slots of live sequences and turns a list of
// per-sequence work items into one ForwardBatch per step. The scheduler and the CLI sit on top.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include <memory>

#include "models/model.h"
#include "runtime/executor.h"
#include "runtime/forward_batch.h"
#include "runtime/kv_cache.h"

namespace moefold {

struct RunnerOptions {
  int32_t num_blocks = 256;  ///< KV pages in the pool
  int32_t block_size = 16;   ///< tokens per page
  int32_t max_seqs = 8;      ///< DeltaNet state slots (concurrent sequences)
};

struct SequenceState {
  std::vector<int32_t> tokens;  ///< prompt + generated tokens known so far
  int32_t num_computed = 0;     ///< tokens whose K/V and state are already in the cache
  std::vector<int32_t> blocks;  ///< KV page ids
  int32_t slot = -1;            ///< DeltaNet state slot
};

class ModelRunner {
 public:
  /// Runs on the CPU reference executor over `model` (which must outlive the runner).
  ModelRunner(const Model& model, RunnerOptions opt);
  /// Runs on `executor`, whose pages and slots must match `opt` (opt.num_blocks <= 0: all of the
  /// executor's pages, e.g. a GPU executor that sized its KV cache from free memory).
  ModelRunner(std::unique_ptr<Executor> executor, RunnerOptions opt);

  /// Registers a sequence with its prompt; takes a state slot (zeroed). Throws Error when no slot is
  /// free or the prompt is empty. Returns its id.
  int32_t add_sequence(std::vector<int32_t> prompt);
  /// Appends a generated token (to be computed in a later step).
  void append_token(int32_t seq, int32_t token);
  /// Frees the sequence's pages and slot.
  void release(int32_t seq);

  struct Work {
    int32_t seq;
    int32_t num_tokens;        ///< the next num_tokens uncomputed tokens (1 for decode)
    bool all_logits = false;   ///< logits of every row, else only of the last row
  };
  /// Runs one forward step over all work items together. Returns logits per item: [rows, vocab]
  /// (rows = num_tokens if all_logits else 1). Throws Error if KV pages run out (nothing is changed then).
  std::vector<std::vector<float>> step(const std::vector<Work>& work);
  /// The same step without copying the logits: one writable [rows, vocab] view per work item into the
  /// runner's own buffer, valid until the next step (the serving path: no per-step allocation of
  /// rows x vocab floats).
  std::vector<std::span<float>> step_views(const std::vector<Work>& work);
  /// The same step, sampled inside the executor (Executor::forward_sample): rows holds one entry per
  /// logits row of the step (work items in order; an all_logits item has num_tokens rows), out gets
  /// one SampleResult per row (per-row failures in SampleResult::error). No logits reach the host
  /// on a GPU executor. Throws Error (nothing changed) if KV pages run out or rows has the wrong
  /// size; a failure of the forward throws after the pages were taken, as step_views does. The
  /// sampled tokens are not appended (append_token does that).
  void step_sample(const std::vector<Work>& work, std::span<const RowSampling> rows,
                   std::span<const int32_t> masked_tokens, std::vector<SampleResult>& out);

  /// Pages a sequence still needs to hold `extra` more tokens.
  int32_t blocks_needed(int32_t seq, int32_t extra) const;
  const SequenceState& sequence(int32_t seq) const;
  int32_t free_blocks() const { return blocks_.num_free(); }
  int32_t free_slots() const { return int32_t(free_slots_.size()); }
  const RunnerOptions& options() const { return opt_; }
  const ModelConfig& config() const { return exec_->config(); }
  Executor& executor() { return *exec_; }

 private:
  SequenceState& seq_ref(int32_t seq);
  /// Checks the work, takes its KV pages and builds the step's batch (no sequence advanced yet).
  ForwardBatch build_batch(const std::vector<Work>& work);
  /// Marks the work's tokens as computed.
  void advance(const std::vector<Work>& work);
  std::vector<float> logits_;  // the last step's logits (reused: no page faults per step)
  std::unique_ptr<Executor> exec_;  // declared before opt_: opt_ may take its page count
  RunnerOptions opt_;
  BlockAllocator blocks_;
  std::vector<int32_t> free_slots_;
  std::map<int32_t, SequenceState> seqs_;
  int32_t next_id_ = 0;
};

}  // namespace moefold
