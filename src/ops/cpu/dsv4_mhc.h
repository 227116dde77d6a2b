// DeepSeek-V4 manifold-constrained hyper-connections (mHC), fp32 reference. The residual is hc
// parallel streams X [hc, H] per token. Source: transformers 5.17 DeepseekV4HyperConnection /
// DeepseekV4HyperHead. With flat = X / rms(X) over all hc*H values (no weight) and m = fn . flat:
//   pre_j  = sigmoid(m_j scale0 + base_j) + eps                        (collapse weights)
//   post_j = 2 sigmoid(m_{hc+j} scale1 + base_{hc+j})                  (where the block output goes)
//   comb   = softmax_rows(m_{2hc..} scale2 + base_{2hc..}) + eps, then columns normalised once and
//            (iters - 1) rounds of rows then columns (Sinkhorn-Knopp; each sum gets + eps)
//   collapsed = sum_j pre_j X_j;  X'_k = post_k out + sum_j comb[j, k] X_j.
#pragma once
#include <cstdint>

namespace moefold::cpu {

/// For T tokens: X [T, hc, H], fn [(2 + hc) hc, hc H], base [(2 + hc) hc], scale [3]. Writes
/// pre [T, hc], post [T, hc], comb [T, hc, hc] (row j, column k) and collapsed [T, H].
void mhc_mix(const float* X, const float* fn, const float* base, const float* scale, int64_t T, int64_t hc,
             int64_t H, int64_t iters, float hc_eps, float norm_eps, float* pre, float* post, float* comb,
             float* collapsed);

/// X [T, hc, H] <- post_k out + sum_j comb[j, k] X_j for every token (out [T, H]).
void mhc_expand(float* X, const float* out, const float* post, const float* comb, int64_t T, int64_t hc, int64_t H);

/// The final collapse (HyperHead): y [T, H] = sum_j (sigmoid(scale (fn . flat)_j + base_j) + eps) X_j,
/// fn [hc, hc H], base [hc], scale [1].
void mhc_head(const float* X, const float* fn, const float* base, const float* scale, int64_t T, int64_t hc,
              int64_t H, float hc_eps, float norm_eps, float* y);

}  // namespace moefold::cpu
