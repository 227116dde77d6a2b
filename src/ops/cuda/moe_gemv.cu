// MoE experts at small batch (decode, step capacity <= 16 rows): split GEMV over the expert plan.
// At 1..16 tokens each touched expert holds 1..16 pairs, so the tensor-core tiles of moe_gemm.cuh
// compute mostly padding and, with few tiles, too few CTAs stream the weights. Here the unit of work is
// an item = (plan tile, slice of output rows): a tile is <= 8 pairs of one expert (moe_plan with 8-row
// tiles: one tile per touched expert unless more than 8 rows chose it; further tiles re-read its
// weights, mostly from L2), a slice is 8 act columns
// (gate_up: one warp per column, its gate row and its up row) or 32 rows of H (down: four rows per warp).
// Each warp streams its weight rows once with 16-byte non-L1-allocating loads, and dots them with every
// pair's vector (x rows / act rows, L1-cached) in fp32 FMA. The grid is the device's resident block
// count (capped by the worst-case items of the capacity) and walks the items the plan has (read from
// device memory: tiles, num_tiles, offsets, pairs), so padding rows, which the plan never holds, and
// experts with no pairs cost nothing, and a graph captured at a bucket replays with any live count.
//
// Numerics (fixed for a shape, independent of the rows, their count and the capacity): lane l of the
// warp owning an output accumulates, in K order, its 8-element chunks k = s * 256 + 8 l .. + 7 for
// s = 0, 1, ... with fmaf from 0; the 32 lane sums are then added by an xor butterfly (offsets 16, 8, 4,
// 2, 1), which leaves the same value in every lane. gate_up: act = bf16_rn(silu(g) * u) of the fp32 sums
// (silu as the tile kernels' silu_f32); down: y = bf16_rn(sum). No atomics; a pair's result does not
// depend on which tile, item or block computes it, nor on the other pairs of its tile.
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda::moe_detail {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kMinBlocks = 2;                         // resident blocks per SM (<= 128 registers)
constexpr int kTilePairs = 8;                         // pairs of one tile (NP <= 8: 128 registers)
static_assert(kTilePairs == expert_tile_rows(kMoeExpertGemv), "the plan's tiles are the GEMV's");
constexpr int kChunk = 8;                             // bf16 elements per lane per step (16 bytes)
constexpr int kStep = 32 * kChunk;                    // elements a warp covers per step
constexpr int kGateUpCols = kWarps;                   // act columns per gate_up item
constexpr int kDownRowsPerWarp = 4;
constexpr int kDownRows = kWarps * kDownRowsPerWarp;  // H rows per down item
constexpr int kGateUpUnroll = 4;                      // K steps of weight loads in flight (2 rows each)
constexpr int kDownUnroll = 2;                        // (4 rows each): 4 KB a warp either way


/// 8 bf16 (element 0 in the low half of v.x) to fp32, exactly.
__device__ __forceinline__ void to_f32(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    f[2 * q] = __uint_as_float(w[q] << 16);
    f[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
  }
}

/// acc[r][p] = dot(row r, vector p) over K elements for r < R weight rows at w + r * rstride and the
/// first n (<= NP, warp-uniform) vectors at vec(p); result in every lane. Called by all 32 lanes.
/// The per-element operation order is the file header's; it does not depend on n or NP.
template <int R, int NP, int U, class Vec>
__device__ __forceinline__ void warp_dots(const bf16* __restrict__ w, int64_t rstride, const Vec& vec, int n, int K,
                                          float (&acc)[R][NP]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int p = 0; p < NP; ++p) acc[r][p] = 0.0f;
  const int steps = (K + kStep - 1) / kStep;
  for (int s0 = 0; s0 < steps; s0 += U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = (s0 + u) * kStep + lane * kChunk;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = k0 < K ? ptx::ld_stream16(w + r * rstride + k0) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = (s0 + u) * kStep + lane * kChunk;
      if (k0 < K) {  // per lane, fixed by K: lanes and steps past K add nothing
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) to_f32(wv[u][r], wf[r]);
#pragma unroll
        for (int p = 0; p < NP; ++p) {
          if (p < n) {
            float xf[8];
            to_f32(__ldg(reinterpret_cast<const uint4*>(vec(p) + k0)), xf);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[r][p] = fmaf(wf[r][i], xf[i], acc[r][p]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int p = 0; p < NP; ++p)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][p] += __shfl_xor_sync(0xffffffffu, acc[r][p], o);
}

/// One gate_up item for a tile of n <= NP pairs: act column c of each pair. x_row: lane p (< n) holds
/// the x row of the tile's pair p.
template <int NP>
__device__ __forceinline__ void gate_up_item(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                                             int64_t up_stride, int x_row, int n, int H, int I, int j0, int c,
                                             bf16* __restrict__ act) {
  const int lane = threadIdx.x & 31;
  int rows[NP];
#pragma unroll
  for (int p = 0; p < NP; ++p) rows[p] = __shfl_sync(0xffffffffu, x_row, p);
  float acc[2][NP];
  warp_dots<2, NP, kGateUpUnroll>(
      wg, up_stride, [&](int p) { return x + int64_t(rows[p]) * H; }, n, H, acc);
#pragma unroll
  for (int p = 0; p < NP; ++p)
    if (p < n && lane == p) act[int64_t(j0 + p) * I + c] = __float2bfloat16_rn(silu_f32(acc[0][p]) * acc[1][p]);
}

/// One down item for a tile of n <= NP pairs (act rows j0 ..): rows h0 .. h0 + 3 of y for each pair.
/// pair: lane p (< n) holds the pair id of the tile's pair p.
template <int NP>
__device__ __forceinline__ void down_item(const bf16* __restrict__ act0, const bf16* __restrict__ wd, int pair,
                                          int n, int H, int I, int h0, bf16* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  float acc[kDownRowsPerWarp][NP];
  warp_dots<kDownRowsPerWarp, NP, kDownUnroll>(
      wd, I, [&](int p) { return act0 + int64_t(p) * I; }, n, I, acc);
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    const int pr = __shfl_sync(0xffffffffu, pair, p);
    if (p < n && lane == p) {
      const __nv_bfloat162 a = __floats2bfloat162_rn(acc[0][p], acc[1][p]);
      const __nv_bfloat162 b = __floats2bfloat162_rn(acc[2][p], acc[3][p]);
      uint2 v;
      v.x = *reinterpret_cast<const uint32_t*>(&a);
      v.y = *reinterpret_cast<const uint32_t*>(&b);
      *reinterpret_cast<uint2*>(y + int64_t(pr) * H + h0) = v;
    }
  }
}

/// The tile's expert, first position in the pair list and pair count (1..8).
struct TileRef {
  int expert, j0, n;
};
__device__ __forceinline__ TileRef tile_ref(const PlanView& plan, int t) {
  const int2 tile = plan.tiles[t];
  const int j0 = plan.offsets[tile.x] + tile.y;
  return TileRef{tile.x, j0, min(kTilePairs, plan.offsets[tile.x + 1] - j0)};
}

__global__ void __launch_bounds__(kThreads, kMinBlocks) moe_gemv_gate_up_kernel(const bf16* __restrict__ x,
                                                                    const bf16* __restrict__ gate_up,
                                                                    const PlanView plan, int k, int H, int I,
                                                                    bf16* __restrict__ act) {
  pdl_begin();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slices = I / kGateUpCols;
  const int items = *plan.num_tiles * slices;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int t = item / slices, slice = item - t * slices;
    const TileRef tr = tile_ref(plan, t);
    const int x_row = lane < tr.n ? plan.pairs[tr.j0 + lane] / k : 0;
    const int c = slice * kGateUpCols + warp;
    const bf16* wg = gate_up + (int64_t(tr.expert) * 2 * I + c) * H;
    const int64_t up = int64_t(I) * H;
    if (tr.n <= 1) gate_up_item<1>(x, wg, up, x_row, tr.n, H, I, tr.j0, c, act);
    else if (tr.n <= 2) gate_up_item<2>(x, wg, up, x_row, tr.n, H, I, tr.j0, c, act);
    else if (tr.n <= 4) gate_up_item<4>(x, wg, up, x_row, tr.n, H, I, tr.j0, c, act);
    else gate_up_item<8>(x, wg, up, x_row, tr.n, H, I, tr.j0, c, act);
  }
}

__global__ void __launch_bounds__(kThreads, kMinBlocks) moe_gemv_down_kernel(const bf16* __restrict__ act,
                                                                 const bf16* __restrict__ down, const PlanView plan,
                                                                 int H, int I, bf16* __restrict__ y) {
  pdl_begin();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slices = H / kDownRows;
  const int items = *plan.num_tiles * slices;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int t = item / slices, slice = item - t * slices;
    const TileRef tr = tile_ref(plan, t);
    const int pair = lane < tr.n ? plan.pairs[tr.j0 + lane] : 0;
    const int h0 = slice * kDownRows + warp * kDownRowsPerWarp;
    const bf16* wd = down + (int64_t(tr.expert) * H + h0) * I;
    const bf16* a0 = act + int64_t(tr.j0) * I;
    if (tr.n <= 1) down_item<1>(a0, wd, pair, tr.n, H, I, h0, y);
    else if (tr.n <= 2) down_item<2>(a0, wd, pair, tr.n, H, I, h0, y);
    else if (tr.n <= 4) down_item<4>(a0, wd, pair, tr.n, H, I, h0, y);
    else down_item<8>(a0, wd, pair, tr.n, H, I, h0, y);
  }
}

/// Blocks of `kernel` (kThreads threads, no dynamic shared memory) resident on the current device at
/// once: the grid that keeps every SM streaming without a tail of waves.
template <class Kernel>
int resident_blocks(Kernel kernel) {
  int dev = 0, sms = 0, per_sm = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MOEFOLD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  return std::max(1, sms * std::max(1, per_sm));
}

}  // namespace

void launch_gemv_gate_up(const bf16* x, const bf16* gate_up, const PlanView& plan, int k, int H, int I,
                         int max_tiles, bf16* act, cudaStream_t stream) {
  MOEFOLD_CHECK(I % kGateUpCols == 0 && H % kChunk == 0 && k >= 1,
                fmt::runtime("moe gemv gate_up: unsupported H={} I={} k={}"), H, I, k);
  static const int resident = resident_blocks(moe_gemv_gate_up_kernel);
  const int64_t items = int64_t(max_tiles) * (I / kGateUpCols);
  if (items <= 0) return;
  const int grid = int(std::min<int64_t>(items, resident));
  launch_pdl(moe_gemv_gate_up_kernel, dim3(grid), dim3(kThreads), 0, stream, x, gate_up, plan, k, H, I, act);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void launch_gemv_down(const bf16* act, const bf16* down, const PlanView& plan, int H, int I, int max_tiles, bf16* y,
                      cudaStream_t stream) {
  MOEFOLD_CHECK(H % kDownRows == 0 && I % kChunk == 0, fmt::runtime("moe gemv down: unsupported H={} I={}"), H, I);
  static const int resident = resident_blocks(moe_gemv_down_kernel);
  const int64_t items = int64_t(max_tiles) * (H / kDownRows);
  if (items <= 0) return;
  const int grid = int(std::min<int64_t>(items, resident));
  launch_pdl(moe_gemv_down_kernel, dim3(grid), dim3(kThreads), 0, stream, act, down, plan, H, I, y);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda::moe_detail
