// The MoE plan on the GPU: groups the live (row, slot) pairs by expert (cpu::moe_plan), giving per-expert
// counts, their exclusive scan (offsets), the pair list sorted by expert with ascending pair id inside
// one expert (a stable radix sort keyed by expert id), and the row-tile list the expert GEMMs run.
// Padding pairs (>= *num_rows * k) are keyed with the sentinel E, so they sort past every expert and are
// never counted; their ids are never read. Scratch is O(capacity * k + E).
//
// Two paths, chosen by the capacity (host-known): P = capacity * k <= kBlockItems runs as one CTA
// (cub::BlockRadixSort + cub::BlockScan: one launch, the decode case); larger P runs
// keys/histogram -> cub::DeviceRadixSort::SortPairs -> one finalize CTA (cub::BlockScan).
//
// moe_route fuses the router's top-k with the plan for small steps (capacity <= 16, P <= 512): one CTA,
// a warp per live row runs moe_detail::topk_row (the top-k kernel's own code), then each thread places
// one pair: its position is its expert's offset plus the number of earlier pairs of that expert, the
// order the stable sort gives. One launch instead of two, same bits in ids, weights and the plan.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/moe_plan_small.cuh"
#include "ops/cuda/moe_topk.cuh"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
namespace moe_detail {
namespace {
bool g_route_fast = [] {
  const char* v = std::getenv("MOEFOLD_MOE_ROUTE");
  return !(v && std::string_view(v) == "old");
}();
bool g_route_wide = [] {
  const char* v = std::getenv("MOEFOLD_MOE_ROUTE");
  return !(v && std::string_view(v) == "narrow");
}();
}  // namespace
void set_route_fast(bool on) { g_route_fast = on; }
bool route_fast() { return g_route_fast; }
void set_route_wide(bool on) { g_route_wide = on; }
bool route_wide() { return g_route_wide; }
}  // namespace moe_detail

namespace {

constexpr int kPlanThreads = 512;
constexpr int kPlanItems = 8;
constexpr int kBlockItems = kPlanThreads * kPlanItems;  // pairs handled by the one-CTA path
constexpr int kExpertsPerThread = 2;                    // E <= 1024 in the scans

const prof::Kernel kPlanBlock{"plan_block_kernel", prof::Category::MoeRouting};
const prof::Kernel kPlanMemset{"cudaMemsetAsync:moe_plan", prof::Category::MoeRouting};
const prof::Kernel kPlanKeys{"plan_keys_kernel", prof::Category::MoeRouting};
const prof::Kernel kPlanSort{"cub::DeviceRadixSort::SortPairs", prof::Category::MoeRouting};
const prof::Kernel kPlanFinalize{"plan_finalize_kernel", prof::Category::MoeRouting};
const prof::Kernel kTopkPlan{"router_topk_plan_kernel", prof::Category::MoeRouting};
const prof::Kernel kTopkPlanFast{"router_topk_plan_fast_kernel", prof::Category::MoeRouting};
// The profiler's own copy of the per-expert counts (read by the expert GEMMs' work at flush): shown so
// that its cost is not hidden in the idle time.
const prof::Kernel kCountsSnapshot{"profiler:moe_counts_snapshot", prof::Category::Other};

__device__ __forceinline__ int live_pairs(const int32_t* num_rows, int capacity, int k) {
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  return live * k;
}

// Counts -> offsets, tile list and counters. Called by all kPlanThreads threads of one CTA; counts in
// shared memory (s_counts[E]) are final on entry (after a barrier).
template <class Scan>
__device__ void finalize_plan(const int* s_counts, typename Scan::TempStorage& scan_tmp, int E, int bm,
                              int32_t* counts, int32_t* offsets, int2* tiles, int32_t* num_tiles) {
  int c[kExpertsPerThread], t[kExpertsPerThread], co[kExpertsPerThread], to[kExpertsPerThread];
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = threadIdx.x * kExpertsPerThread + i;
    c[i] = e < E ? s_counts[e] : 0;
    t[i] = (c[i] + bm - 1) / bm;
  }
  int total_pairs = 0, total_tiles = 0;
  Scan(scan_tmp).ExclusiveSum(c, co, total_pairs);
  __syncthreads();
  Scan(scan_tmp).ExclusiveSum(t, to, total_tiles);
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = threadIdx.x * kExpertsPerThread + i;
    if (e >= E) continue;
    counts[e] = c[i];
    offsets[e] = co[i];
    for (int j = 0; j < t[i]; ++j) tiles[to[i] + j] = make_int2(e, j * bm);
  }
  if (threadIdx.x == 0) {
    offsets[E] = total_pairs;
    *num_tiles = total_tiles;
  }
}

__global__ void __launch_bounds__(kPlanThreads) plan_block_kernel(const int32_t* __restrict__ ids,
                                                                  const int32_t* __restrict__ num_rows,
                                                                  int capacity, int k, int E, int end_bit,
                                                                  int bm, int32_t* counts, int32_t* offsets,
                                                                  int32_t* pairs, int2* tiles,
                                                                  int32_t* num_tiles, int32_t* status) {
  pdl_begin();
  using Sort = cub::BlockRadixSort<int, kPlanThreads, kPlanItems, int>;
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ int s_counts[kPlanThreads * kExpertsPerThread];
  __shared__ int s_bad;

  const int L = live_pairs(num_rows, capacity, k);
  for (int e = threadIdx.x; e < E; e += kPlanThreads) s_counts[e] = 0;
  if (threadIdx.x == 0) s_bad = 0;

  int keys[kPlanItems], vals[kPlanItems];
  int bad = 0;
#pragma unroll
  for (int i = 0; i < kPlanItems; ++i) {
    const int idx = threadIdx.x * kPlanItems + i;  // blocked arrangement: keeps the sort stable by idx
    int key = E;
    if (idx < L) {
      const int id = ids[idx];
      if (id >= 0 && id < E) key = id;
      else ++bad;
    }
    keys[i] = key;
    vals[i] = idx;
  }
  __syncthreads();  // s_counts / s_bad zeroed
  if (bad) atomicAdd(&s_bad, bad);
#pragma unroll
  for (int i = 0; i < kPlanItems; ++i)
    if (keys[i] < E) atomicAdd(&s_counts[keys[i]], 1);
  Sort(tmp.sort).Sort(keys, vals, 0, end_bit);
  // After the sort item i of thread t is at sorted position t * kPlanItems + i; sentinels are last.
#pragma unroll
  for (int i = 0; i < kPlanItems; ++i) {
    const int pos = threadIdx.x * kPlanItems + i;
    if (keys[i] < E) pairs[pos] = vals[i];
  }
  __syncthreads();
  finalize_plan<Scan>(s_counts, tmp.scan, E, bm, counts, offsets, tiles, num_tiles);
  if (threadIdx.x == 0) *status = s_bad;
}

// Large path, step 1: sort keys (sentinel E for padding and invalid ids), values = pair ids, histogram.
__global__ void plan_keys_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ num_rows,
                                 int capacity, int k, int E, int32_t* keys, int32_t* vals, int32_t* counts,
                                 int32_t* status) {
  pdl_begin();
  const int L = live_pairs(num_rows, capacity, k);
  const int P = capacity * k;
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < P; idx += gridDim.x * blockDim.x) {
    int key = E;
    if (idx < L) {
      const int id = ids[idx];
      if (id >= 0 && id < E) {
        key = id;
        atomicAdd(&counts[id], 1);
      } else {
        atomicAdd(status, 1);
      }
    }
    keys[idx] = key;
    vals[idx] = idx;
  }
}

// Large path, step 3: counts (global) -> offsets and tiles.
__global__ void __launch_bounds__(kPlanThreads) plan_finalize_kernel(int E, int bm, int32_t* counts,
                                                                     int32_t* offsets, int2* tiles,
                                                                     int32_t* num_tiles) {
  pdl_begin();
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int s_counts[kPlanThreads * kExpertsPerThread];
  for (int e = threadIdx.x; e < E; e += kPlanThreads) s_counts[e] = counts[e];
  __syncthreads();
  finalize_plan<Scan>(s_counts, scan_tmp, E, bm, counts, offsets, tiles, num_tiles);
}

// Fused top-k + plan of a small step (moe_route): P = capacity * k <= kPlanThreads, one pair a thread.
template <int VPT>
__global__ void __launch_bounds__(kPlanThreads)
    router_topk_plan_kernel(const float* __restrict__ logits, const int32_t* __restrict__ num_rows, int capacity,
                            int E, int k, bool renormalize, const int32_t* __restrict__ replay, int bm, int32_t* ids,
                            float* weights, int32_t* counts, int32_t* offsets, int32_t* pairs, int2* tiles,
                            int32_t* num_tiles, int32_t* status) {
  pdl_begin();
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int s_counts[kPlanThreads * kExpertsPerThread];
  __shared__ int s_ids[kPlanThreads];
  __shared__ int s_bad;
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  const int L = live * k;
  for (int e = threadIdx.x; e < E; e += kPlanThreads) s_counts[e] = 0;
  if (threadIdx.x == 0) s_bad = 0;
  for (int t = threadIdx.x >> 5; t < live; t += kPlanThreads / 32)
    moe_detail::topk_row<VPT>(logits + int64_t(t) * E, E, k, renormalize, replay ? replay + int64_t(t) * k : nullptr,
                              ids + int64_t(t) * k, weights + int64_t(t) * k);
  __syncthreads();  // ids of every live row written (global, visible to the block); counts zeroed
  const int idx = threadIdx.x;
  int id = -1;
  if (idx < L) {
    id = ids[idx];
    if (id >= 0 && id < E) atomicAdd(&s_counts[id], 1);  // integer counts: order-free
    else atomicAdd(&s_bad, 1);
  }
  s_ids[idx] = id;
  __syncthreads();
  finalize_plan<Scan>(s_counts, scan_tmp, E, bm, counts, offsets, tiles, num_tiles);
  __syncthreads();  // offsets written
  if (idx < L && id >= 0 && id < E) {
    int rank = 0;
    for (int j = 0; j < idx; ++j) rank += s_ids[j] == id;
    pairs[offsets[id] + rank] = idx;
  }
  if (threadIdx.x == 0) *status = s_bad;
}

// router_topk_plan_kernel's function and bytes (ids, weights, counts, offsets, pairs, tiles, num_tiles,
// status), faster at few live rows: the top-k of topk_row_wide (VPT warps a row) when every live row fits
// at once (live * VPT <= 16 warps: rows 1-2 at E = 256), else topk_row_fast (a warp a row); ids also into
// shared memory, so the plan never reads them back from global memory. Then the plan of
// moe_plan_small.cuh: one warp for L <= 32 live pairs, else the block with the offsets in shared memory.
template <int VPT>
__global__ void __launch_bounds__(kPlanThreads)
    router_topk_plan_fast_kernel(const float* __restrict__ logits, const int32_t* __restrict__ num_rows, int capacity,
                                 int E, int k, bool renormalize, const int32_t* __restrict__ replay, bool wide, int bm,
                                 int32_t* ids, float* weights, int32_t* counts, int32_t* offsets, int32_t* pairs,
                                 int2* tiles, int32_t* num_tiles, int32_t* status) {
  pdl_begin();
  __shared__ moe_detail::SmallPlanSmem<kPlanThreads> sm;
  __shared__ int s_ids[kPlanThreads];
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  const int L = live * k;
  for (int e = threadIdx.x; e < E; e += kPlanThreads) sm.counts[e] = 0;
  if (threadIdx.x == 0) sm.bad = 0;
  constexpr int kWarps = kPlanThreads / 32;
  if (VPT >= 2 && wide && !replay && live * VPT <= kWarps) {  // VPT warps a row (every row at once)
    constexpr int W = VPT >= 2 ? VPT : 2;
    __shared__ moe_detail::WideTopkSmem<W> wide[kWarps / W];
    const int t = (threadIdx.x >> 5) / W, w = (threadIdx.x >> 5) % W;
    const bool active = t < live;
    moe_detail::topk_row_wide<W>(active ? logits + int64_t(t) * E : nullptr, E, k, renormalize, active, w, wide[t],
                                 ids + int64_t(t) * k, weights + int64_t(t) * k, s_ids + t * k);
  } else {
    for (int t = threadIdx.x >> 5; t < live; t += kWarps)
      moe_detail::topk_row_fast<VPT>(logits + int64_t(t) * E, E, k, renormalize,
                                     replay ? replay + int64_t(t) * k : nullptr, ids + int64_t(t) * k,
                                     weights + int64_t(t) * k, s_ids + t * k);
  }
  __syncthreads();  // s_ids of every live row; counts zeroed
  if (L <= 32) {
    if (threadIdx.x < 32)
      moe_detail::plan_warp<VPT>(s_ids, L, E, bm, sm.counts, sm.offsets, counts, offsets, pairs, tiles, num_tiles,
                                 status);
    return;
  }
  moe_detail::plan_block_small<kPlanThreads>(s_ids, L, E, bm, sm, counts, offsets, pairs, tiles, num_tiles, status);
}

int sort_end_bit(int E) {
  int b = 0;
  while ((1 << b) <= E) ++b;  // keys are in [0, E]
  return b;
}

}  // namespace

size_t moe_plan_cub_temp_bytes(int capacity, int k, int E) {
  const int P = capacity * k;
  if (P <= kBlockItems) return 0;
  size_t bytes = 0;
  MOEFOLD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr),
                                                     static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), P, 0, sort_end_bit(E)));
  return bytes;
}

void moe_plan(const int32_t* ids, const int32_t* num_rows, const MoeShape& s, const MoeWorkspace& ws,
              cudaStream_t stream) {
  MOEFOLD_CHECK(s.E >= 1 && s.E <= kPlanThreads * kExpertsPerThread, fmt::runtime("moe_plan: E = {} outside [1, {}]"), s.E,
                kPlanThreads * kExpertsPerThread);
  MOEFOLD_CHECK(ws.tile_rows > 0 && ws.pairs != nullptr, fmt::runtime("moe_plan: workspace not bound"));
  MOEFOLD_CHECK(s.capacity <= ws.capacity, fmt::runtime("moe_plan: step capacity {} exceeds the workspace's {}"),
                s.capacity, ws.capacity);
  const int tile_rows = moe_detail::expert_tile_rows(moe_detail::expert_config(s));  // the step's tiles
  const int P = s.capacity * s.k;
  const int end_bit = sort_end_bit(s.E);
  const double live_pairs = double(work_rows(s.capacity, num_rows)) * s.k;
  if (P <= kBlockItems) {
    {
      LaunchScope launch(kPlanBlock, stream, [&] { return prof::Work{live_pairs * 12 + double(s.E) * 16, 0}; });
      launch_pdl(plan_block_kernel, dim3(1), dim3(kPlanThreads), 0, stream, ids, num_rows, s.capacity, s.k, s.E, end_bit, tile_rows,
                                                        ws.counts, ws.offsets, ws.pairs, ws.tiles, ws.num_tiles,
                                                        ws.status);
      MOEFOLD_CUDA_CHECK_LAUNCH();
    }
    snapshot_device_ints(kCountsSnapshot, ws.counts, s.E, stream);
    return;
  }
  MOEFOLD_CHECK(ws.cub_temp != nullptr && ws.sort_keys_in != nullptr, fmt::runtime("moe_plan: workspace lacks sort scratch"));
  {
    LaunchScope launch(kPlanMemset, stream, prof::Work{double(s.E + 1) * 4, 0});
    MOEFOLD_CUDA_CHECK(cudaMemsetAsync(ws.counts, 0, sizeof(int32_t) * size_t(s.E), stream));
  }
  {
    LaunchScope launch(kPlanMemset, stream, prof::Work{4, 0});
    MOEFOLD_CUDA_CHECK(cudaMemsetAsync(ws.status, 0, sizeof(int32_t), stream));
  }
  const int threads = 256;
  const int blocks = (P + threads - 1) / threads;
  {  // reads the live ids, writes keys and values of all P pairs (padding keyed past every expert)
    LaunchScope launch(kPlanKeys, stream, [&] { return prof::Work{live_pairs * 4 + double(P) * 8, 0}; });
    launch_pdl(plan_keys_kernel, dim3(blocks), dim3(threads), 0, stream, ids, num_rows, s.capacity, s.k, s.E, ws.sort_keys_in,
                                                     ws.sort_vals_in, ws.counts, ws.status);
    MOEFOLD_CUDA_CHECK_LAUNCH();
  }
  size_t temp_bytes = ws.cub_temp_bytes;
  {  // keys and values of all P pairs read and written once (one pass; CUB may take several)
    LaunchScope launch(kPlanSort, stream, prof::Work{double(P) * 16, 0});
    MOEFOLD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws.cub_temp, temp_bytes, ws.sort_keys_in, ws.sort_keys_out,
                                                       ws.sort_vals_in, ws.pairs, P, 0, end_bit, stream));
  }
  {
    LaunchScope launch(kPlanFinalize, stream, prof::Work{double(s.E) * 16, 0});
    launch_pdl(plan_finalize_kernel, dim3(1), dim3(kPlanThreads), 0, stream, s.E, tile_rows, ws.counts, ws.offsets, ws.tiles,
                                                         ws.num_tiles);
    MOEFOLD_CUDA_CHECK_LAUNCH();
  }
  snapshot_device_ints(kCountsSnapshot, ws.counts, s.E, stream);
}

namespace {
template <int VPT>
void launch_topk_plan(const float* logits, const int32_t* num_rows, const MoeShape& s, bool renormalize,
                      const int32_t* replay, int tile_rows, const MoeWorkspace& ws, cudaStream_t stream) {
  if (moe_detail::route_fast())
    launch_pdl(router_topk_plan_fast_kernel<VPT>, dim3(1), dim3(kPlanThreads), 0, stream, logits, num_rows, s.capacity,
               s.E, s.k, renormalize, replay, moe_detail::route_wide(), tile_rows, ws.ids, ws.weights, ws.counts,
               ws.offsets, ws.pairs, ws.tiles, ws.num_tiles, ws.status);
  else
    launch_pdl(router_topk_plan_kernel<VPT>, dim3(1), dim3(kPlanThreads), 0, stream, logits, num_rows, s.capacity,
               s.E, s.k, renormalize, replay, tile_rows, ws.ids, ws.weights, ws.counts, ws.offsets, ws.pairs,
               ws.tiles, ws.num_tiles, ws.status);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}
}  // namespace

void moe_route(const float* logits, const int32_t* num_rows, const MoeShape& s, bool renormalize,
               const MoeWorkspace& ws, cudaStream_t stream, const int32_t* replay) {
  if (!moe_route_fused(s)) {
    moe_router_topk(logits, num_rows, s, renormalize, ws.ids, ws.weights, stream, replay);
    moe_plan(ws.ids, num_rows, s, ws, stream);
    return;
  }
  MOEFOLD_CHECK(ws.tile_rows > 0 && ws.pairs != nullptr, fmt::runtime("moe_route: workspace not bound"));
  MOEFOLD_CHECK(s.capacity <= ws.capacity, fmt::runtime("moe_route: step capacity {} exceeds the workspace's {}"),
                s.capacity, ws.capacity);
  const int tile_rows = moe_detail::expert_tile_rows(moe_detail::expert_config(s));
  {
    LaunchScope launch(moe_detail::route_fast() ? kTopkPlanFast : kTopkPlan, stream, [&] {  // logits read; ids, weights, plan written
      const double T = double(work_rows(s.capacity, num_rows));
      return prof::Work{T * s.E * 4 + T * s.k * 16 + double(s.E) * 16, 0};
    });
    const int vpt = (s.E + 31) / 32;
    if (vpt <= 1) launch_topk_plan<1>(logits, num_rows, s, renormalize, replay, tile_rows, ws, stream);
    else if (vpt <= 2) launch_topk_plan<2>(logits, num_rows, s, renormalize, replay, tile_rows, ws, stream);
    else if (vpt <= 4) launch_topk_plan<4>(logits, num_rows, s, renormalize, replay, tile_rows, ws, stream);
    else if (vpt <= 8) launch_topk_plan<8>(logits, num_rows, s, renormalize, replay, tile_rows, ws, stream);
    else launch_topk_plan<16>(logits, num_rows, s, renormalize, replay, tile_rows, ws, stream);
  }
  snapshot_device_ints(kCountsSnapshot, ws.counts, s.E, stream);
}

bool moe_route_fused(const MoeShape& s) {
  return s.capacity <= kMoeSmallBatchMaxRows && int64_t(s.capacity) * s.k <= kPlanThreads && s.E <= 512 &&
         s.k >= 1 && s.k <= s.E;
}

}  // namespace moefold::cuda
