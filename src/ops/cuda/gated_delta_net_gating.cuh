// Device helpers shared by the Gated DeltaNet kernels: the per-token gates of gated_delta_net.h,
// g = -exp(A_log) * softplus(a + dt_bias) (softplus threshold 20) and beta = sigmoid(b), in fp32.
#pragma once
#include <cuda_bf16.h>

namespace moefold::cuda::gdn {

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float sigmoid_f(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

/// Log-decay g and beta from the raw logits a, b of one token and value head (A_log, dt_bias of the head).
__device__ __forceinline__ void gates(float a, float b, float A_log, float dt_bias, float& g, float& beta) {
  g = -expf(A_log) * softplus_f(a + dt_bias);
  beta = sigmoid_f(b);
}

}  // namespace moefold::cuda::gdn
