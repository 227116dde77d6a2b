// The norm and RoPE kernels of main at e958840 (one warp per norm row, two passes; RoPE with its table
// built before the loads), kept verbatim in the test binary as the A of the A/B timings and as the
// bitwise reference of the RoPE rewrite (whose per-element math is unchanged).
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include "core/error.h"
#include "cuda/row_norm_test/legacy_kernels.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/row_norm.cuh"  // dispatch_vec

namespace moefold::test::legacy {
using namespace moefold::cuda;
using namespace moefold::cuda::detail;
namespace {

constexpr int kRowsPerBlock = 4;  // warps per norm block
constexpr int kMaxHalf = 512;

template <int V>
__global__ void rms_norm_kernel(const bf16* x, const bf16* __restrict__ w, bf16* y, int64_t max_rows,
                                int64_t heads, int64_t ts, int64_t hs, int64_t dim, float eps, bool zero_centred,
                                const int32_t* live) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int64_t t = r / heads, h = r % heads;
  if (t >= live_count(live, max_rows)) return;
  const int64_t off = t * ts + h * hs;
  const bf16* xr = x + off;
  float ss = 0.0f;
  for (int64_t i = int64_t(lane) * V; i < dim; i += 32 * V) {
    float f[V];
    load_bf16<V>(xr + i, f);
#pragma unroll
    for (int j = 0; j < V; ++j) ss += f[j] * f[j];
  }
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / float(dim) + eps);
  bf16* yr = y + off;
  for (int64_t i = int64_t(lane) * V; i < dim; i += 32 * V) {
    float f[V], g[V];
    load_bf16<V>(xr + i, f);
    load_bf16<V>(w + i, g);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = f[j] * inv * (zero_centred ? 1.0f + g[j] : g[j]);
    store_bf16<V>(yr + i, f);
  }
}

template <int V>
__global__ void add_rms_norm_kernel(bf16* h, const bf16* __restrict__ y, const bf16* __restrict__ w,
                                    bf16* __restrict__ x, int64_t max_rows, int64_t dim, float eps, bool zero_centred,
                                    const int32_t* live) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (t >= live_count(live, max_rows)) return;
  bf16* hr = h + t * dim;
  const bf16* yr = y + t * dim;
  float ss = 0.0f;
  for (int64_t i = int64_t(lane) * V; i < dim; i += 32 * V) {
    float a[V], b[V];
    load_bf16<V>(hr + i, a);
    load_bf16<V>(yr + i, b);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      a[j] = __bfloat162float(__float2bfloat16_rn(a[j] + b[j]));  // the rounded residual
      ss += a[j] * a[j];
    }
    store_bf16<V>(hr + i, a);
  }
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / float(dim) + eps);
  bf16* xr = x + t * dim;
  for (int64_t i = int64_t(lane) * V; i < dim; i += 32 * V) {
    float f[V], g[V];
    load_bf16<V>(hr + i, f);  // this lane's own writes above
    load_bf16<V>(w + i, g);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = f[j] * inv * (zero_centred ? 1.0f + g[j] : g[j]);
    store_bf16<V>(xr + i, f);
  }
}

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

__global__ void rope_kernel(bf16* q, int64_t qh, int64_t qts, int64_t qhs, bf16* k, int64_t kh, int64_t kts,
                            int64_t khs, const int32_t* __restrict__ positions, int64_t max_rows, int half,
                            const double* __restrict__ inv_freq, const int32_t* live) {
  pdl_begin();
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  const double pos = double(positions[t]);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    double s, c;
    sincos(pos * inv_freq[j], &s, &c);
    cs[j] = float(c);
    sn[j] = float(s);
  }
  __syncthreads();
  const int64_t nq = qh * half, total = nq + (k ? kh * half : 0);
  for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
    bf16* base;
    int j;
    if (e < nq) {
      base = q + t * qts + (e / half) * qhs;
      j = int(e % half);
    } else {
      base = k + t * kts + ((e - nq) / half) * khs;
      j = int((e - nq) % half);
    }
    const float lo = __bfloat162float(base[j]), hi = __bfloat162float(base[j + half]);
    base[j] = __float2bfloat16_rn(lo * cs[j] - hi * sn[j]);
    base[j + half] = __float2bfloat16_rn(hi * cs[j] + lo * sn[j]);
  }
}

}  // namespace

void rms_norm(const bf16* x, const bf16* w, bf16* y, int64_t max_rows, int64_t dim, float eps, bool zero_centred,
              const int32_t* live_rows, cudaStream_t stream, cuda::HeadRows rows) {
  const int64_t heads = rows.heads;
  const int64_t hs = rows.head_stride ? rows.head_stride : dim;
  const int64_t ts = rows.token_stride ? rows.token_stride : heads * hs;
  if (max_rows == 0) return;
  const int64_t nrows = max_rows * heads;
  dispatch_vec(vec_width(dim, {x, y, w}, {hs, ts}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    launch_pdl(rms_norm_kernel<V>, dim3(ceil_div_u(nrows, kRowsPerBlock)), dim3(32 * kRowsPerBlock), 0, stream, x, w,
               y, max_rows, heads, ts, hs, dim, eps, zero_centred, live_rows);
  });
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
}

void add_rms_norm(bf16* h, const bf16* y, const bf16* w, bf16* x, int64_t max_rows, int64_t dim, float eps,
                  bool zero_centred, const int32_t* live_rows, cudaStream_t stream) {
  if (max_rows == 0) return;
  dispatch_vec(vec_width(dim, {h, y, w, x}, {}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    launch_pdl(add_rms_norm_kernel<V>, dim3(ceil_div_u(max_rows, kRowsPerBlock)), dim3(32 * kRowsPerBlock), 0,
               stream, h, y, w, x, max_rows, dim, eps, zero_centred, live_rows);
  });
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
}

void gated_rms_norm(const bf16* x, const bf16* z, const bf16* w, bf16* y, int64_t max_tokens, int64_t heads,
                    int64_t dim, float eps, const int32_t* live_tokens, cudaStream_t stream, int64_t z_stride) {
  if (z_stride == 0) z_stride = heads * dim;
  if (max_tokens == 0) return;
  const int warps = 8;
  const int64_t rows = max_tokens * heads;
  launch_pdl(gated_rms_norm_kernel, dim3(unsigned((rows + warps - 1) / warps)), dim3(warps * 32), 0, stream, x, z, w,
             y, max_tokens, heads, int(dim), eps, live_tokens, z_stride);
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
}

void apply_rope(bf16* q, cuda::HeadRows q_rows, bf16* k, cuda::HeadRows k_rows, const int32_t* positions,
                int64_t max_rows, int64_t head_dim, const cuda::RopeFreqs& freqs, const int32_t* live_rows,
                cudaStream_t stream) {
  auto resolve = [&](cuda::HeadRows r, int64_t& hs, int64_t& ts) {
    hs = r.head_stride ? r.head_stride : head_dim;
    ts = r.token_stride ? r.token_stride : r.heads * hs;
  };
  int64_t qhs, qts, khs = 0, kts = 0;
  resolve(q_rows, qhs, qts);
  if (k) resolve(k_rows, khs, kts);
  if (max_rows == 0) return;
  const int half = int(freqs.rotary_dim / 2);
  const int64_t pairs = (q_rows.heads + (k ? k_rows.heads : 0)) * half;
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (pairs + 31) / 32 * 32)));
  launch_pdl(rope_kernel, dim3(unsigned(max_rows)), dim3(threads), 0, stream, q, q_rows.heads, qts, qhs, k,
             k ? k_rows.heads : 0, kts, khs, positions, max_rows, half, freqs.inv_freq.data(), live_rows);
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moefold::test::legacy
