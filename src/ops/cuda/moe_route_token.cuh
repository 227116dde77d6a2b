// Internal to the one-token expert kernels (moe_fp8_stream.cu): the route of a step's single token
// taken inside the expert kernel, so that no route kernel runs between the router logits and the experts.
// The picks are topk_row_fast's (the same keys and rounds, moe_topk.cuh), and the plan written for the
// combine is the bytes router_topk_plan_fast_kernel + plan_warp write for one live row: with one token the
// k picks are k distinct experts (the keys are distinct), so each expert holds one pair, its tile
// (expert, 0), and the tiles are the picked experts in ascending order.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/moe_topk.cuh"

namespace moefold::cuda::moe_detail {

/// Largest k and E the in-kernel route takes (larger ones run the route kernel).
constexpr int kTokenRouteMaxK = 8;
constexpr int kTokenRouteVpt = 8;
constexpr int kTokenRouteMaxE = 32 * kTokenRouteVpt;

/// One token's picks and tiles.
struct TokenRoute {
  int pick_e = 0;       ///< lane s < k: slot s's expert
  float pick_w = 0.0f;  ///< lane s < k: slot s's weight (renormalised when asked)
  int tile_e = 0;       ///< lane r < k: the r-th smallest picked expert (plan tile r)
  int tile_slot = 0;    ///< lane r < k: the slot that picked it (its pair index)
};

/// The route of the row of logits l[0, E) by all 32 lanes of a warp (E <= kTokenRouteMaxE,
/// 1 <= k <= kTokenRouteMaxK, no replay). Logits read through L2.
__device__ __forceinline__ TokenRoute route_token_warp(const float* __restrict__ l, int E, int k, bool renormalize) {
  const int lane = threadIdx.x & 31;
  uint64_t key[kTokenRouteVpt];
  row_keys_sorted<kTokenRouteVpt>(l, E, key);
  TokenRoute r;
  pick_sorted_lanes<kTokenRouteVpt>(key, k, renormalize, r.pick_e, r.pick_w, nullptr, nullptr, nullptr);
  // Lane s's tile: the picks below its expert (distinct experts: a permutation of [0, k)).
  int rank = 0;
  for (int j = 0; j < k; ++j) rank += __shfl_sync(0xffffffffu, r.pick_e, j) < r.pick_e ? 1 : 0;
  for (int j = 0; j < k; ++j) {
    const int e = __shfl_sync(0xffffffffu, r.pick_e, j), rk = __shfl_sync(0xffffffffu, rank, j);
    if (rk == lane) {
      r.tile_e = e;
      r.tile_slot = j;
    }
  }
  return r;
}

/// Where the plan of a step goes (MoeWorkspace's arrays).
struct TokenPlanOut {
  int32_t* ids;
  float* weights;
  int32_t* counts;
  int32_t* offsets;
  int32_t* pairs;
  int2* tiles;
  int32_t* num_tiles;
  int32_t* status;
};

/// By all 32 lanes of a warp: the plan bytes of a one-token step (capacity 1) with `live` in {0, 1} and
/// route `r`, as router_topk_plan_fast_kernel writes them: ids / weights of the k slots, counts[0, E),
/// offsets[0, E], pairs, tiles, num_tiles and status (0: every pick is an expert). With no live row:
/// zero counts and offsets, no tile, ids and weights untouched.
__device__ __forceinline__ void write_token_plan(const TokenRoute& r, int live, int E, int k, const TokenPlanOut& o) {
  const int lane = threadIdx.x & 31;
  const int n = live > 0 ? k : 0;
  int sorted[kTokenRouteMaxK];
#pragma unroll
  for (int j = 0; j < kTokenRouteMaxK; ++j) sorted[j] = __shfl_sync(0xffffffffu, r.tile_e, j);
  for (int e = lane; e <= E; e += 32) {
    int below = 0, hit = 0;
#pragma unroll
    for (int j = 0; j < kTokenRouteMaxK; ++j)
      if (j < n) {
        below += sorted[j] < e ? 1 : 0;
        hit += sorted[j] == e ? 1 : 0;
      }
    o.offsets[e] = below;
    if (e < E) o.counts[e] = hit;
  }
  if (lane < n) {
    o.ids[lane] = r.pick_e;
    o.weights[lane] = r.pick_w;
    o.pairs[lane] = r.tile_slot;
    o.tiles[lane] = make_int2(r.tile_e, 0);
  }
  if (lane == 0) {
    *o.num_tiles = n;
    *o.status = 0;
  }
}

}  // namespace moefold::cuda::moe_detail
