// MoE router on the GPU: logits = x . W_router^T in fp32 (tensor cores, split-K over warps), then one
// warp per live row computes the fp32 softmax and the top-k exactly as cpu::router_topk does: e = exp(l -
// max) rounded to fp32 (computed in fp64, so it is the correctly rounded value a libm expf returns), the
// denominator summed in fp64, p = fp32(e / sum); NaN logits rank below every number; ties go to the
// lower expert index; k rounds of a warp max over a 64-bit key (valid, p bits, ~index) pick distinct
// experts; the renormalising sum is taken in fp64 in slot order.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/moe_plan_small.cuh"
#include "ops/cuda/moe_topk.cuh"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
namespace {

// Router logits: one CTA computes a 16-row x 16-expert tile; its KSPLIT warps each run an mma.sync chain
// over one contiguous K range (own cp.async pipeline, 64 columns a stage), and the partial tiles are added
// in warp order. KSPLIT depends only on H, never on the capacity, so every capacity (bucket) computes
// each logit with the same operations in the same order: padded and unpadded runs agree bit for bit.
// Decode (1 row) is latency-bound: the K split puts KSPLIT independent load streams on each tile.
constexpr int kRouterBM = 16, kRouterBN = 16, kRouterBK = 64, kRouterStages = 3;

/// KSPLIT of the router logits for H: it depends on H only, and every logits kernel (16 x 16 tiles, wide
/// tiles, the cluster-fused route) must use the same one to give the same bits.
int router_ksplit(int H) { return H % (8 * kRouterBK) == 0 ? 8 : (H % (4 * kRouterBK) == 0 ? 4 : 2); }

// The 16 x 16 logit tile at rows m0.., experts n0.. (nrows live rows of it) by the CTA's KSPLIT warps:
// router_logits_kernel's body, shared with the cluster-fused router + route kernel (the same bits).
template <int KSPLIT>
__device__ __forceinline__ void logits_tile(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                            int m0, int n0, int nrows, int H, int E, float* __restrict__ logits,
                                            unsigned char* smem_raw) {
  using namespace moe_detail;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kTile = kRouterBM * kRouterBK;  // elements of one 16 x 64 tile
  __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(smem_raw) + warp * kRouterStages * 2 * kTile;
  __nv_bfloat16* sB = sA + kRouterStages * kTile;

  const int kw = H / KSPLIT, k0 = warp * kw, KT = kw / kRouterBK;
  auto load = [&](int stage, int kt) {
    const int kofs = k0 + kt * kRouterBK;
#pragma unroll
    for (int c = lane; c < kRouterBM * 8; c += 32) {
      const int r = c >> 3, ch = c & 7;
      const bool a_ok = r < nrows, b_ok = n0 + r < E;
      cp_async16(sA + stage * kTile + swz(r, ch), x + (a_ok ? int64_t(m0 + r) * H + kofs + ch * 8 : 0), a_ok);
      cp_async16(sB + stage * kTile + swz(r, ch), w + (b_ok ? int64_t(n0 + r) * H + kofs + ch * 8 : 0), b_ok);
    }
  };
  float acc[2][4] = {};
#pragma unroll
  for (int s = 0; s < kRouterStages - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kRouterStages - 2>();
    __syncwarp();
    {
      const int nk = kt + kRouterStages - 1;
      if (nk < KT) load(nk % kRouterStages, nk);
      cp_async_commit();
    }
    const __nv_bfloat16* a_s = sA + (kt % kRouterStages) * kTile;
    const __nv_bfloat16* b_s = sB + (kt % kRouterStages) * kTile;
#pragma unroll
    for (int ks = 0; ks < kRouterBK / 16; ++ks) {
      uint32_t af[4], bf[4];
      ldmatrix_x4(af, a_s + swz(lane & 15, ks * 2 + (lane >> 4)));
      ldmatrix_x4(bf, b_s + swz((lane >> 4) * 8 + (lane & 7), ks * 2 + ((lane >> 3) & 1)));
      mma_bf16_16816(acc[0], af, bf[0], bf[1]);
      mma_bf16_16816(acc[1], af, bf[2], bf[3]);
    }
    __syncwarp();
  }
  cp_async_wait<0>();
  __syncthreads();
  // Partial tiles to shared memory (reusing the pipeline buffers), then a fixed-order sum over warps.
  float* red = reinterpret_cast<float*>(smem_raw);  // [KSPLIT][16][16]
  const int lr = lane >> 2, lc = (lane & 3) * 2;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      red[(warp * 16 + lr + 8 * h) * 16 + j * 8 + lc] = acc[j][2 * h];
      red[(warp * 16 + lr + 8 * h) * 16 + j * 8 + lc + 1] = acc[j][2 * h + 1];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < kRouterBM * kRouterBN; i += KSPLIT * 32) {
    const int r = i / kRouterBN, c = i % kRouterBN;
    if (r >= nrows || n0 + c >= E) continue;
    float v = red[i];
#pragma unroll
    for (int q = 1; q < KSPLIT; ++q) v += red[q * kRouterBM * kRouterBN + i];
    logits[int64_t(m0 + r) * E + n0 + c] = v;
  }
}

template <int KSPLIT>
__global__ void __launch_bounds__(KSPLIT * 32)
    router_logits_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                         const int32_t* __restrict__ num_rows, int capacity, int H, int E, float* __restrict__ logits) {
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  const int m0 = blockIdx.y * kRouterBM, n0 = blockIdx.x * kRouterBN;
  if (m0 >= live) return;
  logits_tile<KSPLIT>(x, w, m0, n0, min(kRouterBM, live - m0), H, E, logits, smem_raw);
}

template <int KSPLIT>
void launch_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* num_rows, const MoeShape& s,
                          float* logits, cudaStream_t stream) {
  auto kernel = router_logits_kernel<KSPLIT>;
  constexpr int smem = KSPLIT * kRouterStages * 2 * kRouterBM * kRouterBK * 2;
  static_assert(smem >= KSPLIT * kRouterBM * kRouterBN * 4, "reduction buffer fits in the pipeline buffers");
  static bool attr_set = false;  // per instantiation; setting it twice is harmless
  if (!attr_set) {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  const dim3 grid((s.E + kRouterBN - 1) / kRouterBN, (s.capacity + kRouterBM - 1) / kRouterBM);
  launch_pdl(kernel, dim3(grid), dim3(KSPLIT * 32), smem, stream, x, w, num_rows, s.capacity, s.H, s.E, logits);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

// ---- router logits of large steps: 128 x 128 tiles, the same bits -----------------------------------------
// router_logits_kernel re-reads each x row once per 16 experts, which leaves a prefill step's router far
// below the tensor cores' rate. This kernel computes a 128-row x 128-expert tile per CTA (8 warps as 4 x 2,
// a 32 x 64 tile each) from one 4-stage cp.async pipeline over all of K, and keeps each logit's arithmetic
// exactly that of router_logits_kernel: for each of the KSPLIT contiguous K ranges, an accumulator that
// starts at zero and takes the range's m16n8k16 products in K order; the range partials are then added in
// range order (p0 + p1 + ...), as that kernel's warp-order reduction does. mma.sync computes each output
// element from its own row, column and accumulator only, so the tile shape does not change the bits.
constexpr int kWideBM = 128, kWideBN = 128, kWideStages = 4, kWideThreads = 256;
constexpr int kWideSmem = kWideStages * (kWideBM + kWideBN) * kRouterBK * 2;
static_assert(kWideBM == kWideBN, "the load loop below copies one A row and one B row per chunk index");

template <int KSPLIT>
__global__ void __launch_bounds__(kWideThreads, 1)
    router_logits_wide_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                              const int32_t* __restrict__ num_rows, int capacity, int H, int E,
                              float* __restrict__ logits) {
  using namespace moe_detail;
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  const int m0 = blockIdx.y * kWideBM, n0 = blockIdx.x * kWideBN;
  if (m0 >= live) return;
  const int nrows = min(kWideBM, live - m0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp >> 1, wn = warp & 1;
  constexpr int kTileA = kWideBM * kRouterBK, kTileB = kWideBN * kRouterBK;
  __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sB = sA + kWideStages * kTileA;
  const int KT = H / kRouterBK, KTs = KT / KSPLIT;  // k-tiles in all, and in each K range
  auto load = [&](int stage, int kt) {
    const int kofs = kt * kRouterBK;
#pragma unroll
    for (int c = threadIdx.x; c < kWideBM * 8; c += kWideThreads) {
      const int r = c >> 3, ch = c & 7;
      const bool a_ok = r < nrows, b_ok = n0 + r < E;
      cp_async16(sA + stage * kTileA + swz(r, ch), x + (a_ok ? int64_t(m0 + r) * H + kofs + ch * 8 : 0), a_ok);
      cp_async16(sB + stage * kTileB + swz(r, ch), w + (b_ok ? int64_t(n0 + r) * H + kofs + ch * 8 : 0), b_ok);
    }
  };
  float acc[2][8][4], total[2][8][4];
#pragma unroll
  for (int s = 0; s < kWideStages - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kWideStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free to refill
    {
      const int nk = kt + kWideStages - 1;
      if (nk < KT) load(nk % kWideStages, nk);
      cp_async_commit();
    }
    if (kt % KTs == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
    const __nv_bfloat16* a_s = sA + (kt % kWideStages) * kTileA;
    const __nv_bfloat16* b_s = sB + (kt % kWideStages) * kTileB;
#pragma unroll
    for (int ks = 0; ks < kRouterBK / 16; ++ks) {
      uint32_t af[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) ldmatrix_x4(af[i], a_s + swz(32 * wm + 16 * i + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t bf[4];
        ldmatrix_x4(bf, b_s + swz(64 * wn + 16 * jp + (lane >> 4) * 8 + (lane & 7), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_bf16_16816(acc[i][2 * jp], af[i], bf[0], bf[1]);
          mma_bf16_16816(acc[i][2 * jp + 1], af[i], bf[2], bf[3]);
        }
      }
    }
    if (kt % KTs == KTs - 1) {  // end of K range kt / KTs: fold its partial in, in range order
      const bool first = kt < KTs;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) total[i][j][e] = first ? acc[i][j][e] : total[i][j][e] + acc[i][j][e];
    }
  }
  cp_async_wait<0>();
  const int lr = lane >> 2, lc = (lane & 3) * 2;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 32 * wm + 16 * i + lr + 8 * h;
      if (r >= nrows) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int e = n0 + 64 * wn + 8 * j + lc;  // E is even, so e < E implies e + 1 < E
        if (e < E)
          *reinterpret_cast<float2*>(logits + int64_t(m0 + r) * E + e) =
              make_float2(total[i][j][2 * h], total[i][j][2 * h + 1]);
      }
    }
}

template <int KSPLIT>
void launch_router_logits_wide(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* num_rows,
                               const MoeShape& s, float* logits, cudaStream_t stream) {
  auto kernel = router_logits_wide_kernel<KSPLIT>;
  static bool attr_set = false;  // per instantiation; setting it twice is harmless
  if (!attr_set) {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWideSmem));
    attr_set = true;
  }
  const dim3 grid((s.E + kWideBN - 1) / kWideBN, (s.capacity + kWideBM - 1) / kWideBM);
  launch_pdl(kernel, grid, dim3(kWideThreads), kWideSmem, stream, x, w, num_rows, s.capacity, s.H, s.E, logits);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

// ---- router logits + top-k + plan of a small step in one launch (a thread-block cluster) ----------------
// One cluster of ceil(E / 16) CTAs (<= 16: E <= 256; capacity <= 16, one row tile): CTA i computes the
// logits of experts [16 i, 16 i + 16) exactly as router_logits_kernel does (logits_tile, the same KSPLIT
// by H), the cluster barrier (release / acquire at cluster scope) makes every CTA's logits visible, and
// CTA 0 copies the live rows' logits to shared memory (ld.global.cg), runs topk_row_fast per row (a warp a
// row) and the plan of moe_plan_small.cuh. Same bytes as moe_router_logits + moe_route; one launch and one
// kernel boundary fewer.
constexpr int kClusterMaxCtas = 16;
template <int KSPLIT>
constexpr int cluster_smem() {
  return KSPLIT * kRouterStages * 2 * kRouterBM * kRouterBK * 2;  // router_logits_kernel's pipeline buffers
}

template <int KSPLIT, int VPT>
__global__ void __launch_bounds__(KSPLIT * 32)
    router_route_cluster_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                const int32_t* __restrict__ num_rows, int capacity, int H, int E, int k,
                                bool renormalize, const int32_t* __restrict__ replay, int bm, float* logits,
                                int32_t* ids, float* weights, int32_t* counts, int32_t* offsets, int32_t* pairs,
                                int2* tiles, int32_t* num_tiles, int32_t* status) {
  constexpr int NT = KSPLIT * 32;
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ moe_detail::SmallPlanSmem<NT> sm;
  __shared__ int s_ids[kRouterBM * 32];  // capacity <= 16 rows, k <= 32 (P <= 512)
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  if (live > 0) logits_tile<KSPLIT>(x, w, 0, blockIdx.x * kRouterBN, live, H, E, logits, smem_raw);
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  if (blockIdx.x != 0) return;  // the cluster is the grid: CTA 0 is cluster rank 0
  float* s_l = reinterpret_cast<float*>(smem_raw);  // [live, E] (the pipeline buffers, now free)
  for (int i = threadIdx.x; i < live * E; i += NT) s_l[i] = __ldcg(logits + i);
  for (int e = threadIdx.x; e < E; e += NT) sm.counts[e] = 0;
  if (threadIdx.x == 0) sm.bad = 0;
  __syncthreads();
  for (int t = threadIdx.x >> 5; t < live; t += KSPLIT)
    moe_detail::topk_row_fast<VPT>(s_l + t * E, E, k, renormalize, replay ? replay + int64_t(t) * k : nullptr,
                                   ids + int64_t(t) * k, weights + int64_t(t) * k, s_ids + t * k);
  __syncthreads();
  const int L = live * k;
  if (L <= 32) {
    if (threadIdx.x < 32)
      moe_detail::plan_warp<VPT>(s_ids, L, E, bm, sm.counts, sm.offsets, counts, offsets, pairs, tiles, num_tiles,
                                 status);
    return;
  }
  moe_detail::plan_block_small<NT>(s_ids, L, E, bm, sm, counts, offsets, pairs, tiles, num_tiles, status);
}

std::atomic<int64_t> g_cluster_launches{0};

/// MOEFOLD_MOE_ROUTER_LOGITS: "tile" (router_logits_kernel always), "wide" (router_logits_wide_kernel
/// always), else automatic (wide from kRouterWideMinRows rows of capacity). The same bytes either way.
moe_detail::RouterLogitsKind g_router_logits_kind = [] {
  using K = moe_detail::RouterLogitsKind;
  const char* v = std::getenv("MOEFOLD_MOE_ROUTER_LOGITS");
  if (v && std::string_view(v) == "tile") return K::kTile;
  if (v && std::string_view(v) == "wide") return K::kWide;
  return K::kAuto;
}();

bool g_router_cluster = [] {
  const char* v = std::getenv("MOEFOLD_MOE_ROUTER_CLUSTER");
  return v && std::string_view(v) == "1";
}();

/// Launches the cluster kernel; false (nothing launched) when the device cannot run a cluster of its size.
template <int KSPLIT, int VPT>
bool launch_router_route_cluster(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* num_rows,
                                 const MoeShape& s, bool renormalize, const int32_t* replay, int bm,
                                 const MoeWorkspace& ws, cudaStream_t stream) {
  auto kernel = router_route_cluster_kernel<KSPLIT, VPT>;
  constexpr int smem = cluster_smem<KSPLIT>();
  const int n = (s.E + kRouterBN - 1) / kRouterBN;
  static int fits[kClusterMaxCtas + 1] = {};  // per instantiation: 0 unknown, 1 yes, -1 no
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(n);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(n));
  cfg.blockDim = dim3(KSPLIT * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (fits[n] == 0) {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if (n > 8) MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (e != cudaSuccess) (void)cudaGetLastError();
    fits[n] = e == cudaSuccess && clusters >= 1 ? 1 : -1;
  }
  if (fits[n] < 0) return false;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  MOEFOLD_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, x, w, num_rows, s.capacity, s.H, s.E, s.k, renormalize, replay,
                                        bm, ws.logits, ws.ids, ws.weights, ws.counts, ws.offsets, ws.pairs, ws.tiles,
                                        ws.num_tiles, ws.status));
  MOEFOLD_CUDA_CHECK_LAUNCH();
  g_cluster_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

constexpr int kTopkWarps = 8;

template <int VPT, bool FAST>
__global__ void __launch_bounds__(kTopkWarps * 32)
    router_topk_kernel(const float* __restrict__ logits, const int32_t* __restrict__ num_rows, int capacity,
                       int E, int k, bool renormalize, const int32_t* __restrict__ replay,
                       int32_t* __restrict__ ids, float* __restrict__ weights) {
  pdl_begin();
  const int warp = threadIdx.x >> 5;
  const int t = blockIdx.x * kTopkWarps + warp;
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  if (t >= live) return;
  if constexpr (FAST)
    moe_detail::topk_row_fast<VPT>(logits + int64_t(t) * E, E, k, renormalize,
                                   replay ? replay + int64_t(t) * k : nullptr, ids + int64_t(t) * k,
                                   weights + int64_t(t) * k);
  else
    moe_detail::topk_row<VPT>(logits + int64_t(t) * E, E, k, renormalize, replay ? replay + int64_t(t) * k : nullptr,
                              ids + int64_t(t) * k, weights + int64_t(t) * k);
}

template <int VPT>
void launch_topk(const float* logits, const int32_t* num_rows, const MoeShape& s, bool renormalize,
                 const int32_t* replay, int32_t* ids, float* weights, cudaStream_t stream) {
  const int blocks = (s.capacity + kTopkWarps - 1) / kTopkWarps;
  auto kernel = moe_detail::route_fast() ? router_topk_kernel<VPT, true> : router_topk_kernel<VPT, false>;
  launch_pdl(kernel, dim3(blocks), dim3(kTopkWarps * 32), 0, stream, logits, num_rows, s.capacity, s.E, s.k,
             renormalize, replay, ids, weights);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

const prof::Kernel kRouterLogits{"router_logits_kernel", prof::Category::MoeRouting};
const prof::Kernel kRouterLogitsWide{"router_logits_wide_kernel", prof::Category::MoeRouting};
const prof::Kernel kRouterTopk{"router_topk_kernel", prof::Category::MoeRouting};
const prof::Kernel kRouterRouteCluster{"router_route_cluster_kernel", prof::Category::MoeRouting};
const prof::Kernel kCountsSnapshotRoute{"profiler:moe_counts_snapshot", prof::Category::Other};  // as moe_plan.cu

}  // namespace

void moe_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const int32_t* num_rows,
                       const MoeShape& s, float* logits, cudaStream_t stream) {
  MOEFOLD_CHECK(s.capacity >= 1 && s.E >= 2 && s.E % 2 == 0 && s.H % (2 * kRouterBK) == 0,
                fmt::runtime("moe_router_logits: unsupported shape capacity={} E={} H={}"), s.capacity, s.E, s.H);
  const bool wide = moe_detail::router_logits_wide(s.capacity);
  // W, live x rows read, fp32 logits written.
  LaunchScope launch(wide ? kRouterLogitsWide : kRouterLogits, stream, [&] {
    const double T = double(work_rows(s.capacity, num_rows));
    return prof::Work{double(s.E) * s.H * 2 + T * s.H * 2 + T * s.E * 4, 2.0 * T * s.H * s.E};
  });
  // The K split depends on H only (bit-identical logits at every capacity, with either kernel).
  auto run = [&](auto ksplit) {
    constexpr int KS = decltype(ksplit)::value;
    wide ? launch_router_logits_wide<KS>(x, w_router, num_rows, s, logits, stream)
         : launch_router_logits<KS>(x, w_router, num_rows, s, logits, stream);
  };
  const int ks = router_ksplit(s.H);
  if (ks == 8) run(std::integral_constant<int, 8>{});
  else if (ks == 4) run(std::integral_constant<int, 4>{});
  else run(std::integral_constant<int, 2>{});
}

void moe_router_topk(const float* logits, const int32_t* num_rows, const MoeShape& s, bool renormalize,
                     int32_t* ids, float* weights, cudaStream_t stream, const int32_t* replay) {
  MOEFOLD_CHECK(s.E >= 1 && s.E <= 512 && s.k >= 1 && s.k <= s.E, fmt::runtime("moe_router_topk: unsupported E={} k={}"),
                s.E, s.k);
  const int vpt = (s.E + 31) / 32;
  LaunchScope launch(kRouterTopk, stream, [&] {  // logits read, ids and weights written
    const double T = double(work_rows(s.capacity, num_rows));
    return prof::Work{T * s.E * 4 + T * s.k * 8, 0};
  });
  if (vpt <= 1) launch_topk<1>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
  else if (vpt <= 2) launch_topk<2>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
  else if (vpt <= 4) launch_topk<4>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
  else if (vpt <= 8) launch_topk<8>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
  else launch_topk<16>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
}

namespace moe_detail {
void set_router_logits_kind(RouterLogitsKind kind) { g_router_logits_kind = kind; }
bool router_logits_wide(int capacity) {
  return g_router_logits_kind == RouterLogitsKind::kWide ||
         (g_router_logits_kind == RouterLogitsKind::kAuto && capacity >= kRouterWideMinRows);
}
void set_router_cluster(bool on) { g_router_cluster = on; }
bool router_cluster() { return g_router_cluster; }
int64_t router_cluster_launches() { return g_cluster_launches.load(std::memory_order_relaxed); }
}  // namespace moe_detail

namespace {
int cluster_smem_bytes(int ksplit) {
  return ksplit == 8 ? cluster_smem<8>() : (ksplit == 4 ? cluster_smem<4>() : cluster_smem<2>());
}
template <int KSPLIT>
bool launch_cluster_vpt(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* num_rows, const MoeShape& s,
                        bool renormalize, const int32_t* replay, int bm, const MoeWorkspace& ws, cudaStream_t stream) {
  const int vpt = (s.E + 31) / 32;
  if (vpt <= 1) return launch_router_route_cluster<KSPLIT, 1>(x, w, num_rows, s, renormalize, replay, bm, ws, stream);
  if (vpt <= 2) return launch_router_route_cluster<KSPLIT, 2>(x, w, num_rows, s, renormalize, replay, bm, ws, stream);
  if (vpt <= 4) return launch_router_route_cluster<KSPLIT, 4>(x, w, num_rows, s, renormalize, replay, bm, ws, stream);
  return launch_router_route_cluster<KSPLIT, 8>(x, w, num_rows, s, renormalize, replay, bm, ws, stream);
}
}  // namespace

bool moe_router_cluster_fused(const MoeShape& s) {
  return moe_detail::router_cluster() && moe_route_fused(s) && s.E >= 2 && s.E % 2 == 0 &&
         s.E <= kClusterMaxCtas * kRouterBN &&
         s.H % (2 * kRouterBK) == 0 && s.capacity <= kRouterBM && s.capacity * s.k <= kRouterBM * 32 &&
         s.capacity * s.E * 4 <= cluster_smem_bytes(router_ksplit(s.H));
}

void moe_router_route(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const int32_t* num_rows,
                      const MoeShape& s, bool renormalize, const MoeWorkspace& ws, cudaStream_t stream,
                      const int32_t* replay) {
  if (moe_router_cluster_fused(s)) {
    MOEFOLD_CHECK(ws.tile_rows > 0 && ws.pairs != nullptr, fmt::runtime("moe_router_route: workspace not bound"));
    MOEFOLD_CHECK(s.capacity <= ws.capacity,
                  fmt::runtime("moe_router_route: step capacity {} exceeds the workspace's {}"), s.capacity, ws.capacity);
    const int bm = moe_detail::expert_tile_rows(moe_detail::expert_config(s));
    bool launched = false;
    {
      LaunchScope launch(kRouterRouteCluster, stream, [&] {  // W, live x rows read; logits, ids, weights, plan written
        const double T = double(work_rows(s.capacity, num_rows));
        return prof::Work{double(s.E) * s.H * 2 + T * s.H * 2 + T * s.E * 8 + T * s.k * 16 + double(s.E) * 16,
                          2.0 * T * s.H * s.E};
      });
      const int ks = router_ksplit(s.H);
      if (ks == 8) launched = launch_cluster_vpt<8>(x, w_router, num_rows, s, renormalize, replay, bm, ws, stream);
      else if (ks == 4) launched = launch_cluster_vpt<4>(x, w_router, num_rows, s, renormalize, replay, bm, ws, stream);
      else launched = launch_cluster_vpt<2>(x, w_router, num_rows, s, renormalize, replay, bm, ws, stream);
    }
    if (launched) {
      snapshot_device_ints(kCountsSnapshotRoute, ws.counts, s.E, stream);
      return;
    }
  }
  moe_router_logits(x, w_router, num_rows, s, ws.logits, stream);
  moe_route(ws.logits, num_rows, s, renormalize, ws, stream, replay);
}

}  // namespace moefold::cuda
