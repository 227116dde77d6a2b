// Gated RMSNorm of the Gated DeltaNet output on the GPU: per row of `dim` (one value head),
// y = w * (x / sqrt(mean(x^2) + eps)) * silu(z), fp32 math from bf16 inputs, one rounding.
// Math: ops/cpu/norm.h gated_rms_norm (transformers Qwen3_5MoeRMSNormGated, norm before gate).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moefold::cuda {

/// x, y: bf16 [max_tokens, heads, dim] dense (y may alias x); z: the same per token, z_stride elements
/// between tokens (0 = heads * dim; e.g. z read in place from a fused projection's output); w: bf16
/// [dim]. live_tokens: device count of live tokens (rows of `heads` norm rows each) or nullptr for all;
/// rows past it are neither read nor written. dim <= 1024. Throws moefold::Error on bad arguments or a
/// launch error.
void gated_rms_norm(const __nv_bfloat16* x, const __nv_bfloat16* z, const __nv_bfloat16* w, __nv_bfloat16* y,
                    int64_t max_tokens, int64_t heads, int64_t dim, float eps, const int32_t* live_tokens,
                    cudaStream_t stream, int64_t z_stride = 0);

}  // namespace moefold::cuda
