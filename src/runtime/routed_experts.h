// Routed experts of one forward step, for routing capture and replay: the experts every MoE layer
// chose for every row (capture), or the experts it must use instead of its own top-k (replay), as
// rollout routing replay in RL training and SGLang's return_routed_experts do. Replay pins routing so
// two backends (or two precisions) can be compared position by position without top-k near-ties
// flipping decisions.
#pragma once
#include <cstdint>
#include <vector>

#include "io/model_config.h"

namespace moefold {

struct RoutedExperts {
  int32_t top_k = 0;
  /// [MoE layer in model order][row * top_k + slot] expert ids, rows in ForwardBatch order, slots in
  /// the router's order (descending probability as chosen).
  std::vector<std::vector<int32_t>> layers;
};

/// What an executor does with routing on later forwards: record into `capture` (resized per step)
/// and/or use `replay` (must hold every MoE layer with the step's rows x top_k ids, each in
/// [0, num_experts); checked, Error). Both may name the same object. Both null: normal routing. The
/// pointed-to objects must outlive the forwards that use them.
struct RoutingControl {
  const RoutedExperts* replay = nullptr;
  RoutedExperts* capture = nullptr;
};

/// Before a step of `rows` rows of a model with config `c`: checks routing.replay (one list per MoE layer,
/// rows x top_k ids each in [0, num_experts); Error naming the first mismatch) and sizes routing.capture
/// for the step (a capture that is the replay itself keeps its contents: it already has the step's
/// shape and must still be read). Runs before any layer, so a rejected step changes no KV page or state.
void prepare_routing(const RoutingControl& routing, const ModelConfig& c, int64_t rows);

}  // namespace moefold
