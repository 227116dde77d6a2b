// Internal to the MoE chain (moe_router.cu, moe_plan.cu): the softmax + top-k of one row, done by one
// warp, as moe_router_topk documents it (src/ops/cuda/moe.h) and cpu::router_topk computes it. Shared by
// the top-k kernel and the fused small-batch top-k + plan kernel, so that both give the same bits.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/kernel_util.cuh"

namespace moefold::cuda::moe_detail {

/// Top-k of the fp32 logits l[0, E) of one row (VPT = ceil(E / 32) values a lane), by all 32 lanes of a
/// warp: lane 0 writes out_ids[0, k) and out_w[0, k). replay: the row's k replayed experts, or null.
template <int VPT>
__device__ __forceinline__ void topk_row(const float* __restrict__ l, int E, int k, bool renormalize,
                                         const int32_t* __restrict__ replay, int32_t* out_ids, float* out_w) {
  const int lane = threadIdx.x & 31;
  float v[VPT];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    v[i] = e < E ? l[e] : NAN;
    if (e < E && !isnan(v[i])) m = fmaxf(m, v[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));

  // e = exp(l - m) in fp32 (0 for NaN logits, all 0 when the max is infinite), sum in fp64.
  double part = 0.0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    float p = 0.0f;
    if (e < E && !isnan(v[i]) && !isinf(m)) p = float(exp(double(v[i] - m)));
    if (e < E) part += double(p);
    v[i] = p;  // reuse: now the unnormalised probability
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  const double denom = part;

  // Ranking keys: bit 63 = logit is a number, bits 62..32 = p (non-negative fp32 bits order like values),
  // bits 31..0 = ~expert (lower index wins ties). 0 = absent or already taken.
  uint64_t key[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    if (e < E) {
      const bool is_num = !isnan(l[e]);
      const float p = denom > 0.0 ? float(double(v[i]) / denom) : 0.0f;
      key[i] = (uint64_t(is_num) << 63) | (uint64_t(__float_as_uint(p)) << 32) | uint64_t(~uint32_t(e));
    } else {
      key[i] = 0;
    }
  }

  double sum = 0.0;
  for (int s = 0; s < k; ++s) {
    uint64_t best = 0;
    int e_replay = -1;
    if (replay) {  // the replayed expert's key (0 when the id is outside [0, E))
      e_replay = replay[s];
#pragma unroll
      for (int i = 0; i < VPT; ++i)
        if (i * 32 + lane == e_replay) best = key[i];
    } else {
#pragma unroll
      for (int i = 0; i < VPT; ++i) best = key[i] > best ? key[i] : best;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t other = __shfl_xor_sync(0xffffffffu, best, o);
      best = other > best ? other : best;
    }
    const int e = replay ? e_replay : int(~uint32_t(best & 0xffffffffu));
    const float p = __uint_as_float(uint32_t(best >> 32) & 0x7fffffffu);
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      if (key[i] == best && !replay) key[i] = 0;
    sum += double(p);
    if (lane == 0) {
      out_ids[s] = e;
      out_w[s] = p;
    }
  }
  if (renormalize && lane == 0 && sum > 0.0) {
    for (int s = 0; s < k; ++s) out_w[s] = float(double(out_w[s]) / sum);
  }
}

/// The k rounds of topk_row_fast and topk_row_wide: every lane holds N keys sorted descending (distinct
/// or 0); each round takes the warp's maximal head key by two redux.sync over its 32-bit halves (high
/// word: number bit | p bits; low word: ~expert among the lanes with the maximal high word), and the
/// winning lane drops its head. Lane s < 32 writes slot s (slots >= 32 by lane s % 32 at once) of
/// out_ids / out_w (and s_ids when given), weights renormalised by their fp64 sum in slot order.
template <int N>
__device__ __forceinline__ void pick_sorted(uint64_t (&key)[N], int k, bool renormalize, int32_t* out_ids,
                                            float* out_w, int* s_ids) {
  const int lane = threadIdx.x & 31;
  int my_e = 0;
  float my_p = 0.0f;
  double sum = 0.0;
  for (int s = 0; s < k; ++s) {
    const uint32_t hi = uint32_t(key[0] >> 32), lo = uint32_t(key[0]);
    const uint32_t mhi = __reduce_max_sync(0xffffffffu, hi);
    const uint32_t mlo = __reduce_max_sync(0xffffffffu, hi == mhi ? lo : 0u);
    if (hi == mhi && lo == mlo) {  // the winner (keys are distinct): drop its head
#pragma unroll
      for (int i = 0; i + 1 < N; ++i) key[i] = key[i + 1];
      key[N - 1] = 0;
    }
    const int e = int(~mlo);
    const float p = __uint_as_float(mhi & 0x7fffffffu);
    sum += double(p);
    if (lane == (s & 31)) {
      if (s < 32) {
        my_e = e;
        my_p = p;
      } else {  // k > 32: slots past the lanes are written at once
        out_ids[s] = e;
        out_w[s] = p;
        if (s_ids) s_ids[s] = e;
      }
    }
  }
  if (renormalize && sum > 0.0) {
    if (lane < k) my_p = float(double(my_p) / sum);
    for (int s = 32 + lane; s < k; s += 32) out_w[s] = float(double(out_w[s]) / sum);
  }
  if (lane < k) {
    out_ids[lane] = my_e;
    out_w[lane] = my_p;
    if (s_ids) s_ids[lane] = my_e;
  }
}

/// topk_row's ids and weights, bit for bit (same keys, same picks in the same slot order, same fp64 sums),
/// with shorter dependency chains: each lane sorts its VPT keys once (odd-even transposition network,
/// descending), then each of the k rounds is two warp max reductions (redux.sync) over 32-bit halves of
/// the lanes' head keys (high word: number bit | p bits; low word: ~expert among the lanes that hold the
/// maximal high word), and the winning lane drops its head. Lane s < 32 writes slot s (slots >= 32 by
/// lane 0) once at the end. When `s_ids` is given, the picks are also written to s_ids[0, k) (shared
/// memory, for the plan). Replay: topk_row itself.
template <int VPT>
__device__ __forceinline__ void topk_row_fast(const float* __restrict__ l, int E, int k, bool renormalize,
                                              const int32_t* __restrict__ replay, int32_t* out_ids, float* out_w,
                                              int* s_ids = nullptr) {
  if (replay) {
    topk_row<VPT>(l, E, k, renormalize, replay, out_ids, out_w);
    if (s_ids) {
      __syncwarp();
      for (int s = threadIdx.x & 31; s < k; s += 32) s_ids[s] = replay[s];
    }
    return;
  }
  const int lane = threadIdx.x & 31;
  float v[VPT];
  uint32_t is_num = 0;  // bit i: expert i * 32 + lane exists and its logit is a number
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    v[i] = e < E ? l[e] : NAN;
    if (e < E && !isnan(v[i])) {
      m = fmaxf(m, v[i]);
      is_num |= 1u << i;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  double part = 0.0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    float p = 0.0f;
    if (e < E && !isnan(v[i]) && !isinf(m)) p = float(exp(double(v[i] - m)));
    if (e < E) part += double(p);
    v[i] = p;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  const double denom = part;

  uint64_t key[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    if (e < E) {
      const float p = denom > 0.0 ? float(double(v[i]) / denom) : 0.0f;
      key[i] = (uint64_t((is_num >> i) & 1u) << 63) | (uint64_t(__float_as_uint(p)) << 32) | uint64_t(~uint32_t(e));
    } else {
      key[i] = 0;
    }
  }
  // Descending sort of the lane's keys (keys are distinct or 0).
#pragma unroll
  for (int pass = 0; pass < VPT; ++pass)
#pragma unroll
    for (int i = pass & 1; i + 1 < VPT; i += 2) {
      const uint64_t a = key[i], b = key[i + 1];
      key[i] = a > b ? a : b;
      key[i + 1] = a > b ? b : a;
    }

  pick_sorted<VPT>(key, k, renormalize, out_ids, out_w, s_ids);
}

/// Shared memory of one row's topk_row_wide (VPT warps).
template <int VPT>
struct WideTopkSmem {
  float p[32 * VPT];          // unnormalised probabilities, by expert
  uint64_t cand[32 * VPT];    // warp w's local top-min(k, 32) keys at [w * min(k, 32), ...), descending
  float warp_max[VPT];
  double denom;
};

/// topk_row_fast's ids and weights, bit for bit, by VPT warps for one row: warp w lane l holds expert
/// w * 32 + l. The max is order-free; each thread computes its own exp; the fp64 sum is taken by warp 0
/// in topk_row_fast's order (lane l adds experts l, 32 + l, ... in turn, then the same butterfly); each
/// warp takes its local top-min(k, 32) keys (redux.sync rounds), and warp 0 picks the row's top k from
/// those candidates (pick_sorted over per-lane lists that stay sorted: lane l reads warp l % VPT's slots
/// l / VPT, l / VPT + 32 / VPT, ...). Every thread of the CTA must call it (it has __syncthreads);
/// `active` false for a group without a row (l unread). w: the warp's index in its group [0, VPT).
/// No replay (topk_row_fast serves it).
template <int VPT>
__device__ __forceinline__ void topk_row_wide(const float* __restrict__ l, int E, int k, bool renormalize,
                                              bool active, int w, WideTopkSmem<VPT>& sm, int32_t* out_ids,
                                              float* out_w, int* s_ids) {
  static_assert(VPT >= 2 && VPT <= 16 && (VPT & (VPT - 1)) == 0, "VPT warps a row: a power of two in [2, 16]");
  const int lane = threadIdx.x & 31;
  const int e = w * 32 + lane;
  const bool exists = active && e < E;
  const float v = exists ? l[e] : NAN;
  const bool is_num = exists && !isnan(v);
  float m = detail::warp_max(is_num ? v : -INFINITY);
  if (lane == 0) sm.warp_max[w] = m;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < VPT; ++i) m = fmaxf(m, sm.warp_max[i]);
  float p = 0.0f;
  if (is_num && !isinf(m)) p = float(exp(double(v - m)));
  sm.p[e] = p;
  __syncthreads();
  if (w == 0 && active) {
    double part = 0.0;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      if (i * 32 + lane < E) part += double(sm.p[i * 32 + lane]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0) sm.denom = part;
  }
  __syncthreads();
  const double denom = active ? sm.denom : 0.0;  // a group without a row never wrote it
  uint64_t key = 0;
  if (exists) {
    const float q = denom > 0.0 ? float(double(p) / denom) : 0.0f;
    key = (uint64_t(is_num) << 63) | (uint64_t(__float_as_uint(q)) << 32) | uint64_t(~uint32_t(e));
  }
  const int kk = k < 32 ? k : 32;
  uint64_t mine = 0;  // lane s: the warp's s-th largest key
  for (int s = 0; s < kk; ++s) {
    const uint32_t hi = uint32_t(key >> 32), lo = uint32_t(key);
    const uint32_t mhi = __reduce_max_sync(0xffffffffu, hi);
    const uint32_t mlo = __reduce_max_sync(0xffffffffu, hi == mhi ? lo : 0u);
    if (hi == mhi && lo == mlo) key = 0;
    if (lane == s) mine = (uint64_t(mhi) << 32) | mlo;
  }
  if (active && lane < kk) sm.cand[w * kk + lane] = mine;
  __syncthreads();
  if (w == 0 && active) {
    constexpr int kLanesPerList = 32 / VPT;
    const int src = lane % VPT, s0 = lane / VPT;
    uint64_t list[VPT];
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int s = s0 + j * kLanesPerList;
      list[j] = s < kk ? sm.cand[src * kk + s] : 0;
    }
    pick_sorted<VPT>(list, k, renormalize, out_ids, out_w, s_ids);
  }
}

}  // namespace moefold::cuda::moe_detail
