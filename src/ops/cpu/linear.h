// Dense projections on the CPU through OpenBLAS (fp32).
#pragma once
#include <cstdint>

namespace moefold::cpu {

/// y[T, out] = x[T, in] . W[out, in]^T (+ b[out] if b != nullptr). Row-major, fp32, sgemm over fixed
/// 16-row tiles with the tile as the B operand, OpenBLAS single-threaded: each row's bits are
/// independent of T, of the other rows and of its place among them, whichever kernels OpenBLAS picks
/// for the CPU (batch invariance, which the prefix cache's resumed == cold guarantee needs).
void linear(const float* x, const float* w, const float* b, float* y, int64_t T, int64_t in, int64_t out);

/// SwiGLU on a fused [T, 2I] row of [gate | up]: y[T, I] = silu(gate) * up.
void swiglu(const float* gate_up, float* y, int64_t T, int64_t I);

/// Numerically stable silu(x) = x * sigmoid(x) and sigmoid(x).
float silu(float x);
float sigmoid(float x);

}  // namespace moefold::cpu
