// The GPU's FP8 routed experts (ops/cuda/moe_fp8.h) as a MoeStageRunner for moefold probe
// (models/fp8_probe.h): the layer's FP8 weights uploaded, the router run on the GPU with the given ids
// replayed, and the stages (act in pair order, y, out) downloaded.
#pragma once
#include "models/fp8_probe.h"

namespace moefold {

/// See the header. Throws Error without a GPU, for experts that are not FP8 or shapes moe_fp8 rejects.
MoeStageOutputs moe_stages_gpu(const float* x, int64_t T, const std::vector<int32_t>& ids,
                               const std::vector<float>& weights, const MoeWeights& m, const ModelConfig& cfg);

}  // namespace moefold
