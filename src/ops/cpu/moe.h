// Mixture-of-experts CPU reference: router softmax + top-k, the per-expert plan, SwiGLU experts, combine.
// Sources: transformers Qwen3_5MoeTopKRouter / Qwen3_5MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock;
// ../shared/design/qwen3_5_moe.md section 4.5.
#pragma once
#include <cstdint>
#include <vector>

namespace moefold::cpu {

/// Router: p = softmax(logits[t, :]) in fp32 over E experts; picks the k largest p (distinct experts,
/// ties broken by the lower expert index, NaN ranks below every number, expert 0 like any other);
/// weights = p of the picks, divided by their sum when `renormalize`. logits: [T, E];
/// ids: [T, k] int32; weights: [T, k] fp32.
/// Routing replay: when `replay` ([T, k]) is given, ids = replay (in its slot order) instead of the
/// top-k, and weights are the softmax probabilities of those experts (renormalised the same way);
/// throws Error if a replayed id is outside [0, E).
void router_topk(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize, int32_t* ids,
                 float* weights, const int32_t* replay = nullptr);

/// The per-expert plan: for each expert e, the (row, slot) pairs routed to it, grouped by expert in
/// ascending row order. offsets: [E + 1]; pairs[offsets[e] .. offsets[e+1]) hold row * k + slot.
/// Exactly T * k pairs; throws Error if an id is outside [0, E).
struct MoePlan {
  std::vector<int32_t> offsets, pairs;
};
MoePlan moe_plan(const int32_t* ids, int64_t T, int64_t k, int64_t E);

/// out[t, :] += sum_slots weights[t, s] * E_{ids[t, s]}(x[t, :]), E_e(x) = down_e(silu(gate_e x) * up_e x).
/// x, out: [T, H]; gate_up: [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up); down: [E, H, I]. The combine
/// accumulates in fp32 in slot order. round_bf16: round each expert's SwiGLU activation and output to
/// bf16 (the ideal bf16 chain of the GPU kernels). fp8_act: quantise each pair's x row before gate_up
/// and its activation (after any bf16 rounding) before down per 128 columns
/// (fp8_fake_quantize_activations): the W8A8 chain of the GPU's FP8 prefill experts.
void moe_experts(const float* x, const float* gate_up, const float* down, const int32_t* ids, const float* weights,
                 float* out, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, bool round_bf16 = false,
                 bool fp8_act = false);

}  // namespace moefold::cpu
