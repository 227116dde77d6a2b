// FP8 routed experts at decode sizes (see moe_fp8.h): items = (plan tile, slice of outputs) walked
// grid-stride by the resident blocks, as moe_gemv.cu. gate_up: one warp per act column (its gate and
// up rows, 2 x 4 16-byte loads in flight per lane), 8 columns a slice; down: one warp per 4 rows of H
// (4 loads in flight), 32 rows a slice. Dot products: fp8::warp_dots_fp8.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe_fp8.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
namespace {

using bf16 = __nv_bfloat16;
using moe_detail::PlanView;

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kTilePairs = 8;
static_assert(kTilePairs == moe_detail::expert_tile_rows(kMoeExpertGemv), "the plan's tiles are the GEMV's");
constexpr int kGateUpCols = kWarps;
// The tensor-core kernels run blocks of 4 warps: two or more blocks share an SM, so one block's item
// start (the plan's dependent loads) and its reduction overlap the other's weight stream.
constexpr int kMmaWarps = 4, kMmaThreads = kMmaWarps * 32;
constexpr int kDownRowsPerWarp = 4, kDownRows = kWarps * kDownRowsPerWarp;

const prof::Kernel kGateUp{"moe_fp8_gemv_gate_up_kernel", prof::Category::RoutedExpertGemm};
const prof::Kernel kDown{"moe_fp8_gemv_down_kernel", prof::Category::RoutedExpertGemm};

struct TileRef {
  int expert, j0, n;
};
__device__ __forceinline__ TileRef tile_ref(const PlanView& plan, int t) {
  const int2 tile = plan.tiles[t];
  const int j0 = plan.offsets[tile.x] + tile.y;
  return TileRef{tile.x, j0, min(kTilePairs, plan.offsets[tile.x + 1] - j0)};
}

template <int NP>
__device__ __forceinline__ void gate_up_item(const bf16* __restrict__ x, const uint8_t* wg, const float* sg,
                                             int64_t up_rows, int KB, int x_row, int n, int H, int I, int j0, int c,
                                             bf16* __restrict__ act) {
  const int lane = threadIdx.x & 31;
  int rows[NP];
#pragma unroll
  for (int p = 0; p < NP; ++p) rows[p] = __shfl_sync(0xffffffffu, x_row, p);
  float acc[2][NP];
  fp8::warp_dots_fp8<2, NP, 4>(wg, up_rows * H, sg, up_rows * KB, [&](int p) { return x + int64_t(rows[p]) * H; }, n,
                               H, acc);
#pragma unroll
  for (int p = 0; p < NP; ++p)
    if (p < n && lane == p) act[int64_t(j0 + p) * I + c] = __float2bfloat16_rn(moe_detail::silu_f32(acc[0][p]) * acc[1][p]);
}

template <int NP>
__device__ __forceinline__ void down_item(const bf16* __restrict__ act0, const uint8_t* wd, const float* sd, int KB,
                                          int pair, int n, int H, int I, int h0, bf16* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  float acc[kDownRowsPerWarp][NP];
  fp8::warp_dots_fp8<kDownRowsPerWarp, NP, 1>(wd, I, sd, KB, [&](int p) { return act0 + int64_t(p) * I; }, n, I, acc);
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

__global__ void __launch_bounds__(kThreads, 2) moe_fp8_gate_up_kernel(const bf16* __restrict__ x,
                                                                     const uint8_t* __restrict__ gate_up,
                                                                     const float* __restrict__ scale,
                                                                     const PlanView plan, int k, int H, int I,
                                                                     bf16* __restrict__ act) {
  pdl_begin();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KB = (H + fp8::kBlock - 1) / fp8::kBlock;
  const int slices = I / kGateUpCols;
  const int items = *plan.num_tiles * slices;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int t = item / slices, slice = item - t * slices;
    const TileRef tr = tile_ref(plan, t);
    const int x_row = lane < tr.n ? plan.pairs[tr.j0 + lane] / k : 0;
    const int c = slice * kGateUpCols + warp;
    const int64_t row = int64_t(tr.expert) * 2 * I + c;
    const uint8_t* wg = gate_up + row * H;
    const float* sg = scale + row * KB;
    if (tr.n <= 1) gate_up_item<1>(x, wg, sg, I, KB, x_row, tr.n, H, I, tr.j0, c, act);
    else if (tr.n <= 2) gate_up_item<2>(x, wg, sg, I, KB, x_row, tr.n, H, I, tr.j0, c, act);
    else if (tr.n <= 4) gate_up_item<4>(x, wg, sg, I, KB, x_row, tr.n, H, I, tr.j0, c, act);
    else gate_up_item<8>(x, wg, sg, I, KB, x_row, tr.n, H, I, tr.j0, c, act);
  }
}

__global__ void __launch_bounds__(kThreads, 2) moe_fp8_down_kernel(const bf16* __restrict__ act,
                                                                  const uint8_t* __restrict__ down,
                                                                  const float* __restrict__ scale, const PlanView plan,
                                                                  int H, int I, bf16* __restrict__ y) {
  pdl_begin();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KB = (I + fp8::kBlock - 1) / fp8::kBlock;
  const int slices = H / kDownRows;
  const int items = *plan.num_tiles * slices;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int t = item / slices, slice = item - t * slices;
    const TileRef tr = tile_ref(plan, t);
    const int pair = lane < tr.n ? plan.pairs[tr.j0 + lane] : 0;
    const int h0 = slice * kDownRows + warp * kDownRowsPerWarp;
    const int64_t row = int64_t(tr.expert) * H + h0;
    const uint8_t* wd = down + row * I;
    const float* sd = scale + row * KB;
    const bf16* a0 = act + int64_t(tr.j0) * I;
    if (tr.n <= 1) down_item<1>(a0, wd, sd, KB, pair, tr.n, H, I, h0, y);
    else if (tr.n <= 2) down_item<2>(a0, wd, sd, KB, pair, tr.n, H, I, h0, y);
    else if (tr.n <= 4) down_item<4>(a0, wd, sd, KB, pair, tr.n, H, I, h0, y);
    else down_item<8>(a0, wd, sd, KB, pair, tr.n, H, I, h0, y);
  }
}

// ---- tensor-core kernels (fp8_mma.cuh) ------------------------------------------------------------
// Items (plan tile, slice) grid-stride over the resident blocks. A block's 4 warps = WK (along K) x WN.
// gate_up: a warp owns 16 act columns (its gate fragment and the matching up fragment: the two mma C
// fragments line up, so SiLU(g) * u is formed in registers); a slice = WN * 16 columns. down: a warp
// owns 16 rows of H; a slice = WN * 16 rows. The tile's <= 8 pairs are the token fragment.

const prof::Kernel kMmaGateUp{"moe_fp8_mma_gate_up_kernel", prof::Category::RoutedExpertGemm};
const prof::Kernel kMmaDown{"moe_fp8_mma_down_kernel", prof::Category::RoutedExpertGemm};

__global__ void __launch_bounds__(kMmaThreads) moe_fp8_mma_gate_up_kernel(const bf16* __restrict__ x,
                                                                      const uint8_t* __restrict__ gate_up,
                                                                      const float* __restrict__ scale,
                                                                      const PlanView plan, int k, int H, int I, int WK,
                                                                      bf16* __restrict__ act) {
  pdl_begin();
  __shared__ float red[7 * 32 * 2 * 4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int WN = kMmaWarps / WK, wk = warp % WK, wn = warp / WK;
  const int KB = (H + fp8mma::kBlockK - 1) / fp8mma::kBlockK;
  const int slices = (I + WN * 16 - 1) / (WN * 16);
  const int items = *plan.num_tiles * slices;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int ti = item / slices, slice = item - ti * slices;
    const TileRef tr = tile_ref(plan, ti);
    const int c0 = (slice * WN + wn) * 16;
    const uint8_t* row[2][2];
    const float* sc[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = c0 + g + 8 * h;
#pragma unroll
      for (int part = 0; part < 2; ++part) {  // 0: gate row c, 1: up row I + c
        const int64_t r = int64_t(tr.expert) * 2 * I + part * I + c;
        row[part][h] = c < I ? gate_up + r * H : nullptr;
        sc[part][h] = c < I ? scale + r * KB : nullptr;
      }
    }
    const bf16* xp = g < tr.n ? x + int64_t(plan.pairs[tr.j0 + g] / k) * H : nullptr;
    float acc[2][1][4];
    fp8mma::warp_mma_fp8<2, 1>(row, sc, [&](int) { return xp; }, 1, H, wk, WK, acc);
    fp8mma::block_reduce<2, 1>(acc, red, WK, WN);
    if (wk == 0)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = c0 + g + 8 * h, p = 2 * t + c;
          if (col < I && p < tr.n)
            act[int64_t(tr.j0 + p) * I + col] =
                __float2bfloat16_rn(moe_detail::silu_f32(acc[0][0][2 * h + c]) * acc[1][0][2 * h + c]);
        }
  }
}

__global__ void __launch_bounds__(kMmaThreads) moe_fp8_mma_down_kernel(const bf16* __restrict__ act,
                                                                   const uint8_t* __restrict__ down,
                                                                   const float* __restrict__ scale,
                                                                   const PlanView plan, int H, int I, int WK,
                                                                   bf16* __restrict__ y) {
  pdl_begin();
  __shared__ float red[7 * 32 * 4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int WN = kMmaWarps / WK, wk = warp % WK, wn = warp / WK;
  const int KB = (I + fp8mma::kBlockK - 1) / fp8mma::kBlockK;
  const int slices = (H + WN * 16 - 1) / (WN * 16);
  const int items = *plan.num_tiles * slices;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int ti = item / slices, slice = item - ti * slices;
    const TileRef tr = tile_ref(plan, ti);
    const int h0 = (slice * WN + wn) * 16;
    const uint8_t* row[1][2];
    const float* sc[1][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int hr = h0 + g + 8 * h;
      const int64_t r = int64_t(tr.expert) * H + hr;
      row[0][h] = hr < H ? down + r * I : nullptr;
      sc[0][h] = hr < H ? scale + r * KB : nullptr;
    }
    const bf16* ap = g < tr.n ? act + int64_t(tr.j0 + g) * I : nullptr;
    float acc[1][1][4];
    fp8mma::warp_mma_fp8<1, 1>(row, sc, [&](int) { return ap; }, 1, I, wk, WK, acc);
    fp8mma::block_reduce<1, 1>(acc, red, WK, WN);
    if (wk == 0)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int p = 2 * t + c;
        if (p < tr.n) {
          const int pr = plan.pairs[tr.j0 + p];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int hr = h0 + g + 8 * h;
            if (hr < H) y[int64_t(pr) * H + hr] = __float2bfloat16_rn(acc[0][0][2 * h + c]);
          }
        }
      }
  }
}

template <class Kernel>
int resident_blocks(Kernel kernel, int threads = kThreads) {
  int dev = 0, sms = 0, per_sm = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MOEFOLD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return std::max(1, sms * std::max(1, per_sm));
}

void check(const MoeShape& s, const MoeWorkspace& ws, const char* what) {
  MOEFOLD_CHECK(s.capacity >= 1 && s.capacity <= kMoeFp8MaxRows && s.capacity <= ws.capacity && s.H % 128 == 0 &&
                    s.I % 64 == 0 && s.k >= 1 && s.E >= 2,
                "{}: unsupported shape capacity={} (workspace {}, at most {}) E={} k={} H={} I={}", what, s.capacity,
                ws.capacity, kMoeFp8MaxRows, s.E, s.k, s.H, s.I);
}


int max_tiles(const MoeShape& s, const MoeWorkspace& ws) {
  return std::min(ws.max_tiles, moe_detail::max_row_tiles(s, kTilePairs));
}

/// Work bound from the live rows (the plan's counts are on the device): every pair's expert touched.
prof::Work work(bool gate_up, const MoeShape& s) {
  const prof::StepFacts* f = prof::step_facts();
  const double pairs = double(f ? std::min<int64_t>(f->rows, s.capacity) : s.capacity) * s.k;
  const double touched = std::min<double>(s.E, pairs), H = s.H, I = s.I;
  const double kb_h = double((s.H + 127) / 128), kb_i = double((s.I + 127) / 128);
  if (gate_up)
    return prof::Work{touched * 2 * I * (H + kb_h * 4) + pairs / s.k * H * 2 + pairs * I * 2, 2.0 * pairs * H * 2 * I};
  return prof::Work{touched * H * (I + kb_i * 4) + pairs * I * 2 + pairs * H * 2, 2.0 * pairs * I * H};
}

}  // namespace

void moe_fp8_expert_gate_up_simt(const bf16* x, const uint8_t* gate_up, const float* gate_up_scale, const MoeShape& s,
                                 const MoeWorkspace& ws, cudaStream_t stream) {
  check(s, ws, "moe_fp8_expert_gate_up_simt");
  MOEFOLD_CHECK(x && gate_up && gate_up_scale, "moe_fp8_expert_gate_up: null pointer");
  static const int resident = resident_blocks(moe_fp8_gate_up_kernel);
  const int64_t items = int64_t(max_tiles(s, ws)) * (s.I / kGateUpCols);
  if (items <= 0) return;
  LaunchScope launch(kGateUp, stream, [&] { return work(true, s); });
  launch_pdl(moe_fp8_gate_up_kernel, dim3(int(std::min<int64_t>(items, resident))), dim3(kThreads), 0, stream, x,
             gate_up, gate_up_scale, moe_detail::plan_view(ws), s.k, s.H, s.I, ws.act);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void moe_fp8_expert_down_simt(const uint8_t* down, const float* down_scale, const MoeShape& s, const MoeWorkspace& ws,
                              cudaStream_t stream) {
  check(s, ws, "moe_fp8_expert_down_simt");
  MOEFOLD_CHECK(down && down_scale, "moe_fp8_expert_down: null pointer");
  static const int resident = resident_blocks(moe_fp8_down_kernel);
  const int64_t items = int64_t(max_tiles(s, ws)) * (s.H / kDownRows);
  if (items <= 0) return;
  LaunchScope launch(kDown, stream, [&] { return work(false, s); });
  launch_pdl(moe_fp8_down_kernel, dim3(int(std::min<int64_t>(items, resident))), dim3(kThreads), 0, stream, ws.act,
             down, down_scale, moe_detail::plan_view(ws), s.H, s.I, ws.y);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void moe_fp8_expert_gate_up(const bf16* x, const uint8_t* gate_up, const float* gate_up_scale, const MoeShape& s,
                            const MoeWorkspace& ws, cudaStream_t stream) {
  check(s, ws, "moe_fp8_expert_gate_up");
  MOEFOLD_CHECK(x && gate_up && gate_up_scale, "moe_fp8_expert_gate_up: null pointer");
  static const int resident = resident_blocks(moe_fp8_mma_gate_up_kernel, kMmaThreads);
  const int WK = fp8mma::warps_along_k(s.H, kMmaWarps), WN = kMmaWarps / WK;
  const int64_t items = int64_t(max_tiles(s, ws)) * ((s.I + WN * 16 - 1) / (WN * 16));
  if (items <= 0) return;
  LaunchScope launch(kMmaGateUp, stream, [&] { return work(true, s); });
  launch_pdl(moe_fp8_mma_gate_up_kernel, dim3(int(std::min<int64_t>(items, resident))), dim3(kMmaThreads), 0, stream,
             x, gate_up, gate_up_scale, moe_detail::plan_view(ws), s.k, s.H, s.I, WK, ws.act);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void moe_fp8_expert_down(const uint8_t* down, const float* down_scale, const MoeShape& s, const MoeWorkspace& ws,
                         cudaStream_t stream) {
  check(s, ws, "moe_fp8_expert_down");
  MOEFOLD_CHECK(down && down_scale, "moe_fp8_expert_down: null pointer");
  static const int resident = resident_blocks(moe_fp8_mma_down_kernel, kMmaThreads);
  const int WK = fp8mma::warps_along_k(s.I, kMmaWarps), WN = kMmaWarps / WK;
  const int64_t items = int64_t(max_tiles(s, ws)) * ((s.H + WN * 16 - 1) / (WN * 16));
  if (items <= 0) return;
  LaunchScope launch(kMmaDown, stream, [&] { return work(false, s); });
  launch_pdl(moe_fp8_mma_down_kernel, dim3(int(std::min<int64_t>(items, resident))), dim3(kMmaThreads), 0, stream,
             ws.act, down, down_scale, moe_detail::plan_view(ws), s.H, s.I, WK, ws.y);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void moe_fp8_forward(const bf16* x, const bf16* w_router, const uint8_t* gate_up, const float* gate_up_scale,
                     const uint8_t* down, const float* down_scale, const bf16* shared_out, const bf16* shared_gate_w,
                     const bf16* residual, const int32_t* num_rows, const MoeShape& shape, bool renormalize,
                     const MoeWorkspace& ws, bf16* out, cudaStream_t stream, const int32_t* replay,
                     const MoeNextNorm* next) {
  MoeShape s = shape;
  s.expert_tiles = kMoeExpertGemv;  // the plan's 8-pair tiles
  check(s, ws, "moe_fp8_forward");
  MOEFOLD_CHECK(num_rows && x && w_router && out, "moe_fp8_forward: null pointer (num_rows is a device int32)");
  moe_router_logits(x, w_router, num_rows, s, ws.logits, stream);
  moe_route(ws.logits, num_rows, s, renormalize, ws, stream, replay);
  if (moe_fp8_stream_enabled() && moe_fp8_stream_supported(s)) {  // one token: the bulk-copy kernels, same bits
    moe_fp8_stream_gate_up(x, gate_up, gate_up_scale, s, ws, stream);
    moe_fp8_stream_down(down, down_scale, s, ws, stream);
  } else {
    moe_fp8_expert_gate_up(x, gate_up, gate_up_scale, s, ws, stream);
    moe_fp8_expert_down(down, down_scale, s, ws, stream);
  }
  moe_combine(ws.weights, ws, shared_out, shared_gate_w, x, residual, num_rows, s, out, stream, next);
}

void moe_fp8_forward_shared(const bf16* x, const bf16* w_router, const uint8_t* gate_up, const float* gate_up_scale,
                            const uint8_t* down, const float* down_scale, const MoeFp8SharedExpert& shared,
                            const bf16* shared_gate_w, const bf16* residual, const int32_t* num_rows,
                            const MoeShape& shape, bool renormalize, const MoeWorkspace& ws, bf16* out,
                            cudaStream_t stream, const int32_t* replay, const MoeNextNorm* next) {
  MoeShape s = shape;
  s.expert_tiles = kMoeExpertGemv;  // the plan's 8-pair tiles
  check(s, ws, "moe_fp8_forward_shared");
  MOEFOLD_CHECK(num_rows && x && w_router && out, "moe_fp8_forward_shared: null pointer (num_rows is a device int32)");
  MOEFOLD_CHECK(moe_fp8_shared_fusable(s, shared.I),
                "moe_fp8_forward_shared: the shared expert (I={}) cannot run in the stream kernels at capacity {} "
                "(routed I={}); use moe_fp8_forward",
                shared.I, s.capacity, s.I);
  moe_router_logits(x, w_router, num_rows, s, ws.logits, stream);
  moe_route(ws.logits, num_rows, s, renormalize, ws, stream, replay);
  moe_fp8_stream_gate_up(x, gate_up, gate_up_scale, s, ws, stream, &shared, num_rows);
  moe_fp8_stream_down(down, down_scale, s, ws, stream, &shared, num_rows);
  moe_combine(ws.weights, ws, shared.out, shared_gate_w, x, residual, num_rows, s, out, stream, next);
}

}  // namespace moefold::cuda
