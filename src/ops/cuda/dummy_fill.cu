#include "ops/cuda/dummy_fill.h"

#include <algorithm>

#include "ops/cuda/cuda_check.h"

namespace moefold::cuda {

namespace {

__global__ void dummy_fill_kernel(DummyRecipe r, __nv_bfloat16* __restrict__ out, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16_rn(dummy_value(r, i));
}

}  // namespace

void dummy_fill_bf16(const DummyRecipe& recipe, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, int64_t(132) * 64);
  dummy_fill_kernel<<<unsigned(blocks), threads, 0, stream>>>(recipe, out, n);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
