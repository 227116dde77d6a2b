// One warp per norm row (one value head of one token): sum of squares by warp shuffle, then the
// gated output. Rows of tokens >= *live_tokens return before touching memory.
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gated_rms_norm.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {

namespace {

__global__ void gated_rms_norm_kernel(const __nv_bfloat16* x, const __nv_bfloat16* z, const __nv_bfloat16* w,
                                      __nv_bfloat16* y, int64_t max_tokens, int64_t heads, int dim, float eps,
                                      const int32_t* live_tokens, int64_t z_stride) {
  pdl_begin();
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  int64_t live = max_tokens;
  if (live_tokens) {
    const int64_t n = *live_tokens;
    live = n < 0 ? 0 : (n < max_tokens ? n : max_tokens);
  }
  if (row >= live * heads) return;
  const __nv_bfloat16* xr = x + row * dim;
  const __nv_bfloat16* zr = z + (row / heads) * z_stride + (row % heads) * dim;
  float ss = 0;
  for (int i = lane; i < dim; i += 32) {
    const float v = __bfloat162float(xr[i]);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = rsqrtf(ss / float(dim) + eps);
  __nv_bfloat16* yr = y + row * dim;
  for (int i = lane; i < dim; i += 32) {
    const float zz = __bfloat162float(zr[i]);
    const float silu = zz / (1.0f + __expf(-zz));
    yr[i] = __float2bfloat16(__bfloat162float(w[i]) * (__bfloat162float(xr[i]) * inv) * silu);
  }
}

const prof::Kernel kGatedRmsNorm{"gated_rms_norm_kernel", prof::Category::NormRope};

}  // namespace

void gated_rms_norm(const __nv_bfloat16* x, const __nv_bfloat16* z, const __nv_bfloat16* w, __nv_bfloat16* y,
                    int64_t max_tokens, int64_t heads, int64_t dim, float eps, const int32_t* live_tokens,
                    cudaStream_t stream, int64_t z_stride) {
  MOEFOLD_CHECK(dim > 0 && dim <= 1024 && heads > 0 && max_tokens >= 0, "gated_rms_norm: bad shape");
  if (z_stride == 0) z_stride = heads * dim;
  MOEFOLD_CHECK(z_stride >= heads * dim, "gated_rms_norm: z_stride {} < heads * dim", z_stride);
  if (max_tokens == 0) return;
  const int warps = 8;
  const int64_t rows = max_tokens * heads;
  LaunchScope launch(kGatedRmsNorm, stream, [&] {  // x, z read, y written; w
    return prof::Work{double(work_rows(max_tokens, live_tokens)) * double(heads * dim) * 6 + double(dim) * 2, 0};
  });
  launch_pdl(gated_rms_norm_kernel, dim3(unsigned((rows + warps - 1) / warps)), dim3(warps * 32), 0, stream, 
      x, z, w, y, max_tokens, heads, int(dim), eps, live_tokens, z_stride);
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moefold::cuda
