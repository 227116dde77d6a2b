// Executor: runs the model's forward for one ForwardBatch on one device and owns that device's KV
// pages and DeltaNet state slots. The CPU executor is the reference; the CUDA executor
// (src/models/cuda/) computes the same function in bf16 on a GPU.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "runtime/forward_batch.h"
#include "runtime/kv_cache.h"
#include "runtime/routed_experts.h"
#include "runtime/sampler.h"

namespace moefold {

class Model;

/// How to sample one logits row of a step: the request's sampler (validated params + resolved seed)
/// and its history, which the penalties read; the draw index is output.size() (Sampler::sample).
/// sampler == nullptr: the row is not sampled (e.g. the last row of a partial prefill chunk).
/// The spans must stay valid for the duration of the forward_sample call.
struct RowSampling {
  const Sampler* sampler = nullptr;
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  /// Grammar bitmask of the row (runtime/grammar_constraint.h layout: bitmask_words(vocab) words,
  /// bit set = allowed); empty = unconstrained. Disallowed ids become -inf after masked_tokens and
  /// before the sampler (penalties, logprobs and sampling then see the masked row). The words may
  /// still be being written when forward_sample starts: it calls mask_ready (when set) after the
  /// forward and before reading them, so the host fills masks while the device runs the step.
  std::span<const uint32_t> token_bitmask = {};
  /// Blocks until token_bitmask is final (the same callable for every row of a step; idempotent).
  /// Throws what the mask computation threw; the executor then fails the rows with a bitmask.
  const std::function<void()>* mask_ready = nullptr;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const ModelConfig& config() const = 0;
  /// "cpu" or "cuda:N".
  virtual std::string device() const = 0;
  /// KV pages this executor holds (fixed at creation).
  virtual int32_t num_kv_blocks() const = 0;
  /// Zeroes DeltaNet state slot `slot` (a new sequence starts from the zero state).
  virtual void reset_slot(int32_t slot) = 0;
  /// DeltaNet state slots this executor holds (live sequences + prefix-cache snapshots).
  virtual int32_t num_state_slots() const = 0;
  /// Copies DeltaNet state slot `src` onto `dst` (conv + recurrent state of every linear-attention
  /// layer, bitwise; a prefix-cache restore or snapshot). Ordered with the executor's steps. Throws
  /// Error for a slot out of range.
  virtual void copy_slot(int32_t src, int32_t dst) = 0;
  /// Bytes of one DeltaNet state slot on the device (0 for a model without linear attention).
  virtual int64_t state_slot_bytes() const = 0;
  /// One step: writes K/V of every row into the pages named by the block tables, advances each
  /// sequence's state slot, and returns fp32 logits [batch.logits_rows.size(), vocab].
  virtual void forward(const ForwardBatch& batch, std::vector<float>& logits) = 0;
  /// One step as forward(), then one token per logits row: rows[i] samples logits row i
  /// (rows.size() == batch.logits_rows.size(), else moefold::Error), after mask_tokens(row,
  /// masked_tokens). out is resized to rows.size(); out[i] is what rows[i].sampler->sample() returns
  /// on the masked row (sampler.h: the CPU sampler is the definition), or, for a row whose sampling
  /// failed, token -1 with SampleResult::error set (the other rows are unaffected); a row with a null
  /// sampler gets a default SampleResult (token -1, no error). A failure of the forward itself throws.
  /// The default runs forward() into a host buffer it keeps and samples the rows on the host in
  /// parallel; a GPU executor overrides it to sample on the device and download only the results.
  virtual void forward_sample(const ForwardBatch& batch, std::span<const RowSampling> rows,
                              std::span<const int32_t> masked_tokens, std::vector<SampleResult>& out);
  /// Routing capture / replay for later forwards (runtime/routed_experts.h); {} turns both off.
  virtual void set_routing(RoutingControl routing) = 0;

 private:
  std::vector<float> sample_logits_;  // forward_sample's host logits (reused across steps)
};

/// The CPU reference executor over `model` with `num_blocks` pages of `block_size` tokens of
/// `kv_dtype` (--kv-cache-dtype, runtime/kv_cache.h; auto = fp32) and `num_slots` DeltaNet state slots
/// (live sequences and snapshots). `model` must outlive it. Throws Error for a dtype the model cannot
/// store (check_kv_cache_dtype).
std::unique_ptr<Executor> make_cpu_executor(const Model& model, int32_t num_blocks, int32_t block_size,
                                            int32_t num_slots, KvCacheDtype kv_dtype = KvCacheDtype::Auto);

}  // namespace moefold
