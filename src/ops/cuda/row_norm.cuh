// The thread layout and the fixed-order reduction shared by the norm kernels (rms_norm, add_rms_norm,
// gated_rms_norm; private to src/ops/cuda).
//
// A norm row of `dim` elements is read as n = dim / V vectors of V bf16. It is spread over `tpr`
// threads ("threads per row"): thread j holds vectors j, j + tpr, ..., j + (k-1) tpr in registers
// (k <= 2; k = 0 marks the loop form for rows too wide for registers, which re-reads its inputs in a
// second pass). tpr is a power of two <= 32 when n <= 32 (several rows share a warp), else a multiple
// of 32 (whole warps per row, up to 1024). A block holds rows_per_block rows (times the rows per thread
// of rms_norm / add_rms_norm, MOEFOLD_NORM_ROWS_PER_THREAD, which changes no row's arithmetic).
//
// Batch invariance: the sum of squares of a row is accumulated in one fixed order that depends only on
// (dim, V), never on the row count, the live count, the grid or the row's place in its block: each
// thread adds its vectors in index order (elements in order, one fma each), then an xor butterfly
// inside the warp (or the tpr-lane group), then the row's warp partials in warp order. So a row's bits
// are the same in a 1-row decode step, a 256-row bucket and a 32k-row prefill. (V comes from the
// alignment of the buffers and strides, which is the same on every path: buffers are 256-byte aligned.)
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/kernel_util.cuh"

namespace moefold::cuda::detail {

/// Where the rows of a norm launch go: see the file comment.
struct RowGeom {
  int tpr = 1;             // threads per row
  int k = 1;               // vectors per thread held in registers (0: loop form)
  int rows_per_block = 1;  // rows per block (block = tpr * rows_per_block threads)
};

/// The geometry of rows of dim elements read as V-element vectors (V divides dim). Depends only on
/// (dim, V): the reduction order follows from it.
inline RowGeom row_geom(int64_t dim, int V) {
  const int64_t n = dim / V;
  RowGeom g;
  if (n <= 32) {
    g.tpr = 1;
    while (g.tpr < n) g.tpr *= 2;
    g.k = 1;
  } else {
    const int64_t k = (n + 1023) / 1024;
    g.k = k <= 2 ? int(k) : 0;
    const int64_t per = g.k ? (n + g.k - 1) / g.k : 1024;
    g.tpr = int((per + 31) / 32 * 32);
  }
  g.rows_per_block = std::max(1, 256 / g.tpr);
  return g;
}

/// The sum of v over the tpr threads of each row, in the fixed order of the file comment; every
/// thread of a row gets the same bits. red: shared float[32]. Every thread of the block must call it
/// (it may hold a __syncthreads); tpr must be the same for the whole block.
__device__ __forceinline__ float row_sum(float v, int tpr, float* red) {
  if (tpr <= 32) {
    for (int o = tpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
  v = warp_sum(v);
  const int warp = int(threadIdx.x >> 5), wpr = tpr >> 5, first = warp / wpr * wpr;
  if ((threadIdx.x & 31) == 0) red[warp] = v;
  __syncthreads();
  float s = red[first];
  for (int i = 1; i < wpr; ++i) s += red[first + i];
  return s;
}

/// Sum of squares of V values added to ss in element order (one fma each).
template <int V>
__device__ __forceinline__ float add_squares(float ss, const float* f) {
#pragma unroll
  for (int e = 0; e < V; ++e) ss = __fmaf_rn(f[e], f[e], ss);
  return ss;
}

/// Calls f(std::integral_constant<int, V>) for the runtime vector width v.
template <class F>
void dispatch_vec(int v, F&& f) {
  switch (v) {
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

}  // namespace moefold::cuda::detail
