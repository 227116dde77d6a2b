// The GPU's FP8 routed experts (ops/cuda/moe_fp8.h) as a MoeStageRunner for moefold probe
// (models/fp8_probe.h): the layer's FP8 weights uploaded, the router run on the GPU with the given ids
// replayed, and the stages (act in pair order, y, out) downloaded.
#pragma once
#include "models/fp8_probe.h"

namespace moefold {

/// See the header (the W8A16 decode-size chain, moe_fp8_forward: 1 .. 256 tokens). Throws Error without
/// a GPU, for experts that are not FP8 or shapes moe_fp8 rejects.
MoeStageOutputs moe_stages_gpu(const float* x, int64_t T, const std::vector<int32_t>& ids,
                               const std::vector<float>& weights, const MoeWeights& m, const ModelConfig& cfg);

/// The W8A8 prefill chain (moe_fp8_prefill_forward) at any token count; H and I multiples of 128.
MoeStageOutputs moe_stages_gpu_w8a8(const float* x, int64_t T, const std::vector<int32_t>& ids,
                                    const std::vector<float>& weights, const MoeWeights& m, const ModelConfig& cfg);

/// Whether the CUDA executor runs `cfg`'s FP8 routed experts as W8A8 in a step of `rows` rows (more
/// than kMoeFp8MaxRows and a supported shape, MOEFOLD_MOE_FP8_PREFILL not "dequant").
bool cuda_step_runs_w8a8_experts(const ModelConfig& cfg, int64_t rows);

}  // namespace moefold
