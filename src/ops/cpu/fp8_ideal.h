// The ideal quantised chain: what block-scaled FP8 arithmetic computes with no error of its own, in
// fp64, for probing FP8 kernels and models (moefold probe, the FP8 contract tests). The weights are the
// quantised ones (Fp8Weight: e4m3 values times their 128 x 128 block scales, exact in fp64). With
// `act_quant` the activations are quantised as the FP8 tensor-core path does, per token and 128-column
// block (1 x 128): s = max |x[t, block]| / 448 (fp32), x8 = e4m3(x / s); without it they are used as
// given (the W8A16 decode kernels). Every product and sum is fp64, nothing is rounded in between.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/fp8_block.h"

namespace moefold::cpu {

/// x [T, K] quantised per token and 128-column block: returns the dequantised values x8 * s (fp64-exact
/// as doubles), the quantisation the FP8 GEMM's A operand sees.
std::vector<double> fp8_quantize_activations(const float* x, int64_t T, int64_t K);

/// y[t, n] = sum_k W[n, k] * a[t, k] in fp64, W = w's quantised values ([N = w.rows, K = w.cols]),
/// a = x or its 1 x 128 quantisation (act_quant). x: [T, K]. Returns [T, N].
std::vector<double> fp8_linear_ideal(const float* x, int64_t T, const Fp8Weight& w, bool act_quant);

/// The stages of one routed MoE layer in the ideal chain, for given routing (ids, weights [T, k]):
/// act[t * k + s, :] = silu(g) * u (fp64) with [g | u] = gate_up_e(x[t]) (act_quant: x quantised 1 x 128);
/// y[t * k + s, :] = down_e(act) (act_quant: act quantised 1 x 128); out[t, :] = sum_s weights[t, s] *
/// y[t * k + s, :] in slot order. gate_up: [E * 2I, H] rows (expert e's gate rows e*2I .. e*2I+I-1,
/// then its up rows); down: [E * H, I]. An id outside [0, E) throws Error.
struct MoeIdealStages {
  std::vector<double> act, y, out;  ///< [T * k, I], [T * k, H], [T, H]
};
MoeIdealStages moe_fp8_ideal(const float* x, int64_t T, const int32_t* ids, const float* weights, int64_t k,
                             const Fp8Weight& gate_up, const Fp8Weight& down, int64_t E, int64_t H, int64_t I,
                             bool act_quant);

/// ||a - b|| / ||b|| over n elements (fp64); inf when b is all zero and a is not, NaN if any is NaN.
double rel_err(const float* a, const double* b, size_t n);
double rel_err(const double* a, const double* b, size_t n);

}  // namespace moefold::cpu
