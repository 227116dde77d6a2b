// Gated RMSNorm rows (one value head of one token each) spread over threads as row_norm.cuh says:
// dim / V threads per row (dim <= 1024: one vector per thread, kept in registers), several rows per
// block, the sum of squares in the fixed order of row_norm.cuh (batch invariant). w is loaded before
// the live count is read; x and z after it. Rows of tokens >= *live_tokens are never read or written.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include "core/error.h"
#include "ops/cuda/gated_rms_norm.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/row_norm.cuh"
#include "ops/cuda/silu_approx.cuh"

namespace moefold::cuda {
using namespace detail;
namespace {

template <int V>
__global__ void __launch_bounds__(1024) gated_rms_norm_kernel(const __nv_bfloat16* x, const __nv_bfloat16* z,
                                                              const __nv_bfloat16* __restrict__ w, __nv_bfloat16* y,
                                                              int64_t max_tokens, int64_t heads, int dim, int tpr,
                                                              float eps, const int32_t* live_tokens,
                                                              int64_t z_stride) {
  pdl_begin();
  __shared__ float red[32];
  const int n = dim / V, j = int(threadIdx.x) % tpr;
  const int64_t r0 = int64_t(blockIdx.x) * (blockDim.x / tpr), row = r0 + threadIdx.x / tpr;
  const bool in_row = j < n;
  float g[V], f[V], zz[V];
  if (in_row) load_bf16<V>(w + int64_t(j) * V, g);
  const int64_t nlive = live_count(live_tokens, max_tokens) * heads;
  if (r0 >= nlive) return;  // the whole block is padding
  const bool ok = row < nlive && in_row;
  float ss = 0.0f;
  const int64_t xo = row * dim + int64_t(j) * V, zo = (row / heads) * z_stride + (row % heads) * dim + int64_t(j) * V;
  if (ok) {
    load_bf16<V>(x + xo, f);
    load_bf16<V>(z + zo, zz);
    ss = add_squares<V>(ss, f);
  }
  ss = row_sum(ss, tpr, red);
  if (!ok) return;
  const float inv = rsqrtf(ss / float(dim) + eps);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    f[e] = g[e] * (f[e] * inv) * silu_approx(zz[e]);
  }
  store_bf16<V>(y + xo, f);
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
  const int64_t rows = max_tokens * heads;
  MOEFOLD_CHECK(rows < (int64_t(1) << 31), "gated_rms_norm: {} rows too many", rows);
  LaunchScope launch(kGatedRmsNorm, stream, [&] {  // x, z read, y written; w
    return prof::Work{double(work_rows(max_tokens, live_tokens)) * double(heads * dim) * 6 + double(dim) * 2, 0};
  });
  dispatch_vec(vec_width(dim, {x, z, w, y}, {z_stride}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const RowGeom g = row_geom(dim, V);  // dim <= 1024: one vector per thread (g.k == 1)
    launch_pdl(gated_rms_norm_kernel<V>, dim3(ceil_div_u(rows, g.rows_per_block)), dim3(g.tpr * g.rows_per_block), 0,
               stream, x, z, w, y, max_tokens, heads, int(dim), g.tpr, eps, live_tokens, z_stride);
  });
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
