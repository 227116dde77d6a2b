// Row-wise and elementwise kernels (see elementwise.h). Norm-type kernels spread each norm row over
// several threads (row_norm.cuh: up to 1024 per row, the row kept in registers, one pass, a reduction
// order fixed by the row width alone, so batch invariant); elementwise kernels give one block row per
// token. Padding rows (>= *live_rows) are never read or written.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include "core/error.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/row_norm.cuh"

#include <cstdlib>

namespace moefold::cuda {
using namespace detail;
namespace {

const prof::Kernel kEmbedding{"embedding_kernel", prof::Category::Glue};
const prof::Kernel kRmsNorm{"rms_norm_kernel", prof::Category::NormRope};
const prof::Kernel kAddRmsNorm{"add_rms_norm_kernel", prof::Category::NormRope};
const prof::Kernel kSwiglu{"swiglu_kernel", prof::Category::Other};
const prof::Kernel kGate{"gate_kernel", prof::Category::Other};
const prof::Kernel kResidual{"residual_kernel", prof::Category::Other};

// ---- embedding -------------------------------------------------------------------------------
template <int V>
__global__ void embedding_kernel(const bf16* __restrict__ table, int64_t vocab, int64_t hidden,
                                 const int32_t* __restrict__ ids, bf16* __restrict__ out, int64_t max_rows,
                                 const int32_t* live, int32_t* oob_flag) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && int64_t(id) < vocab;
  if (!ok && threadIdx.x == 0 && oob_flag) *oob_flag = 1;
  const bf16* src = table + (ok ? int64_t(id) : 0) * hidden;
  bf16* dst = out + t * hidden;
  for (int64_t i = int64_t(threadIdx.x) * V; i < hidden; i += int64_t(blockDim.x) * V) {
    float f[V];
    if (ok) {
      load_bf16<V>(src + i, f);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) f[j] = 0.0f;
    }
    store_bf16<V>(dst + i, f);
  }
}

// ---- RMSNorm ---------------------------------------------------------------------------------
// Rows spread over threads as row_norm.cuh says (K vectors per thread in registers, K = 0: loop form);
// with RT > 1 (K = 1 only) each thread also holds the same vector of RT rows (rows r0 + q * rows_per_block
// + group, q < RT: more loads in flight at large row counts; each row's arithmetic is unchanged).
// The weights are loaded before the live count is read (they do not depend on it), the row's values
// stay in registers between the reduction and the output, and a block whose first row is padding
// returns at once; inside a block every thread reaches the reductions (padding rows hold zeros).
template <int V, int K, int RT>
__global__ void __launch_bounds__(1024) rms_norm_kernel(const bf16* x, const bf16* __restrict__ w, bf16* y,
                                                        int64_t max_rows, int64_t heads, int64_t ts, int64_t hs,
                                                        int dim, int tpr, float eps, bool zero_centred,
                                                        const int32_t* live) {
  pdl_begin();
  __shared__ float red[RT][32];
  constexpr int KR = K ? K : 1;
  const int n = dim / V, j = int(threadIdx.x) % tpr, rpb = int(blockDim.x) / tpr;
  const int64_t r0 = int64_t(blockIdx.x) * rpb * RT, rg = r0 + threadIdx.x / tpr;
  float g[KR][V];
  if constexpr (K > 0) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (j + k * tpr < n) load_bf16<V>(w + int64_t(j + k * tpr) * V, g[k]);
  }
  const int64_t nlive = live_count(live, max_rows) * heads;
  if (r0 >= nlive) return;  // the whole block is padding
  if constexpr (K > 0) {
    float f[RT][K][V], ss[RT];
    int64_t off[RT];
#pragma unroll
    for (int q = 0; q < RT; ++q) {
      const int64_t r = rg + int64_t(q) * rpb;
      off[q] = r < nlive ? (r / heads) * ts + (r % heads) * hs : -1;
      ss[q] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (off[q] >= 0 && j + k * tpr < n) {
          load_bf16<V>(x + off[q] + int64_t(j + k * tpr) * V, f[q][k]);
          ss[q] = add_squares<V>(ss[q], f[q][k]);
        }
    }
#pragma unroll
    for (int q = 0; q < RT; ++q) ss[q] = row_sum(ss[q], tpr, red[q]);
#pragma unroll
    for (int q = 0; q < RT; ++q) {
      if (off[q] < 0) continue;
      const float inv = rsqrtf(ss[q] / float(dim) + eps);
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (j + k * tpr < n) {
#pragma unroll
          for (int e = 0; e < V; ++e)
            f[q][k][e] = f[q][k][e] * inv * (zero_centred ? 1.0f + g[k][e] : g[k][e]);
          store_bf16<V>(y + off[q] + int64_t(j + k * tpr) * V, f[q][k]);
        }
    }
  } else {  // one row per block (tpr = 1024), two passes over global memory
    const bool ok = rg < nlive;
    const int64_t off = ok ? (rg / heads) * ts + (rg % heads) * hs : 0;
    const bf16* xr = x + off;
    float ss = 0.0f, f[V];
    if (ok)
      for (int i = j; i < n; i += tpr) {
        load_bf16<V>(xr + int64_t(i) * V, f);
        ss = add_squares<V>(ss, f);
      }
    ss = row_sum(ss, tpr, red[0]);
    if (!ok) return;
    const float inv = rsqrtf(ss / float(dim) + eps);
    bf16* yr = y + off;
    for (int i = j; i < n; i += tpr) {
      load_bf16<V>(xr + int64_t(i) * V, f);  // this thread's own elements (x and y may alias)
      load_bf16<V>(w + int64_t(i) * V, g[0]);
#pragma unroll
      for (int e = 0; e < V; ++e) f[e] = f[e] * inv * (zero_centred ? 1.0f + g[0][e] : g[0][e]);
      store_bf16<V>(yr + int64_t(i) * V, f);
    }
  }
}

// h = bf16(h + y) stored at once (the rounded residual), its squares summed from the rounded values,
// then x from the registers (K > 0) or from a re-read of this thread's own h elements (K = 0). Rows per
// thread RT as rms_norm_kernel.
template <int V, int K, int RT>
__global__ void __launch_bounds__(1024) add_rms_norm_kernel(bf16* h, const bf16* __restrict__ y,
                                                            const bf16* __restrict__ w, bf16* __restrict__ x,
                                                            int64_t max_rows, int dim, int tpr, float eps,
                                                            bool zero_centred, const int32_t* live) {
  pdl_begin();
  __shared__ float red[RT][32];
  constexpr int KR = K ? K : 1;
  const int n = dim / V, j = int(threadIdx.x) % tpr, rpb = int(blockDim.x) / tpr;
  const int64_t r0 = int64_t(blockIdx.x) * rpb * RT, rg = r0 + threadIdx.x / tpr;
  float g[KR][V];
  if constexpr (K > 0) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (j + k * tpr < n) load_bf16<V>(w + int64_t(j + k * tpr) * V, g[k]);
  }
  const int64_t nlive = live_count(live, max_rows);
  if (r0 >= nlive) return;
  if constexpr (K > 0) {
    float a[RT][K][V], b[RT][K][V], ss[RT];
    int64_t off[RT];
#pragma unroll
    for (int q = 0; q < RT; ++q) {  // every load before the first store to h
      const int64_t r = rg + int64_t(q) * rpb;
      off[q] = r < nlive ? r * dim : -1;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (off[q] >= 0 && j + k * tpr < n) {
          load_bf16<V>(h + off[q] + int64_t(j + k * tpr) * V, a[q][k]);
          load_bf16<V>(y + off[q] + int64_t(j + k * tpr) * V, b[q][k]);
        }
    }
#pragma unroll
    for (int q = 0; q < RT; ++q) {
      ss[q] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (off[q] >= 0 && j + k * tpr < n) {
#pragma unroll
          for (int e = 0; e < V; ++e) a[q][k][e] = __bfloat162float(__float2bfloat16_rn(a[q][k][e] + b[q][k][e]));
          ss[q] = add_squares<V>(ss[q], a[q][k]);
          store_bf16<V>(h + off[q] + int64_t(j + k * tpr) * V, a[q][k]);
        }
    }
#pragma unroll
    for (int q = 0; q < RT; ++q) ss[q] = row_sum(ss[q], tpr, red[q]);
#pragma unroll
    for (int q = 0; q < RT; ++q) {
      if (off[q] < 0) continue;
      const float inv = rsqrtf(ss[q] / float(dim) + eps);
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (j + k * tpr < n) {
#pragma unroll
          for (int e = 0; e < V; ++e)
            a[q][k][e] = a[q][k][e] * inv * (zero_centred ? 1.0f + g[k][e] : g[k][e]);
          store_bf16<V>(x + off[q] + int64_t(j + k * tpr) * V, a[q][k]);
        }
    }
  } else {  // one row per block (tpr = 1024), two passes over global memory
    const bool ok = rg < nlive;
    bf16* hr = h + (ok ? rg : 0) * dim;
    const bf16* yr = y + (ok ? rg : 0) * dim;
    float ss = 0.0f, a[V];
    if (ok)
      for (int i = j; i < n; i += tpr) {
        float b[V];
        load_bf16<V>(hr + int64_t(i) * V, a);
        load_bf16<V>(yr + int64_t(i) * V, b);
#pragma unroll
        for (int e = 0; e < V; ++e) a[e] = __bfloat162float(__float2bfloat16_rn(a[e] + b[e]));
        ss = add_squares<V>(ss, a);
        store_bf16<V>(hr + int64_t(i) * V, a);
      }
    ss = row_sum(ss, tpr, red[0]);
    if (!ok) return;
    const float inv = rsqrtf(ss / float(dim) + eps);
    bf16* xr = x + rg * dim;
    for (int i = j; i < n; i += tpr) {
      load_bf16<V>(hr + int64_t(i) * V, a);  // this thread's own writes above
      load_bf16<V>(w + int64_t(i) * V, g[0]);
#pragma unroll
      for (int e = 0; e < V; ++e) a[e] = a[e] * inv * (zero_centred ? 1.0f + g[0][e] : g[0][e]);
      store_bf16<V>(xr + int64_t(i) * V, a);
    }
  }
}

// ---- SwiGLU, gate, residual --------------------------------------------------------------------
template <int V>
__global__ void swiglu_kernel(const bf16* __restrict__ gu, bf16* __restrict__ out, int64_t max_rows, int64_t I,
                              int64_t gu_stride, const int32_t* live) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  const int64_t i = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (i >= I) return;
  float g[V], u[V];
  load_bf16<V>(gu + t * gu_stride + i, g);
  load_bf16<V>(gu + t * gu_stride + I + i, u);
#pragma unroll
  for (int j = 0; j < V; ++j) g[j] = siluf_(g[j]) * u[j];
  store_bf16<V>(out + t * I + i, g);
}

template <int V>
__global__ void gate_kernel(const bf16* x, const bf16* __restrict__ gate, bf16* y, int64_t max_rows, int64_t heads,
                            int64_t dim, int64_t gts, int64_t ghs, int64_t ges, const int32_t* live) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  const int64_t n = heads * dim;
  const int64_t e = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (e >= n) return;
  const int64_t h = e / dim, i = e % dim;  // V divides dim, so the V elements share one head
  float a[V];
  load_bf16<V>(x + t * n + e, a);
  const bf16* g = gate + t * gts + h * ghs + i * ges;
#pragma unroll
  for (int j = 0; j < V; ++j) a[j] *= sigmoidf_(__bfloat162float(g[j * ges]));
  store_bf16<V>(y + t * n + e, a);
}

template <int V>
__global__ void residual_kernel(bf16* h, const bf16* __restrict__ y, int64_t max_rows, int64_t dim,
                                const int32_t* live) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  if (t >= live_count(live, max_rows)) return;
  const int64_t i = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (i >= dim) return;
  float a[V], b[V];
  load_bf16<V>(h + t * dim + i, a);
  load_bf16<V>(y + t * dim + i, b);
#pragma unroll
  for (int j = 0; j < V; ++j) a[j] += b[j];
  store_bf16<V>(h + t * dim + i, a);
}

/// MOEFOLD_NORM_ROWS_PER_THREAD: rows per thread of rms_norm / add_rms_norm from 1024 norm rows on
/// (one vector per thread only): 1 (the default), 2 or 4; another value throws moefold::Error. The same
/// bits at every value (each row's arithmetic does not depend on it). Read at each launch.
int rows_per_thread(int64_t nrows, int k) {
  const char* e = std::getenv("MOEFOLD_NORM_ROWS_PER_THREAD");
  const int r = e ? std::atoi(e) : 1;
  MOEFOLD_CHECK(r == 1 || r == 2 || r == 4, "MOEFOLD_NORM_ROWS_PER_THREAD={}: expected 1, 2 or 4", e ? e : "");
  return k == 1 && nrows >= 1024 ? r : 1;
}

/// Calls f(integral_constant K, integral_constant RT) for k in {0, 1, 2} and rt in {1, 2, 4} (rt > 1
/// with k == 1 only).
template <class F>
void dispatch_kr(int k, int rt, F&& f) {
  using std::integral_constant;
  if (k == 1 && rt == 4) f(integral_constant<int, 1>{}, integral_constant<int, 4>{});
  else if (k == 1 && rt == 2) f(integral_constant<int, 1>{}, integral_constant<int, 2>{});
  else if (k == 1) f(integral_constant<int, 1>{}, integral_constant<int, 1>{});
  else if (k == 2) f(integral_constant<int, 2>{}, integral_constant<int, 1>{});
  else f(integral_constant<int, 0>{}, integral_constant<int, 1>{});
}

void check_rows(int64_t max_rows, int64_t dim, const char* what) {
  MOEFOLD_CHECK(max_rows >= 0 && dim > 0 && dim < (int64_t(1) << 30), "{}: bad sizes max_rows={} dim={}", what,
                max_rows, dim);
  MOEFOLD_CHECK(max_rows < (int64_t(1) << 31), "{}: max_rows {} too large", what, max_rows);
}

}  // namespace

void embedding_gather(const bf16* table, int64_t vocab, int64_t hidden, const int32_t* ids, bf16* out,
                      int64_t max_rows, const int32_t* live_rows, int32_t* oob_flag, cudaStream_t stream) {
  check_rows(max_rows, hidden, "embedding_gather");
  MOEFOLD_CHECK(vocab > 0, "embedding_gather: empty vocabulary");
  if (max_rows == 0) return;
  LaunchScope launch(kEmbedding, stream, [&] {
    return prof::Work{double(work_rows(max_rows, live_rows)) * double(hidden) * 4 + double(max_rows) * 4, 0};
  });
  dispatch_vec(vec_width(hidden, {table, out}, {}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (hidden / V + 31) / 32 * 32)));
    launch_pdl(embedding_kernel<V>, dim3(unsigned(max_rows)), dim3(threads), 0, stream, table, vocab, hidden, ids, out, max_rows,
                                                                     live_rows, oob_flag);
  });
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void rms_norm(const bf16* x, const bf16* w, bf16* y, int64_t max_rows, int64_t dim, float eps, NormKind kind,
              const int32_t* live_rows, cudaStream_t stream, HeadRows rows) {
  check_rows(max_rows, dim, "rms_norm");
  const int64_t heads = rows.heads;
  const int64_t hs = rows.head_stride ? rows.head_stride : dim;
  const int64_t ts = rows.token_stride ? rows.token_stride : heads * hs;
  MOEFOLD_CHECK(heads >= 1 && hs >= dim && ts >= (heads - 1) * hs + dim, "rms_norm: bad row layout");
  if (max_rows == 0) return;
  const int64_t nrows = max_rows * heads;
  MOEFOLD_CHECK(nrows < (int64_t(1) << 31), "rms_norm: {} rows too many", nrows);
  LaunchScope launch(kRmsNorm, stream, [&] {
    return prof::Work{double(work_rows(max_rows, live_rows)) * double(heads * dim) * 4 + double(dim) * 2, 0};
  });
  dispatch_vec(vec_width(dim, {x, y, w}, {hs, ts}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const RowGeom g = row_geom(dim, V);
    const int rt = rows_per_thread(nrows, g.k);
    dispatch_kr(g.k, rt, [&](auto kk, auto rr) {
      constexpr int K = decltype(kk)::value, RT = decltype(rr)::value;
      launch_pdl(rms_norm_kernel<V, K, RT>, dim3(ceil_div_u(nrows, int64_t(g.rows_per_block) * RT)),
                 dim3(g.tpr * g.rows_per_block), 0, stream, x, w, y, max_rows, heads, ts, hs, int(dim), g.tpr, eps,
                 kind == NormKind::ZeroCentred, live_rows);
    });
  });
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void add_rms_norm(bf16* h, const bf16* y, const bf16* w, bf16* x, int64_t max_rows, int64_t dim, float eps,
                  NormKind kind, const int32_t* live_rows, cudaStream_t stream) {
  check_rows(max_rows, dim, "add_rms_norm");
  if (max_rows == 0) return;
  LaunchScope launch(kAddRmsNorm, stream, [&] {  // reads h, y; writes h, x
    return prof::Work{double(work_rows(max_rows, live_rows)) * double(dim) * 8 + double(dim) * 2, 0};
  });
  dispatch_vec(vec_width(dim, {h, y, w, x}, {}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const RowGeom g = row_geom(dim, V);
    const int rt = rows_per_thread(max_rows, g.k);
    dispatch_kr(g.k, rt, [&](auto kk, auto rr) {
      constexpr int K = decltype(kk)::value, RT = decltype(rr)::value;
      launch_pdl(add_rms_norm_kernel<V, K, RT>, dim3(ceil_div_u(max_rows, int64_t(g.rows_per_block) * RT)),
                 dim3(g.tpr * g.rows_per_block), 0, stream, h, y, w, x, max_rows, int(dim), g.tpr, eps,
                 kind == NormKind::ZeroCentred, live_rows);
    });
  });
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void swiglu(const bf16* gate_up, bf16* out, int64_t max_rows, int64_t I, const int32_t* live_rows,
            cudaStream_t stream, int64_t gate_up_stride) {
  check_rows(max_rows, I, "swiglu");
  if (gate_up_stride == 0) gate_up_stride = 2 * I;
  MOEFOLD_CHECK(gate_up_stride >= 2 * I, "swiglu: gate_up_stride {} < 2I", gate_up_stride);
  if (max_rows == 0) return;
  LaunchScope launch(kSwiglu, stream, [&] { return prof::Work{double(work_rows(max_rows, live_rows)) * double(I) * 6, 0}; });
  dispatch_vec(vec_width(I, {gate_up, out}, {gate_up_stride}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const dim3 grid(unsigned(max_rows), ceil_div_u(I / V, 256));
    launch_pdl(swiglu_kernel<V>, dim3(grid), dim3(256), 0, stream, gate_up, out, max_rows, I, gate_up_stride, live_rows);
  });
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void sigmoid_gate_mul(const bf16* x, const bf16* gate, bf16* y, int64_t max_rows, int64_t heads, int64_t dim,
                      const int32_t* live_rows, cudaStream_t stream, HeadRows gate_rows, int64_t gate_elem_stride) {
  check_rows(max_rows, dim, "sigmoid_gate_mul");
  MOEFOLD_CHECK(heads >= 1 && gate_rows.heads == heads, "sigmoid_gate_mul: gate layout has {} heads, expected {}",
                gate_rows.heads, heads);
  const int64_t ghs = gate_rows.head_stride ? gate_rows.head_stride : dim * gate_elem_stride;
  const int64_t gts = gate_rows.token_stride ? gate_rows.token_stride : heads * ghs;
  if (max_rows == 0) return;
  LaunchScope launch(kGate, stream, [&] {
    const double n = double(work_rows(max_rows, live_rows)) * double(heads * dim);
    return prof::Work{n * 4 + n * 2 * (gate_elem_stride ? 1.0 : 1.0 / double(dim)), 0};
  });
  // Vector width limited by x / y only (gates are read element by element, strided).
  dispatch_vec(vec_width(dim, {x, y}, {}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const dim3 grid(unsigned(max_rows), ceil_div_u(heads * dim / V, 256));
    launch_pdl(gate_kernel<V>, dim3(grid), dim3(256), 0, stream, x, gate, y, max_rows, heads, dim, gts, ghs, gate_elem_stride,
                                             live_rows);
  });
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void residual_add(bf16* h, const bf16* y, int64_t max_rows, int64_t dim, const int32_t* live_rows,
                  cudaStream_t stream) {
  check_rows(max_rows, dim, "residual_add");
  if (max_rows == 0) return;
  LaunchScope launch(kResidual, stream, [&] { return prof::Work{double(work_rows(max_rows, live_rows)) * double(dim) * 6, 0}; });
  dispatch_vec(vec_width(dim, {h, y}, {}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const dim3 grid(unsigned(max_rows), ceil_div_u(dim / V, 256));
    launch_pdl(residual_kernel<V>, dim3(grid), dim3(256), 0, stream, h, y, max_rows, dim, live_rows);
  });
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
