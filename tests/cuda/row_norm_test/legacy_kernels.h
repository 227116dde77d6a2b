// main's norm and RoPE kernels at e958840 (legacy_kernels.cu), with the launch signatures of today's
// public functions (no profiling scope, no precondition checks): the A of row_norm_test's A/B timings
// and the bitwise reference of the RoPE rewrite. Test-only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/elementwise.h"
#include "ops/cuda/rope.h"

namespace moefold::test::legacy {

using bf16 = __nv_bfloat16;

void rms_norm(const bf16* x, const bf16* w, bf16* y, int64_t max_rows, int64_t dim, float eps, bool zero_centred,
              const int32_t* live_rows, cudaStream_t stream, cuda::HeadRows rows = {});
void add_rms_norm(bf16* h, const bf16* y, const bf16* w, bf16* x, int64_t max_rows, int64_t dim, float eps,
                  bool zero_centred, const int32_t* live_rows, cudaStream_t stream);
void gated_rms_norm(const bf16* x, const bf16* z, const bf16* w, bf16* y, int64_t max_tokens, int64_t heads,
                    int64_t dim, float eps, const int32_t* live_tokens, cudaStream_t stream, int64_t z_stride = 0);
void apply_rope(bf16* q, cuda::HeadRows q_rows, bf16* k, cuda::HeadRows k_rows, const int32_t* positions,
                int64_t max_rows, int64_t head_dim, const cuda::RopeFreqs& freqs, const int32_t* live_rows,
                cudaStream_t stream);

}  // namespace moefold::test::legacy
