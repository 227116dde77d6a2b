// Gated DeltaNet (linear attention) CPU reference: causal depthwise conv with carried state, the gating,
// the token-by-token delta-rule recurrence and its chunked (UT-transform) form.
// Sources: Yang et al., "Gated Delta Networks" (arXiv:2412.06464); transformers modeling_qwen3_5_moe
// (torch_causal_conv1d_update, torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule);
// ../shared/design/qwen3_5_moe.md sections 4.4 and 5.
#pragma once
#include <cstdint>
#include <span>

namespace moefold::cpu {

/// Causal depthwise conv1d + SiLU over T new tokens of one sequence.
/// x, y: [T, C] (row stride C); w: [C, K] (w[c, K-1] multiplies the current token);
/// conv_state: [C, K-1], the previous K-1 inputs per channel, oldest first (zeros for a new sequence);
/// updated in place to the last K-1 inputs. y[t, c] = silu(sum_j w[c, j] * x_{t-K+1+j}[c]).
void causal_conv1d_silu(const float* x, const float* w, float* conv_state, float* y, int64_t T, int64_t C, int64_t K);

/// Gating from the raw projections: beta[t, h] = sigmoid(b[t, h]);
/// g[t, h] = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h]) (log-decay, <= 0). a, b, g, beta: [T, Hv].
void gdn_gating(const float* a, const float* b, const float* A_log, const float* dt_bias, float* g, float* beta,
                int64_t T, int64_t Hv);

struct GdnShape {
  int64_t num_k_heads, num_v_heads, k_dim, v_dim;  ///< value head h reads key/query head h / (Hv / Hk)
};

/// Token-by-token delta rule, fp32. q, k: [T, Hk, dk] (raw; L2-normalised here with eps 1e-6, q also
/// scaled by dk^-0.5); v: [T, Hv, dv]; g, beta: [T, Hv]; state: [Hv, dk, dv] read and updated in place.
/// Per token and value head: S = exp(g) S; d = beta (v - S^T k); S += k d^T; o = S^T q. out: [T, Hv, dv].
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                float* state, float* out, int64_t T, const GdnShape& s);

/// The same function computed chunk by chunk (chunk length `chunk`, default 64) with the UT transform:
/// within a chunk A = strictly-lower (beta k k^T) * decay, T = (I + A)^-1, U = T (beta v),
/// W = T (beta k exp(G)); across chunks V' = U - W S, O = (q exp(G)) S + (q k^T * decay) V',
/// S = exp(G_last) S + (k exp(G_last - G))^T V'. Equal to gated_delta_rule_recurrent up to rounding.
/// snapshots: (c, dst) pairs: the state as it is after chunk c (rows [0, chunk * (c + 1)); c < the
/// number of chunks) is copied to dst ([Hv, dk, dv]); bitwise the state a call over only those rows
/// leaves behind.
struct GdnStateSnapshot {
  int64_t chunk;
  float* dst;
};
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              float* state, float* out, int64_t T, const GdnShape& s, int64_t chunk = 64,
                              std::span<const GdnStateSnapshot> snapshots = {});

}  // namespace moefold::cpu
