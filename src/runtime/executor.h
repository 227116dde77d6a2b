// Executor: runs the model's forward for one ForwardBatch on one device and owns that device's KV
// pages and DeltaNet state slots. The CPU executor is the reference; the CUDA executor
// (src/models/cuda/) computes the same function in bf16 on a GPU.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "runtime/forward_batch.h"
#include "runtime/routed_experts.h"

namespace moefold {

class Model;

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
  /// One step: writes K/V of every row into the pages named by the block tables, advances each
  /// sequence's state slot, and returns fp32 logits [batch.logits_rows.size(), vocab].
  virtual void forward(const ForwardBatch& batch, std::vector<float>& logits) = 0;
  /// Routing capture / replay for later forwards (runtime/routed_experts.h); {} turns both off.
  virtual void set_routing(RoutingControl routing) = 0;
};

/// The CPU reference executor over `model` with `num_blocks` pages of `block_size` tokens and
/// `num_slots` DeltaNet state slots. `model` must outlive it.
std::unique_ptr<Executor> make_cpu_executor(const Model& model, int32_t num_blocks, int32_t block_size,
                                            int32_t num_slots);

}  // namespace moefold
