// RMSNorm variants (fp32). Source: transformers Qwen3_5MoeRMSNorm (zero-centred, x_hat * (1 + w)),
// LlamaRMSNorm / Qwen3RMSNorm (x_hat * w), Qwen3_5MoeRMSNormGated (w * x_hat * silu(z)).
#pragma once
#include <cstdint>

namespace moefold::cpu {

enum class NormKind { Plain, ZeroCentred };

/// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * (w or 1 + w), for rows r < rows, each of `dim`.
/// x and y may alias.
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps, NormKind kind);

/// Gated RMSNorm of the DeltaNet output: y = w * (x / sqrt(mean(x^2) + eps)) * silu(z), per row of
/// `dim` (one value head). x, z, y: [rows, dim]; w: [dim] (plain scale).
void gated_rms_norm(const float* x, const float* z, const float* w, float* y, int64_t rows, int64_t dim, float eps);

/// LayerNorm (torch.nn.LayerNorm): y = (x - mean) / sqrt(var + eps) * w + b per row of `dim`, var the
/// biased variance; statistics in double. b may be null. x and y may alias.
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t dim, float eps);

}  // namespace moefold::cpu
