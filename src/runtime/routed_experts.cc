#include "runtime/routed_experts.h"

#include <algorithm>

#include "core/error.h"

namespace moefold {

void prepare_routing(const RoutingControl& routing, const ModelConfig& c, int64_t rows) {
  const int64_t moe_layers = std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true);
  const size_t pairs = size_t(rows * c.num_experts_per_tok);
  if (routing.replay) {
    const auto& r = routing.replay->layers;
    MOEFOLD_CHECK(r.size() == size_t(moe_layers) &&
                      std::all_of(r.begin(), r.end(), [&](const auto& v) { return v.size() == pairs; }),
                  "routing replay holds {} layers; this step needs {} MoE layers of {} rows x top-{}", r.size(),
                  moe_layers, rows, c.num_experts_per_tok);
    for (size_t i = 0; i < r.size(); ++i)
      for (size_t j = 0; j < pairs; ++j)
        MOEFOLD_CHECK(r[i][j] >= 0 && r[i][j] < c.num_experts,
                      "routing replay: expert id {} at MoE layer {}, row {} is outside [0, {})", r[i][j], i,
                      j / size_t(c.num_experts_per_tok), c.num_experts);
  }
  if (routing.capture) {
    routing.capture->top_k = int32_t(c.num_experts_per_tok);
    if (routing.capture != routing.replay) routing.capture->layers.assign(size_t(moe_layers), std::vector<int32_t>(pairs));
  }
}

}  // namespace moefold
