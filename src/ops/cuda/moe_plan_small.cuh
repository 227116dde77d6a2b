// Internal to the MoE chain (moe_plan.cu, moe_router.cu): the plan of a small step (L <= 512 live
// pairs) from pair ids already in SHARED memory, as the fast fused route kernels run it after their
// top-k: cpu::moe_plan's content over the live pairs (counts, offsets, pairs grouped by expert with
// ascending pair id inside one, the row-tile list, the invalid-id count in status), the same bytes as
// moe_plan's kernels. One warp for L <= 32 (no block barrier), else the whole CTA.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

namespace moefold::cuda::moe_detail {

/// Experts the small plans cover (E <= kSmallPlanMaxE).
constexpr int kSmallPlanMaxE = 1024;

/// The plan of L <= 32 live pairs (ids in s_ids[0, L)) by the 32 lanes of one warp. s_counts[0, E) must
/// be zero on entry (E <= 32 * VPT); s_offsets[E] is scratch. Lane j holds pair j; counts come from
/// shared-memory atomics; lane l owns experts [l * VPT, l * VPT + VPT): their pair and tile counts, packed
/// (pairs << 16 | tiles), take one exclusive warp scan (shfl_up) for the offsets and the tile list; a
/// pair's position is its expert's offset plus the lanes below it with the same expert (match_any): the
/// order of the stable sort.
template <int VPT>
__device__ __forceinline__ void plan_warp(const int* s_ids, int L, int E, int bm, int* s_counts, int* s_offsets,
                                          int32_t* counts, int32_t* offsets, int32_t* pairs, int2* tiles,
                                          int32_t* num_tiles, int32_t* status) {
  const int lane = threadIdx.x & 31;
  const int id = lane < L ? s_ids[lane] : -1;
  const bool valid = lane < L && id >= 0 && id < E;
  const unsigned bad = __ballot_sync(0xffffffffu, lane < L && !valid);
  if (valid) atomicAdd(&s_counts[id], 1);
  __syncwarp();
  int c[VPT];
  int run = 0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = lane * VPT + i;
    c[i] = e < E ? s_counts[e] : 0;
    run += (c[i] << 16) + (c[i] + bm - 1) / bm;
  }
  int inc = run;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  const int total = __shfl_sync(0xffffffffu, inc, 31);
  int po = (inc - run) >> 16, to = (inc - run) & 0xffff;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = lane * VPT + i;
    if (e < E) {
      const int nt = (c[i] + bm - 1) / bm;
      counts[e] = c[i];
      offsets[e] = po;
      s_offsets[e] = po;
      for (int j = 0; j < nt; ++j) tiles[to + j] = make_int2(e, j * bm);
      po += c[i];
      to += nt;
    }
  }
  if (lane == 0) {
    offsets[E] = total >> 16;
    *num_tiles = total & 0xffff;
    *status = __popc(bad);
  }
  __syncwarp();
  const unsigned same = __match_any_sync(0xffffffffu, valid ? id : -1 - lane);
  if (valid) pairs[s_offsets[id] + __popc(same & ((1u << lane) - 1u))] = lane;
}

/// Shared memory of plan_block_small over NT threads.
template <int NT>
struct SmallPlanSmem {
  typename cub::BlockScan<int, NT>::TempStorage scan;
  int counts[kSmallPlanMaxE];
  int offsets[kSmallPlanMaxE];
  int bad;
};

/// The plan of L <= 512 live pairs (ids in s_ids[0, L)) by all NT threads of the CTA (every thread calls
/// it). On entry sm.counts[0, E) and sm.bad are zero and s_ids is visible to the block (after a barrier).
/// Pair and tile counts, packed (pairs << 16 | tiles: both < 2^16), take one cub::BlockScan; a pair's
/// position is its expert's offset plus the earlier pairs of that expert (the stable sort's order).
template <int NT>
__device__ __forceinline__ void plan_block_small(const int* s_ids, int L, int E, int bm, SmallPlanSmem<NT>& sm,
                                                 int32_t* counts, int32_t* offsets, int32_t* pairs, int2* tiles,
                                                 int32_t* num_tiles, int32_t* status) {
  constexpr int EPT = kSmallPlanMaxE / NT;
  for (int idx = threadIdx.x; idx < L; idx += NT) {
    const int id = s_ids[idx];
    if (id >= 0 && id < E) atomicAdd(&sm.counts[id], 1);
    else atomicAdd(&sm.bad, 1);
  }
  __syncthreads();
  int c[EPT], packed[EPT], excl[EPT];
#pragma unroll
  for (int i = 0; i < EPT; ++i) {
    const int e = threadIdx.x * EPT + i;
    c[i] = e < E ? sm.counts[e] : 0;
    packed[i] = (c[i] << 16) + (c[i] + bm - 1) / bm;
  }
  int total = 0;
  cub::BlockScan<int, NT>(sm.scan).ExclusiveSum(packed, excl, total);
#pragma unroll
  for (int i = 0; i < EPT; ++i) {
    const int e = threadIdx.x * EPT + i;
    if (e >= E) continue;
    const int po = excl[i] >> 16, to = excl[i] & 0xffff, nt = (c[i] + bm - 1) / bm;
    counts[e] = c[i];
    offsets[e] = po;
    sm.offsets[e] = po;
    for (int j = 0; j < nt; ++j) tiles[to + j] = make_int2(e, j * bm);
  }
  if (threadIdx.x == 0) {
    offsets[E] = total >> 16;
    *num_tiles = total & 0xffff;
    *status = sm.bad;
  }
  __syncthreads();  // sm.offsets written
  for (int idx = threadIdx.x; idx < L; idx += NT) {
    const int id = s_ids[idx];
    if (id < 0 || id >= E) continue;
    int rank = 0;
    for (int j = 0; j < idx; ++j) rank += s_ids[j] == id;
    pairs[sm.offsets[id] + rank] = idx;
  }
}

}  // namespace moefold::cuda::moe_detail
