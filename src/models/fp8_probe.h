// Stage probes of one routed-MoE layer with FP8 experts against the ideal quantised chain
// (ops/cpu/fp8_ideal.h), on the activations a real prompt produces (moefold probe). The chain under
// test (the CPU's fp32 path, or the GPU kernels through a MoeStageRunner) gets the layer's FFN input,
// rounded to bf16, and the CPU router's choice of experts (replayed on the GPU, so a top-k near-tie
// cannot make the stages incomparable); its three stages are compared with the ideal chain's:
//   gemms:    the SwiGLU activations after the gate_up GEMM, per pair
//   per_slot: each pair's expert output (down GEMM)
//   combine:  the routing-weighted sum over the slots (fp32 in the engines, fp64 here)
//   layer:    the layer's output hidden state (residual + routed + shared expert), the routed part
//             being the tested / ideal one
// as ||tested - ideal|| / ||ideal||. For scale, the same stages of the ideal chain with FP8 (1 x 128)
// activations against the W8A16 one: the rounding an FP8-activation chain adds by itself; and the
// tested chain against that W8A8 ideal chain (the reference of a W8A8 chain under test: the GPU's
// prefill experts, or the CPU's with activations quantised).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/model.h"

namespace moefold {

/// Outputs of the routed experts of one MoE layer: act [T * k, I] and y [T * k, H] indexed by pair id
/// (row * k + slot), out [T, H] (routed experts only), weights [T, k] (the routing weights used).
struct MoeStageOutputs {
  std::vector<float> act, y, out, weights;
};

/// Runs the routed experts under test on x [T, H] (bf16 values) with the given expert ids [T, k]
/// (weights: the CPU router's [T, k], which a runner may recompute from the same logits).
using MoeStageRunner = std::function<MoeStageOutputs(const float* x, int64_t T, const std::vector<int32_t>& ids,
                                                     const std::vector<float>& weights, const MoeWeights& m,
                                                     const ModelConfig& cfg)>;

/// The CPU's own chain: fp32 with the dequantised weights, as Model::moe computes it.
MoeStageOutputs moe_stages_cpu(const float* x, int64_t T, const std::vector<int32_t>& ids,
                               const std::vector<float>& weights, const MoeWeights& m, const ModelConfig& cfg);
/// The same with each pair's x row and activation quantised per 128 columns before their GEMMs
/// (fp8_fake_quantize_activations): the CPU's W8A8 chain (Model::set_emulate_fp8_activations).
MoeStageOutputs moe_stages_cpu_w8a8(const float* x, int64_t T, const std::vector<int32_t>& ids,
                                    const std::vector<float>& weights, const MoeWeights& m, const ModelConfig& cfg);

struct ProbeReport {
  int layer = 0;
  int64_t tokens = 0;
  std::string tested;                       ///< "cpu" or "cuda"
  double gemms = 0, per_slot = 0, combine = 0, layer_out = 0;  ///< tested vs the ideal W8A16 chain
  double a8_gemms = 0, a8_per_slot = 0, a8_combine = 0;         ///< ideal W8A8 (1 x 128) vs ideal W8A16
  double vs_a8_gemms = 0, vs_a8_per_slot = 0, vs_a8_combine = 0;  ///< tested vs the ideal W8A8 chain
};

/// Probes MoE layer `layer` (-1: the first MoE layer) of `model` on `prompt`. Throws Error when the
/// layer is not an MoE layer or its experts are not FP8 (load with --quantization fp8 or an FP8
/// checkpoint).
ProbeReport probe_moe_layer(const Model& model, const std::vector<int32_t>& prompt, int layer,
                            const MoeStageRunner& tested, const std::string& tested_name);

}  // namespace moefold
