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
#include "runtime/prefix_cache.h"

namespace moefold {

struct RunnerOptions {
  int32_t num_blocks = 256;  ///< KV pages in the pool
  int32_t block_size = 16;   ///< tokens per page
  int32_t max_seqs = 8;      ///< DeltaNet state slots (concurrent sequences)
  /// Prefix caching (runtime/prefix_cache.h): add_sequence() resumes a prompt from the longest cached
  /// prefix it can restore (see add_sequence). Off by default here (callers that drive the runner
  /// directly expect num_computed == 0); the server and the CLI turn it on.
  bool enable_prefix_caching = false;
  /// DeltaNet state snapshots the cache keeps (slots beyond max_seqs in the executor's state pool).
  int32_t snapshot_slots = 0;
  /// Besides the last grid point of every prompt, a snapshot every this many prompt tokens (a
  /// multiple of the snapshot grid; 0: only at the end of prompts).
  int32_t snapshot_interval = 0;
  /// --kv-cache-dtype of the CPU executor the Model constructor makes (runtime/kv_cache.h).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;
};

/// The DeltaNet state slot bytes of `cfg` (conv state of conv_elem_bytes per element, fp32
/// recurrent state), i.e. the size of one prefix-cache snapshot; 0 without linear attention.
int64_t deltanet_slot_bytes(const ModelConfig& cfg, int64_t conv_elem_bytes);

struct SequenceState {
  std::vector<int32_t> tokens;  ///< prompt + generated tokens known so far
  int32_t num_computed = 0;     ///< tokens whose K/V and state are already in the cache
  std::vector<int32_t> blocks;  ///< KV page ids
  int32_t slot = -1;            ///< DeltaNet state slot
  int32_t prompt_len = 0;       ///< leading tokens computed as prompt rows (prefill); the rest decode rows
  int32_t num_cached = 0;       ///< tokens restored from the prefix cache at add_sequence
  std::vector<uint64_t> page_hashes;  ///< chain hash of every full page of the prompt (caching on)
  int32_t num_registered = 0;   ///< leading pages already offered to the prefix cache
};

class ModelRunner {
 public:
  /// Runs on the CPU reference executor over `model` (which must outlive the runner).
  ModelRunner(const Model& model, RunnerOptions opt);
  /// Runs on `executor`, whose pages and slots must match `opt` (opt.num_blocks <= 0: all of the
  /// executor's pages, e.g. a GPU executor that sized its KV cache from free memory).
  ModelRunner(std::unique_ptr<Executor> executor, RunnerOptions opt);

  /// Registers a sequence with its prompt; takes a state slot (zeroed). Throws Error when no slot is
  /// free or the prompt is empty. Returns its id. With prefix caching on, the sequence starts at the
  /// longest cached prefix of the prompt that every layer can restore and that leaves at least one
  /// token to compute: a multiple of the block size for a model without linear attention, else the
  /// largest multiple of snapshot_grid() whose pages and DeltaNet snapshot are both cached (the
  /// snapshot is copied into the sequence's slot). num_computed = num_cached = that prefix.
  /// prompt_len (default: all of `tokens`): the leading tokens that are prompt; the others (the
  /// generated tokens of a preempted request) are then fed back one per step as decode rows, so that
  /// they give the bits they gave when they were generated. Only prompt pages enter the cache.
  int32_t add_sequence(std::vector<int32_t> tokens, int32_t prompt_len = -1);

  /// What add_sequence(prompt) would restore now: `tokens` cached tokens, of which `idle_pages` pages
  /// are cached pages no sequence holds (they stop counting as free once taken). No side effects.
  struct PrefixMatch {
    int32_t tokens = 0;
    int32_t idle_pages = 0;
  };
  /// `more_tokens`: generated tokens follow the prompt (the whole prompt may then be restored).
  PrefixMatch match_prefix(std::span<const int32_t> prompt, bool more_tokens = false) const;
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
  /// Pages a new allocation can take: free pages plus cached pages no sequence holds.
  int32_t free_blocks() const { return cache_.num_free(); }
  bool prefix_caching() const { return opt_.enable_prefix_caching; }
  /// True when the model has linear-attention (DeltaNet) layers.
  bool hybrid() const { return hybrid_; }
  /// Token positions where a cached prefix can end: the block size, or for a hybrid model the least
  /// common multiple of the block size and the 64-token snapshot chunk.
  int32_t snapshot_grid() const { return grid_; }
  /// Prefill chunks of a hybrid model with caching on should end at multiples of this (64; else 1),
  /// so that state snapshots can be taken inside the chunked DeltaNet prefill.
  int32_t prefill_alignment() const { return opt_.enable_prefix_caching && hybrid_ ? kStateSnapshotChunk : 1; }
  /// The prefix cache's counters and gauges.
  PrefixCacheStats prefix_cache_stats() const { return cache_.stats(); }
  /// Drops every cached page and snapshot no sequence holds.
  void clear_prefix_cache() { cache_.clear_unused(); }
  int32_t free_slots() const { return int32_t(free_slots_.size()); }
  const RunnerOptions& options() const { return opt_; }
  const ModelConfig& config() const { return exec_->config(); }
  Executor& executor() { return *exec_; }

 private:
  SequenceState& seq_ref(int32_t seq);
  /// Checks the work, takes its KV pages and builds the step's batch (no sequence advanced yet).
  ForwardBatch build_batch(const std::vector<Work>& work);
  /// Marks the work's tokens as computed, then offers the newly full prompt pages and the step's
  /// snapshots to the prefix cache.
  void advance(const std::vector<Work>& work);
  /// Plans the DeltaNet snapshots of work item `i` (sequence s) into b.snapshots.
  void plan_snapshots(int32_t i, const SequenceState& s, int32_t num_tokens, ForwardBatch& b);
  /// Gives back the snapshot slots reserved for a step that failed.
  void cancel_pending();
  struct PendingSnapshot {
    int32_t slot;
    uint64_t key;
  };
  std::vector<PendingSnapshot> pending_;
  std::vector<float> logits_;  // the last step's logits (reused: no page faults per step)
  std::unique_ptr<Executor> exec_;  // declared before opt_: opt_ may take its page count
  RunnerOptions opt_;
  bool hybrid_ = false;
  int32_t grid_ = 1;
  PrefixCache cache_;
  std::vector<int32_t> free_slots_;
  std::map<int32_t, SequenceState> seqs_;
  int32_t next_id_ = 0;
};

}  // namespace moefold
