// Building blocks of the cluster sampler (sampling_cluster.cu, the only includer): the per-row context
// (shared copy of the row, active sets, exchange slots over distributed shared memory), fixed-order
// block and cluster reductions, and the selects: count_select (top_k, top_logprobs; 8-bit digits),
// radix_select (top_p's mass select; 4-bit digits), finish_select (the tie cut). The file comment of
// sampling_cluster.cu describes the algorithm and its determinism.
#pragma once
#include <cooperative_groups.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "ops/cuda/sampling.h"

namespace moefold::cuda::cluster_select {
namespace cg = cooperative_groups;


constexpr int kT = 256;  // threads per CTA
constexpr int kWarpsT = kT / 32;
constexpr int kBins = 16;        // 4-bit radix digits (top_p's mass select)
static_assert(kT == 256, "count_select: one thread per 8-bit bin");
constexpr int kMaxCs = 151;      // entries per thread at most (odd): bounds the shared copy of a row
constexpr float kGreedyT = 1e-5f;  // SamplingParams::kGreedyTemperature

struct Best {
  float v;
  int32_t i;  // INT_MAX: none
};

__device__ __forceinline__ bool better(Best a, Best b) {
  if (a.i == INT_MAX) return false;
  if (b.i == INT_MAX) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

/// Ordered key of a logit: larger float -> larger key; -0.0 keyed as +0.0 (equal values for the CPU).
__device__ __forceinline__ uint32_t okey(float v) {
  uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_okey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

/// One CTA's contribution to an exchange.
struct Slot {
  uint32_t h8[256];  // count_select's CTA histogram
  double d[kBins];
  uint32_t u[kBins];
  uint64_t keys[kMaxTopLogprobs];
  float bv;
  int32_t bi, flags, n;
};

struct Shared {
  Slot slot[2];
  double gd[kBins];
  uint32_t gu[kBins];
  uint32_t h8[256];  // count_select's histogram, CTA-local selects
  double wd[kWarpsT];
  uint32_t wu[kWarpsT];
  uint32_t bu[kWarpsT][kBins];
  double bd[kWarpsT][kBins];
  double cw[kT];       // fast path: candidate weights (-1 = dropped)
  int16_t order[kT];   // fast path: candidate index by rank
  int16_t crank[kT];   // fast path: rank of each candidate
  Best wb[kWarpsT];
  int32_t wi[kWarpsT];
  double target, acc;
  int64_t need;
  int32_t sel, done, count, tok;
};

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Best c{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    if (better(c, b)) b = c;
  }
  return b;
}

/// The per-row context: the shared copy, the active sets, the private bins, the cluster.
struct Ctx {
  cg::cluster_group cluster;
  Shared* sh;
  float* xs;       // [kT * cs]
  uint32_t* act;   // [nw][kT]
  uint32_t* wk;    // [nw][kT]
  int C, rank, cs, nw, t, nt;  // nt: this thread's entries
  int64_t base;                // first id of this CTA
  int parity;
  __device__ int64_t id(int j) const { return base + int64_t(t) * cs + j; }
  __device__ float x(int j) const { return xs[t * cs + j]; }

  /// Publishes this CTA's slot (filled by the caller before) and returns the slots of all ranks.
  __device__ Slot* exchange() {
    cluster.sync();
    Slot* s = &sh->slot[parity];
    parity ^= 1;
    return s;
  }
  __device__ Slot* remote(Slot* s, int r) { return cluster.map_shared_rank(s, r); }
  __device__ Slot& mine() { return sh->slot[parity]; }

  // ---- block reductions (fixed order) ----
  __device__ double block_sum(double v) {
    const int w = t >> 5, l = t & 31;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (l == 0) sh->wd[w] = v;
    __syncthreads();
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < kWarpsT; ++i) s += sh->wd[i];
    __syncthreads();
    return s;
  }
  __device__ uint32_t block_sum_u(uint32_t v) {
    const int w = t >> 5, l = t & 31;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (l == 0) sh->wu[w] = v;
    __syncthreads();
    uint32_t s = 0;
#pragma unroll
    for (int i = 0; i < kWarpsT; ++i) s += sh->wu[i];
    __syncthreads();
    return s;
  }
  __device__ int32_t block_max_i(int32_t v) {
    const int w = t >> 5, l = t & 31;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (l == 0) sh->wi[w] = v;
    __syncthreads();
    int32_t s = INT_MIN;
#pragma unroll
    for (int i = 0; i < kWarpsT; ++i) s = max(s, sh->wi[i]);
    __syncthreads();
    return s;
  }
  __device__ Best block_best(Best b) {
    const int w = t >> 5, l = t & 31;
    b = warp_best(b);
    if (l == 0) sh->wb[w] = b;
    __syncthreads();
    Best r{-INFINITY, INT_MAX};
#pragma unroll
    for (int i = 0; i < kWarpsT; ++i)
      if (better(sh->wb[i], r)) r = sh->wb[i];
    __syncthreads();
    return r;
  }
  /// Inclusive scan over threads in order (fixed order): returns inc(t); excl = inc(t - 1) computed by
  /// the same operations (bitwise equal), 0 for t = 0; total = inc(kT - 1).
  __device__ double block_scan(double v, double& excl, double& total) {
    const int w = t >> 5, l = t & 31;
    double inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, inc, o);
      if (l >= o) inc += y;
    }
    const double prev = __shfl_up_sync(0xffffffffu, inc, 1);
    if (l == 31) sh->wd[w] = inc;
    __syncthreads();
    double before = 0.0, tot = 0.0;
    for (int i = 0; i < kWarpsT; ++i) {
      if (i < w) before += sh->wd[i];
      tot += sh->wd[i];
    }
    __syncthreads();
    // inc(t) = before(w) + lane scan; lane 31 of warp w-1 gives before(w - 1) + wd[w - 1] = before(w).
    excl = l == 0 ? before : before + prev;
    total = tot;
    return before + inc;
  }
  __device__ uint32_t block_excl_scan_u(uint32_t v, uint32_t& total) {
    const int w = t >> 5, l = t & 31;
    uint32_t inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, inc, o);
      if (l >= o) inc += y;
    }
    if (l == 31) sh->wu[w] = inc;
    __syncthreads();
    uint32_t before = 0, tot = 0;
    for (int i = 0; i < kWarpsT; ++i) {
      if (i < w) before += sh->wu[i];
      tot += sh->wu[i];
    }
    __syncthreads();
    total = tot;
    return before + inc - v;
  }

  // ---- active sets ----
  template <class Pred>
  __device__ uint32_t set_active(Pred pred) {  // act = {j : pred(x_j, j)}; returns this thread's count
    uint32_t n = 0;
    for (int w = 0; w < nw; ++w) {
      uint32_t bits = 0;
      const int j0 = w * 32, j1 = min(nt, j0 + 32);
      for (int j = j0; j < j1; ++j)
        if (pred(x(j))) bits |= 1u << (j - j0);
      act[w * kT + t] = bits;
      n += __popc(bits);
    }
    return n;
  }
};

/// Visits the set bits of `set` (this thread's words) in ascending entry order: f(j).
template <class F>
__device__ __forceinline__ void for_each(const Ctx& c, const uint32_t* set, F f) {
  for (int w = 0; w < c.nw; ++w) {
    uint32_t bits = set[w * kT + c.t];
    while (bits) {
      const int b = __ffs(bits) - 1;
      bits &= bits - 1;
      f(w * 32 + b);
    }
  }
}

/// Lane r (< c.C) of every warp reads f(slot of rank r); other lanes get `fill`. All C loads of a warp
/// are in flight at once; the callers then fold across lanes with shuffles in rank order, so every
/// thread holds the same cluster-wide result without another barrier.
template <class T, class F>
__device__ __forceinline__ T lane_rank(Ctx& c, Slot* s, T fill, F f) {
  const int lane = c.t & 31;
  return lane < c.C ? f(c.remote(s, lane)) : fill;
}

/// Sum over ranks 0 .. C-1 in rank order of each lane's value (lane r holds rank r's).
__device__ __forceinline__ double ordered_sum(const Ctx& c, double v) {
  double s = 0.0;
  for (int r = 0; r < c.C; ++r) s += __shfl_sync(0xffffffffu, v, r);
  return s;
}

/// The end of a select with boundary key `prefix` (okey bits): early = the whole boundary bin is
/// kept (act = {key >= prefix}); else c.wk holds the ties at the boundary value and the j lowest ids
/// of them are kept beside everything above (act = {key > prefix} + those ties).
template <bool kLocal>
__device__ void finish_select(Ctx& c, uint32_t prefix, bool early, int64_t j) {
  const int t = c.t;
  if (early) {
    for (int w = 0; w < c.nw; ++w) {
      uint32_t bits = c.act[w * kT + t], keep = 0, b2 = bits;
      while (b2) {
        const int b = __ffs(b2) - 1;
        b2 &= b2 - 1;
        if (okey(c.x(w * 32 + b)) >= prefix) keep |= 1u << b;
      }
      c.act[w * kT + t] = keep;
    }
    __syncthreads();
    return;
  }
  uint32_t mine_n = 0;
  for (int w = 0; w < c.nw; ++w) mine_n += __popc(c.wk[w * kT + t]);
  uint32_t cta_total;
  const uint32_t my_off = c.block_excl_scan_u(mine_n, cta_total);
  int64_t off = 0;
  if (!kLocal) {
    if (t == 0) c.mine().u[0] = cta_total;
    Slot* s = c.exchange();
    const uint32_t ov = lane_rank(c, s, 0u, [](const Slot* rs) { return rs->u[0]; });
    off = __reduce_add_sync(0xffffffffu, (t & 31) < c.rank ? ov : 0u);
  }
  int64_t rank_i = off + my_off;
  for (int w = 0; w < c.nw; ++w) {
    uint32_t ties = c.wk[w * kT + t], keep = 0;
    while (ties) {
      const int b = __ffs(ties) - 1;
      ties &= ties - 1;
      if (rank_i < j) keep |= 1u << b;
      ++rank_i;
    }
    uint32_t bits = c.act[w * kT + t], above = 0;
    while (bits) {
      const int b = __ffs(bits) - 1;
      bits &= bits - 1;
      if (okey(c.x(w * 32 + b)) > prefix) above |= 1u << b;
    }
    c.act[w * kT + t] = above | keep;
  }
  __syncthreads();
}

/// Count select with 8-bit digits (4 rounds at most): narrows c.act to its k best keys (k < |act|).
/// Per round a CTA histogram of 256 bins (shared-memory integer atomics: exact in any order), merged
/// over the cluster (kLocal = false) by each thread reading its bin from every rank.
template <bool kLocal>
__device__ void count_select(Ctx& c, int64_t k) {
  Shared* sh = c.sh;
  const int t = c.t;
  for (int w = 0; w < c.nw; ++w) c.wk[w * kT + t] = c.act[w * kT + t];
  uint32_t prefix = 0;
  int64_t need = k;
  bool early = false;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint32_t* h = kLocal ? sh->h8 : c.mine().h8;
    h[t] = 0;  // kT == 256 bins
    __syncthreads();
    for_each(c, c.wk, [&](int j) { atomicAdd(&h[int(okey(c.x(j)) >> shift) & 255], 1u); });
    // Thread t holds bin d = 255 - t: the scan over threads runs from the top bin down.
    const int d = 255 - t;
    uint32_t n;
    if (kLocal) {
      __syncthreads();
      n = h[d];
    } else {
      Slot* s = c.exchange();
      n = 0;
#pragma unroll
      for (int r = 0; r < 16; ++r)
        if (r < c.C) n += c.remote(s, r)->h8[d];
    }
    uint32_t total;
    const uint32_t above = c.block_excl_scan_u(n, total);  // keys in bins > d (this round's range)
    if (int64_t(above) < need && int64_t(above) + n >= need) {  // the bin holding the k-th key
      sh->sel = d;
      sh->need = need - above;
      sh->count = int32_t(n);
    }
    __syncthreads();
    const int sel = sh->sel;
    need = sh->need;
    early = int64_t(sh->count) == need;
    prefix |= uint32_t(sel) << shift;
    for (int w = 0; w < c.nw; ++w) {  // keep the chosen digit's entries
      uint32_t bits = c.wk[w * kT + t], keep = 0;
      while (bits) {
        const int b = __ffs(bits) - 1;
        bits &= bits - 1;
        if ((int(okey(c.x(w * 32 + b)) >> shift) & 255) == sel) keep |= 1u << b;
      }
      c.wk[w * kT + t] = keep;
    }
    if (early) break;
    __syncthreads();  // sh->sel / need / count are rewritten next round
  }
  finish_select<kLocal>(c, prefix, early, need);
}

/// Narrows c.act to the selection (see the file comment). kMass = false: the `k` best keys (k < |act|).
/// kMass = true: the shortest prefix in key-descending order whose weight reaches top_p * (weight of
/// act); weight(v) gives an entry's weight.
template <bool kMass, bool kLocal = false, class W>
__device__ void radix_select(Ctx& c, int64_t k, float top_p, W weight) {
  Shared* sh = c.sh;
  const int t = c.t;
  for (int w = 0; w < c.nw; ++w) c.wk[w * kT + t] = c.act[w * kT + t];
  uint32_t prefix = 0;
  if (t == 0) {
    sh->need = k;
    sh->acc = 0.0;
  }
  int shift = 28;
  bool early = false;
  for (; shift >= 0; shift -= 4) {
    // Private bins in registers (fully unrolled: no local memory), then a fixed-order reduction:
    // lanes (__reduce_add_sync for counts, a shuffle tree for weights), warps in order.
    uint32_t cnt[kBins];
    double mas[kBins];
#pragma unroll
    for (int d = 0; d < kBins; ++d) {
      cnt[d] = 0;
      mas[d] = 0.0;
    }
    for_each(c, c.wk, [&](int j) {
      const float v = c.x(j);
      const int dg = int(okey(v) >> shift) & (kBins - 1);
      const double wv = kMass ? weight(v) : 0.0;
#pragma unroll
      for (int d = 0; d < kBins; ++d)
        if (dg == d) {
          cnt[d] += 1;
          if (kMass) mas[d] += wv;
        }
    });
    {
      const int warp = t >> 5, lane = t & 31;
#pragma unroll
      for (int d = 0; d < kBins; ++d) {
        const uint32_t n = __reduce_add_sync(0xffffffffu, cnt[d]);
        double m = mas[d];
        if (kMass) {
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
        }
        if (lane == 0) {
          sh->bu[warp][d] = n;
          sh->bd[warp][d] = m;
        }
      }
      __syncthreads();
      if (t < kBins) {
        uint32_t n = 0;
        double m = 0.0;
#pragma unroll
        for (int w = 0; w < kWarpsT; ++w) {
          n += sh->bu[w][t];
          m += sh->bd[w][t];
        }
        if (kLocal) {
          sh->gu[t] = n;
          sh->gd[t] = m;
        } else {
          c.mine().u[t] = n;
          c.mine().d[t] = m;
        }
      }
    }
    if (!kLocal) {  // thread t: bin t / 16 of rank t % 16; ordered sums within each 16-lane group
      Slot* s = c.exchange();
      const int g = t >> 4, r = t & 15, lane = t & 31, base = lane & 16;
      uint32_t n = 0;
      double m = 0.0;
      if (r < c.C) {
        const Slot* rs = c.remote(s, r);
        n = rs->u[g];
        if (kMass) m = rs->d[g];
      }
      uint32_t ns = n;  // integers: any order
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) ns += __shfl_xor_sync(0xffffffffu, ns, o);
      double ms = 0.0;
      if (kMass)
        for (int q = 0; q < c.C; ++q) ms += __shfl_sync(0xffffffffu, m, base + q);
      if (r == 0) {
        sh->gu[g] = ns;
        sh->gd[g] = ms;
      }
    }
    __syncthreads();
    if (t == 0) {
      if (kMass && shift == 28) {
        double z = 0.0;
        for (int d = kBins - 1; d >= 0; --d) z += sh->gd[d];
        sh->target = double(top_p) * z;
      }
      int sel = -1, lowest = -1;
      int64_t need = sh->need;
      double acc = sh->acc;
      for (int d = kBins - 1; d >= 0; --d) {
        const uint32_t n = sh->gu[d];
        if (n == 0) continue;
        lowest = d;
        if (!kMass) {
          if (int64_t(n) >= need) {
            sel = d;
            break;
          }
          need -= n;
        } else {
          if (acc + sh->gd[d] >= sh->target) {
            sel = d;
            break;
          }
          acc += sh->gd[d];
        }
      }
      if (sel < 0) {  // top_p: rounding never reached the target: keep the whole range (CPU: last = hi - 1)
        sel = lowest;
        acc -= sh->gd[lowest];
      }
      sh->sel = sel;
      sh->need = need;
      sh->acc = acc;
      sh->count = int32_t(sh->gu[sel]);
      sh->done = kMass ? sh->gu[sel] == 1 : int64_t(sh->gu[sel]) == need;
    }
    __syncthreads();
    const int sel = sh->sel;
    prefix |= uint32_t(sel) << shift;
    early = sh->done != 0;
    for (int w = 0; w < c.nw; ++w) {  // keep the chosen digit's entries
      uint32_t bits = c.wk[w * kT + t], keep = 0;
      uint32_t b2 = bits;
      while (b2) {
        const int b = __ffs(b2) - 1;
        b2 &= b2 - 1;
        if ((int(okey(c.x(w * 32 + b)) >> shift) & (kBins - 1)) == sel) keep |= 1u << b;
      }
      c.wk[w * kT + t] = keep;
    }
    if (early) break;
  }
  int64_t j = 0;
  if (!early) {
    const int64_t cnt = sh->count;
    const double wv = weight(from_okey(prefix));
    const double q = wv > 0.0 ? (sh->target - sh->acc) / wv : double(cnt);
    j = q >= double(cnt) ? cnt : int64_t(ceil(q));
    j = j < 1 ? 1 : (j > cnt ? cnt : j);
  }
  finish_select<kLocal>(c, prefix, early, j);
}

}  // namespace moefold::cuda::cluster_select
