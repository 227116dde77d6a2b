// The one-kernel sampler (sampling.h, sample_rows_cluster): one thread-block cluster per row.
//
// Layout. A cluster of C CTAs (16, or 8 where 16 cannot be scheduled) of kT threads owns one row; CTA
// `rank` owns the contiguous ids [rank * kT * cs, (rank + 1) * kT * cs) and thread t of it the ids
// [base + t * cs, base + (t + 1) * cs) (cs odd, so that thread-strided shared-memory reads hit distinct
// banks). The row is read from global memory ONCE into shared memory; every later pass reads it
// there. Per-thread "active sets" (bit words over the thread's cs entries) hold the candidates of a
// step and shrink as the steps go. About 68 KB of shared memory per CTA at V = 248,320: three CTAs per SM. Cross-CTA values travel through distributed shared memory: each
// CTA writes its partial into a slot, cluster.sync(), and every CTA reads all C slots in rank order
// (double-buffered slots, so one barrier per exchange).
//
// Steps per row, in the CPU sampler's order (runtime/sampler.h): raw max / NaN / +inf during the load;
// raw log-sum-exp and top_logprobs (rows with top_n >= 0); the penalties on the shared copy (and on the
// global row, with the raw values saved); the penalized max; then greedy, or min_p (a predicate), top_k
// (count radix select), top_p (mass radix select) and the inverse-CDF draw in ascending id order; the
// sampled token's raw logprob.
//
// Radix select. top_k and top_logprobs: count selects over 8-bit digits of the ordered 32-bit float
// key (larger logit -> larger key, -0 == +0), 4 rounds at most, a CTA histogram of integer shared-memory
// atomics per round (exact in any order); top_logprobs selects inside each CTA (no cluster barrier per
// round) and merges the C * n candidates in one warp. top_p: a mass select over 4-bit digits, 8 rounds
// at most. Each round, every thread counts (and, for top_p, sums the weights of) its active
// entries per digit into private bins in registers (no atomics), the CTA adds the bins in a fixed
// tree, the cluster in rank order; the chosen digit's entries stay active. A round stops the select early when
// the chosen bin is taken whole (top_k: its count is what is still needed; top_p: it holds one
// entry). After the last round the active entries are the ties at the boundary value, and the
// lowest ids among them are kept (the CPU's tie order), ranked across threads and CTAs by a scan.
//
// Determinism. Every sum has a fixed order that depends only on the row (per-thread sequential, a
// fixed shuffle tree, ranks in order) and every comparison is the CPU's, in the same precision, so a
// row's results are bitwise reproducible and independent of the other rows and the row count. They
// differ from the CPU's only where the CPU's own order of double additions would decide (u * Z or
// top_p * Z within ~1e-15 relative of a boundary).
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cooperative_groups.h>

#include <cfloat>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/sampling.h"

namespace moefold::cuda {
using namespace detail;
namespace cg = cooperative_groups;
namespace {

constexpr int kT = 256;  // threads per CTA
constexpr int kWarpsT = kT / 32;
constexpr int kBins = 16;        // 4-bit radix digits (top_p's mass select)
static_assert(kT == 256, "count_select: one thread per 8-bit bin");
constexpr int kMaxCs = 151;      // entries per thread at most (odd): bounds the shared copy of a row
static_assert(kMaxCs <= kT, "the draw's walk keeps one chunk's weights in Shared::cw");
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
  uint32_t kand[kWarpsT], kor[kWarpsT];  // per warp: AND / OR of the keys entering a select round
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

/// Visits the members of `set` in ascending entry order as f(j, w) with w = weight(x_j), the
/// weights of 4 consecutive entries computed before any is used: independent double exp chains in
/// flight (the sums stay in entry order). All lanes run the same trip count (cs), members or not.
template <class W, class F>
__device__ __forceinline__ void for_each_weighted(const Ctx& c, const uint32_t* set, W weight, F f) {
  for (int j0 = 0; j0 < c.cs; j0 += 4) {
    const uint32_t word = set[(j0 >> 5) * kT + c.t] >> (j0 & 31);  // 4 | 32: the 4 bits lie in one word
    if (!(word & 15u)) continue;
    double w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) w[u] = (word >> u) & 1u ? weight(c.x(j0 + u)) : 0.0;
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if ((word >> u) & 1u) f(j0 + u, w[u]);
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

/// AND and OR of every key entering this round, over the CTA (kLocal) or the cluster: equal = one value.
template <bool kLocal>
__device__ __forceinline__ bool all_keys_equal(Ctx& c, Slot* s, uint32_t& key) {
  uint32_t a = ~0u, o = 0u;
  const int lane = c.t & 31;
  if (kLocal ? lane == 0 : lane < c.C) {
    const Slot* rs = kLocal ? &c.mine() : c.remote(s, lane);
#pragma unroll
    for (int w = 0; w < kWarpsT; ++w) {
      a &= rs->kand[w];
      o |= rs->kor[w];
    }
  }
  a = __reduce_and_sync(0xffffffffu, a);
  o = __reduce_or_sync(0xffffffffu, o);
  key = a;
  return a == o;
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
    // Shared-memory integer atomics (exact in any order; measured faster than warp aggregation).
    uint32_t kand = ~0u, kor = 0u;
    for_each(c, c.wk, [&](int j) {
      const uint32_t key = okey(c.x(j));
      kand &= key;
      kor |= key;
      atomicAdd(&h[int(key >> shift) & 255], 1u);
    });
    kand = __reduce_and_sync(0xffffffffu, kand);
    kor = __reduce_or_sync(0xffffffffu, kor);
    if ((t & 31) == 0) {
      c.mine().kand[t >> 5] = kand;
      c.mine().kor[t >> 5] = kor;
    }
    // Thread t holds bin d = 255 - t: the scan over threads runs from the top bin down.
    const int d = 255 - t;
    uint32_t n;
    Slot* s = nullptr;
    if (kLocal) {
      __syncthreads();
      n = h[d];
    } else {
      s = c.exchange();
      n = 0;
#pragma unroll
      for (int r = 0; r < 16; ++r)
        if (r < c.C) n += c.remote(s, r)->h8[d];
    }
    uint32_t same_key;
    if (all_keys_equal<kLocal>(c, s, same_key)) {  // one value left: the rest is the tie cut
      prefix = same_key;
      early = false;
      break;
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
    uint32_t kand = ~0u, kor = 0u;
    for_each(c, c.wk, [&](int j) {  // (4-wide weights here spilled the bins: measured 2x slower)
      const float v = c.x(j);
      const uint32_t key = okey(v);
      const double wv = kMass ? weight(v) : 0.0;
      kand &= key;
      kor |= key;
      const int dg = int(key >> shift) & (kBins - 1);
#pragma unroll
      for (int d = 0; d < kBins; ++d)
        if (dg == d) {
          cnt[d] += 1;
          if (kMass) mas[d] += wv;
        }
    });
    {
      const int warp = t >> 5, lane = t & 31;
      kand = __reduce_and_sync(0xffffffffu, kand);
      kor = __reduce_or_sync(0xffffffffu, kor);
      if (lane == 0) {
        c.mine().kand[warp] = kand;
        c.mine().kor[warp] = kor;
      }
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
    Slot* s = nullptr;
    if (!kLocal) {  // thread t: bin t / 16 of rank t % 16; ordered sums within each 16-lane group
      s = c.exchange();
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
    uint32_t same_key;
    const bool same = all_keys_equal<kLocal>(c, s, same_key);  // one value left: go to the tie cut
    __syncthreads();
    if (t == 0) {
      if (kMass && shift == 28) {
        double z = 0.0;
        for (int d = kBins - 1; d >= 0; --d) z += sh->gd[d];
        sh->target = double(top_p) * z;
      }
      if (same) {
        uint32_t tot = 0;
        for (int d = 0; d < kBins; ++d) tot += sh->gu[d];
        sh->count = int32_t(tot);
      }
    }
    if (same) {
      __syncthreads();
      prefix = same_key;
      early = false;
      break;
    }
    if (t == 0) {
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

__global__ void __launch_bounds__(kT, 3)
    cluster_sample_kernel(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, ClusterSampleArgs a, int cs,
                          const int32_t* live) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ Shared shared;
  Ctx c{cg::this_cluster()};
  c.sh = &shared;
  c.C = int(c.cluster.num_blocks());
  c.rank = int(c.cluster.block_rank());
  const int64_t row = blockIdx.x / c.C;
  if (row >= live_count(live, max_rows)) return;  // the whole cluster leaves together
  c.cs = cs;
  c.nw = (cs + 31) / 32;
  c.t = int(threadIdx.x);
  c.parity = 0;
  c.xs = reinterpret_cast<float*>(dyn);
  c.act = reinterpret_cast<uint32_t*>(c.xs + kT * cs);
  c.wk = c.act + c.nw * kT;
  c.base = int64_t(c.rank) * kT * cs;
  int64_t n_slice = vocab - c.base;
  n_slice = n_slice < 0 ? 0 : (n_slice > int64_t(kT) * cs ? int64_t(kT) * cs : n_slice);
  const int64_t nt = n_slice - int64_t(c.t) * cs;
  c.nt = int(nt < 0 ? 0 : (nt > cs ? cs : nt));
  const int t = c.t;
  Shared* sh = c.sh;

  // ---- the one read of the row ----
  float* xrow = logits + row * ld;
  {
    const float* src = xrow + c.base;
    int64_t done = 0;
    if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
      const float4* s4 = reinterpret_cast<const float4*>(src);
      float4* d4 = reinterpret_cast<float4*>(c.xs);
      const int64_t n4 = n_slice / 4;
      for (int64_t i = t; i < n4; i += 4 * kT) {  // 4 loads in flight per thread (cp.async measured slower)
        float4 q[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (i + u * kT < n4) q[u] = s4[i + u * kT];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (i + u * kT < n4) d4[i + u * kT] = q[u];
      }
      done = 4 * n4;
    }
    for (int64_t i = done + t; i < n_slice; i += kT) c.xs[i] = src[i];
  }
  __syncthreads();

  // Row parameters.
  const bool sampled_args = a.sample.temperature != nullptr;
  const float temp = sampled_args ? a.sample.temperature[row] : 0.0f;
  const int32_t top_n = a.top_n ? a.top_n[row] : -1;
  const bool want_lp = top_n >= 0;
  int32_t b0 = 0, b1 = 0;
  if (a.penalties.offsets) {
    b0 = a.penalties.offsets[row];
    b1 = a.penalties.offsets[row + 1];
  }

  auto scan_best = [&](int& nan, int& pinf) {
    Best b{-INFINITY, INT_MAX};
    nan = 0;
    pinf = 0;
    for (int j = 0; j < c.nt; ++j) {
      const float v = c.x(j);
      if (isnan(v)) {
        nan = 1;
        continue;
      }
      if (v == INFINITY) pinf = 1;
      if (b.i == INT_MAX || v > b.v) b = Best{v, int32_t(c.id(j))};  // ascending ids: strict keeps the lowest
    }
    return b;
  };
  // Row-wide best and flags (one exchange).
  auto row_best = [&](Best b, int nan, int pinf, int& flags) {
    b = c.block_best(b);
    const uint32_t any_nan = c.block_sum_u(uint32_t(nan)), any_pinf = c.block_sum_u(uint32_t(pinf));
    if (t == 0) {
      c.mine().bv = b.v;
      c.mine().bi = b.i;
      c.mine().flags = (any_nan ? kSampleNaN : 0) | (any_pinf ? kSamplePosInf : 0);
    }
    Slot* s = c.exchange();
    Best g{-INFINITY, INT_MAX};
    int f = 0;
    g.v = lane_rank(c, s, -INFINITY, [](const Slot* rs) { return rs->bv; });
    g.i = lane_rank(c, s, int32_t(INT_MAX), [](const Slot* rs) { return rs->bi; });
    f = lane_rank(c, s, 0, [](const Slot* rs) { return rs->flags; });
    g = warp_best(g);  // a total order: any reduction order gives the same best
    f = int(__reduce_or_sync(0xffffffffu, unsigned(f)));
    if (g.i == INT_MAX || g.v == -INFINITY) f |= kSampleEmpty;
    flags = f;
    return g;
  };

  int nan = 0, pinf = 0;
  Best local = scan_best(nan, pinf);

  // ---- raw log-softmax and top_logprobs (sampler step 1) ----
  double lse = 0.0;
  Best rb{-INFINITY, INT_MAX};
  int rf = 0;
  if (want_lp) {
    rb = row_best(local, nan, pinf, rf);
    const double m = rb.i == INT_MAX ? -INFINITY : double(rb.v);
    double s = 0.0;
    for (int j = 0; j < c.nt; ++j) {
      const float v = c.x(j);
      if (!isnan(v)) s += exp(double(v) - m);  // exp(-inf) = 0
    }
    s = c.block_sum(s);
    if (t == 0) c.mine().d[0] = s;
    Slot* ex = c.exchange();
    const double tot = ordered_sum(c, lane_rank(c, ex, 0.0, [](const Slot* rs) { return rs->d[0]; }));
    lse = m + log(tot);
    if (c.rank == 0 && t == 0) a.lse[row] = lse;
    const int64_t n = min(int64_t(min(top_n, kMaxTopLogprobs)), vocab);
    if (n > 0 && !(rf & kSampleNaN)) {  // a row with NaN fails: lse only
      // Each CTA selects its own n best (a CTA-local radix select: no cluster barrier per round),
      // then rank 0's first warp takes the n best of those <= C * n keys.
      const uint32_t mine_all = c.set_active([](float) { return true; });
      const uint32_t cta_all = c.block_sum_u(mine_all);
      if (int64_t(cta_all) > n) count_select<true>(c, n);
      if (t == 0) sh->count = 0;
      __syncthreads();
      for_each(c, c.act, [&](int j) {
        const int slot = atomicAdd(&sh->count, 1);  // min(n, cta_all) keys here
        if (slot < kMaxTopLogprobs)
          c.mine().keys[slot] = (uint64_t(okey(c.x(j))) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(c.id(j)));
      });
      __syncthreads();
      if (t == 0) c.mine().n = min(sh->count, kMaxTopLogprobs);
      Slot* ks = c.exchange();
      if (c.rank == 0 && t < 32) {
        // Lane l holds keys [h * 10, h * 10 + 10) of rank l % 16 (h = l / 16); keys are distinct and
        // nonzero, 0 = empty or taken. n rounds of a warp-wide maximum.
        const int r = t & 15, h = t >> 4;
        uint64_t mine[10];
        const Slot* rs = r < c.C ? c.remote(ks, r) : nullptr;
        const int cnt = rs ? rs->n : 0;
#pragma unroll
        for (int q = 0; q < 10; ++q) mine[q] = h * 10 + q < cnt ? rs->keys[h * 10 + q] : 0ull;
        for (int q = 0; q < int(n); ++q) {
          uint64_t b = 0;
#pragma unroll
          for (int e = 0; e < 10; ++e) b = mine[e] > b ? mine[e] : b;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) {
            const uint64_t y = __shfl_xor_sync(0xffffffffu, b, o);
            b = y > b ? y : b;
          }
#pragma unroll
          for (int e = 0; e < 10; ++e)
            if (mine[e] == b) mine[e] = 0;  // the one holder of the winning key drops it
          if (t == 0) {
            const bool ok = b != 0;
            const int32_t id = ok ? int32_t(0xFFFFFFFFu - uint32_t(b & 0xFFFFFFFFu)) : -1;
            a.top_ids[row * kMaxTopLogprobs + q] = id;
            a.top_logprobs[row * kMaxTopLogprobs + q] = ok ? float(double(from_okey(uint32_t(b >> 32))) - lse) : NAN;
          }
        }
      }
    }
  }

  // ---- penalties (step 2) on the shared copy and the global row; raw values saved ----
  const PenaltyRows& pen = a.penalties;
  const bool penalized = b1 > b0;
  if (penalized) {
    const float rep = pen.repetition[row], fr = pen.frequency[row], pr = pen.presence[row];
    const int64_t n_slice_ids = n_slice;
    for (int32_t j = b0 + t; j < b1; j += kT) {
      const int32_t tok = pen.tokens[j];
      if (tok < 0 || tok >= vocab) continue;
      const int64_t li = int64_t(tok) - c.base;
      if (li < 0 || li >= n_slice_ids) continue;
      float v = c.xs[li];
      pen.saved[j] = v;
      if (rep != 1.0f) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
      const int32_t cnt = pen.counts[j];
      if (cnt > 0) {
        if (fr != 0.0f) v = __fsub_rn(v, __fmul_rn(fr, float(cnt)));
        if (pr != 0.0f) v = __fsub_rn(v, pr);
      }
      c.xs[li] = v;
      xrow[tok] = v;
    }
    __syncthreads();
    local = scan_best(nan, pinf);
  }
  int flags = rf;
  const Best best = want_lp && !penalized ? rb : row_best(local, nan, pinf, flags);

  // ---- selection (steps 3-8) ----
  int32_t tok = -1;
  bool lp_done = false;  // the fast path wrote the logprob
  const bool greedy = !sampled_args || temp < kGreedyT || (flags & (kSamplePosInf | kSampleEmpty));
  if (greedy) {
    tok = best.i == INT_MAX ? -1 : best.i;  // +inf rows: the lowest-id +inf entry is the best
  } else {
    const double xm = double(best.v), tt = double(temp);
    const float min_p = a.sample.min_p ? a.sample.min_p[row] : 0.0f;
    const bool use_min_p = min_p > 0.0f;
    const double log_min_p = use_min_p ? log(double(min_p)) : 0.0;
    auto alive = [&](float v) {
      return !isnan(v) && v != -INFINITY && (!use_min_p || (double(v) - xm) / tt >= log_min_p);
    };
    auto weight = [&](float v) { return exp((double(v) - xm) / tt); };
    const uint32_t my_alive = c.set_active(alive);
    const int32_t k = a.sample.top_k[row];
    const float top_p = a.sample.top_p[row];
    const uint32_t cta_alive = c.block_sum_u(my_alive);
    if (t == 0) c.mine().u[0] = cta_alive;
    Slot* sa = c.exchange();
    const int64_t n_alive =
        __reduce_add_sync(0xffffffffu, lane_rank(c, sa, 0u, [](const Slot* rs) { return rs->u[0]; }));
    int64_t n_surv = n_alive;
    if (k > 0 && int64_t(k) < n_alive) {
      count_select<false>(c, k);
      n_surv = k;
    }
    // Few survivors (top_k <= 256, or a tight min_p): gather them, in id order, into rank 0's scratch
    // and finish there with the CPU's own sequential sums: no further cluster barrier.
    const int64_t cap = min(kT, c.nw * kT / 2);
    if (n_surv <= cap) {
      uint32_t mine_n = 0;
      for (int w = 0; w < c.nw; ++w) mine_n += __popc(c.act[w * kT + t]);
      uint32_t cta_n;
      const uint32_t my_off = c.block_excl_scan_u(mine_n, cta_n);
      if (t == 0) c.mine().u[0] = cta_n;
      Slot* sg = c.exchange();  // also: every CTA is past its radix select, rank 0's wk is free
      const uint32_t ov = lane_rank(c, sg, 0u, [](const Slot* rs) { return rs->u[0]; });
      int64_t pos = int64_t(__reduce_add_sync(0xffffffffu, (t & 31) < c.rank ? ov : 0u)) + my_off;
      uint2* dst = c.cluster.map_shared_rank(reinterpret_cast<uint2*>(c.wk), 0);
      for_each(c, c.act, [&](int j) { dst[pos++] = make_uint2(__float_as_uint(c.x(j)), uint32_t(c.id(j))); });
      c.cluster.sync();
      if (c.rank == 0) {
        const uint2* cand = reinterpret_cast<const uint2*>(c.wk);
        const int n = int(n_surv);
        float v = 0.0f;
        int32_t id = INT_MAX;
        if (t < n) {
          v = __uint_as_float(cand[t].x);
          id = int32_t(cand[t].y);
          sh->cw[t] = weight(v);
        }
        if (top_p < 1.0f && n > 1) {  // rank in (logit desc, id asc) order
          if (t < n) {
            int rk = 0;
            for (int q = 0; q < n; ++q) {
              const float u = __uint_as_float(cand[q].x);
              rk += u > v || (u == v && int32_t(cand[q].y) < id);
            }
            sh->order[rk] = int16_t(t);
            sh->crank[t] = int16_t(rk);
          }
          __syncthreads();
          if (t == 0) {  // the CPU's steps, sequentially: z in id order, the prefix in key order
            double z = 0.0;
            for (int q = 0; q < n; ++q) z += sh->cw[q];
            const double target = double(top_p) * z;
            double acc = 0.0;
            int last = n - 1;
            for (int q = 0; q < n; ++q) {
              acc += sh->cw[sh->order[q]];
              if (acc >= target) {
                last = q;
                break;
              }
            }
            sh->count = last;
          }
          __syncthreads();
          if (t < n && sh->crank[t] > sh->count) sh->cw[t] = -1.0;  // dropped by top_p
          __syncthreads();
        } else {
          __syncthreads();
        }
        if (t == 0) {  // the draw: inverse CDF in ascending id order
          double z = 0.0;
          int lastk = -1;
          for (int q = 0; q < n; ++q)
            if (sh->cw[q] >= 0.0) {
              z += sh->cw[q];
              lastk = q;
            }
          const double target = a.sample.uniform[row] * z;
          double cum = 0.0;
          int pick = lastk;  // only reachable through rounding
          for (int q = 0; q < n; ++q)
            if (sh->cw[q] >= 0.0) {
              cum += sh->cw[q];
              if (cum > target) {
                pick = q;
                break;
              }
            }
          sh->tok = int32_t(cand[pick].y);
          sh->wd[0] = double(__uint_as_float(cand[pick].x));  // penalized value (raw unless in the history)
        }
        __syncthreads();
        tok = sh->tok;
      }
      if (want_lp && c.rank == 0) {  // rank 0 alone knows the token here
        if (penalized) {
          for (int32_t j = b0 + t; j < b1; j += kT)
            if (pen.tokens[j] == tok) sh->wd[0] = double(__ldcg(pen.saved + j));  // another CTA's, from L2
        }
        __syncthreads();
        if (t == 0) a.logprob[row] = float(sh->wd[0] - lse);
      }
      lp_done = true;
    } else {
    if (top_p < 1.0f && n_surv > 1) radix_select<true>(c, 0, top_p, weight);

    // Draw (step 8): inverse CDF over the survivors in ascending id order.
    double mine_w = 0.0;
    int32_t last = -1;
    for_each_weighted(c, c.act, weight, [&](int j, double w) {
      mine_w += w;
      last = int32_t(c.id(j));
    });
    double excl, cta_total;
    const double inc = c.block_scan(mine_w, excl, cta_total);
    const int32_t cta_last = c.block_max_i(last);
    if (t == 0) {
      c.mine().d[0] = cta_total;
      c.mine().bi = cta_last;
    }
    Slot* s = c.exchange();
    double P = 0.0, Z = 0.0;
    int32_t row_last = -1;
    {
      const double zv = lane_rank(c, s, 0.0, [](const Slot* rs) { return rs->d[0]; });
      for (int r = 0; r < c.C; ++r) {
        if (r == c.rank) P = Z;
        Z += __shfl_sync(0xffffffffu, zv, r);
      }
      row_last = __reduce_max_sync(0xffffffffu, lane_rank(c, s, int32_t(-1), [](const Slot* rs) { return rs->bi; }));
    }
    const double target = a.sample.uniform[row] * Z;
    if (t == 0) {
      sh->tok = -1;
      sh->count = -1;
    }
    __syncthreads();
    const bool cross = P + inc > target, cross_prev = t > 0 && P + excl > target;
    if ((c.rank == 0 || !(P > target)) && cross && !cross_prev) {  // the first chunk where cum > u * Z
      sh->count = t;
      sh->acc = P + excl;
    }
    __syncthreads();
    const int win = sh->count;
    if (win >= 0 && t < 32) {  // the winner's chunk: its weights by one warp, then the walk by lane 0
      for (int j = t; j < c.cs; j += 32)
        sh->cw[j] = (c.act[(j >> 5) * kT + win] >> (j & 31)) & 1u ? weight(c.xs[win * c.cs + j]) : -1.0;
      __syncwarp();
      if (t == 0) {
        double cum = sh->acc;
        int pick = -1, lastj = -1;
        for (int j = 0; j < c.cs; ++j) {
          const double w = sh->cw[j];
          if (w < 0.0) continue;
          lastj = j;
          cum += w;
          if (cum > target) {
            pick = j;
            break;
          }
        }
        if (pick < 0) pick = lastj;  // rounding inside the chunk: its last survivor
        sh->tok = int32_t(c.base + int64_t(win) * c.cs + pick);
      }
    }
    __syncthreads();
    if (t == 0) c.mine().bi = sh->tok;
    Slot* f = c.exchange();
    tok = __reduce_max_sync(0xffffffffu, lane_rank(c, f, int32_t(-1), [](const Slot* rs) { return rs->bi; }));  // one CTA's is >= 0
    if (tok < 0) tok = row_last;  // u * Z never exceeded through rounding: the last survivor
    }
  }

  // ---- outputs ----
  if (c.rank == 0 && t == 0) {
    a.tokens[row] = tok;
    if (a.flags) a.flags[row] = flags;
    if (want_lp && tok < 0) a.logprob[row] = NAN;
  }
  if (want_lp && !lp_done && tok >= 0 && tok >= c.base && tok < c.base + n_slice) {  // the owner: raw - lse
    if (t == 0) sh->wd[0] = double(c.xs[tok - c.base]);
    __syncthreads();
    if (penalized)
      for (int32_t j = b0 + t; j < b1; j += kT)
        if (pen.tokens[j] == tok) sh->wd[0] = double(pen.saved[j]);  // distinct history ids: one writer
    __syncthreads();
    if (t == 0) a.logprob[row] = float(sh->wd[0] - lse);
  }
  c.cluster.sync();  // no CTA leaves while another may still read its slots
}

const prof::Kernel kClusterSample{"cluster_sample_kernel", prof::Category::Sampling};

struct Config {
  int cluster = 0;  // 0: unsupported
  int cs = 0;
  size_t smem = 0;
  int active = 0;  // clusters resident at once (cudaOccupancyMaxActiveClusters)
};

size_t smem_bytes(int cs) {
  const int nw = (cs + 31) / 32;
  return size_t(kT) * cs * 4 + size_t(2) * nw * kT * 4;
}

/// Cluster size and per-thread chunk for `vocab` on the current device (cached per vocabulary; the
/// kernel's attributes are set once, for the largest chunk).
Config config_for(int64_t vocab) {
  static std::mutex mu;
  static std::map<int64_t, Config> cache;
  static int attrs = -1;  // -1: not tried, 0: failed, 1: set
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(vocab); it != cache.end()) return it->second;
  Config cfg;
  if (attrs < 0) {
    int dev = 0, major = 0;
    attrs = cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
            cudaFuncSetAttribute(cluster_sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(smem_bytes(kMaxCs))) == cudaSuccess;
    if (attrs && cudaFuncSetAttribute(cluster_sample_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
                     cudaSuccess)
      attrs = 0;
    (void)cudaGetLastError();
  }
  // MOEFOLD_SAMPLER_CLUSTER=8 (or 16) pins the cluster size, for A/B measurements.
  const char* env = std::getenv("MOEFOLD_SAMPLER_CLUSTER");
  const int only = env ? std::atoi(env) : 0;
  for (int C : {16, 8}) {
    if (!attrs) break;
    if (only && C != only) continue;
    int cs = int((vocab + int64_t(C) * kT - 1) / (int64_t(C) * kT));
    cs |= 1;
    if (cs > kMaxCs) continue;
    const size_t smem = smem_bytes(cs);
    cudaLaunchConfig_t lc{};
    lc.gridDim = dim3(unsigned(C));
    lc.blockDim = dim3(kT);
    lc.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = unsigned(C);
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    lc.attrs = at;
    lc.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, cluster_sample_kernel, &lc) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (n < 1) continue;
    cfg = Config{C, cs, smem, n};
    break;
  }
  cache[vocab] = cfg;
  return cfg;
}

}  // namespace

bool cluster_sampler_supported(int64_t vocab) { return vocab >= 1 && vocab < (int64_t(1) << 31) - 1 && config_for(vocab).cluster > 0; }

int cluster_sampler_size(int64_t vocab) { return config_for(vocab).cluster; }

int cluster_sampler_active_clusters(int64_t vocab) { return config_for(vocab).active; }

void sample_rows_cluster(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const ClusterSampleArgs& a,
                         const int32_t* live_rows, cudaStream_t stream) {
  if (ld == 0) ld = vocab;
  MOEFOLD_CHECK(max_rows >= 0 && max_rows < (int64_t(1) << 26) && vocab > 0 && ld >= vocab,
                "sample_rows_cluster: bad sizes rows={} vocab={} ld={}", max_rows, vocab, ld);
  MOEFOLD_CHECK(a.tokens, "sample_rows_cluster: tokens is required");
  MOEFOLD_CHECK(!a.sample.temperature || (a.sample.top_k && a.sample.top_p && a.sample.uniform),
                "sample_rows_cluster: temperature needs top_k, top_p and uniform");
  MOEFOLD_CHECK(!a.top_n || (a.lse && a.top_ids && a.top_logprobs && a.logprob),
                "sample_rows_cluster: top_n needs lse, top_ids, top_logprobs and logprob");
  const PenaltyRows& p = a.penalties;
  MOEFOLD_CHECK(!p.offsets || (p.repetition && p.frequency && p.presence && p.tokens && p.counts && p.saved),
                "sample_rows_cluster: penalty offsets need every penalty array");
  const Config cfg = config_for(vocab);
  MOEFOLD_CHECK(cfg.cluster > 0, "sample_rows_cluster: no cluster configuration for vocabulary {} on this device "
                "(needs sm_90 and at most {} ids)", vocab, int64_t(16) * kT * kMaxCs);
  if (max_rows == 0) return;
  LaunchScope launch(kClusterSample, stream, prof::Work{double(max_rows) * double(vocab) * 4, 0});
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cfg.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(unsigned(max_rows * cfg.cluster));
  lc.blockDim = dim3(kT);
  lc.dynamicSmemBytes = cfg.smem;
  lc.stream = stream;
  lc.attrs = attr;
  lc.numAttrs = pdl_enabled() ? 2 : 1;
  MOEFOLD_CUDA_CHECK(cudaLaunchKernelEx(&lc, cluster_sample_kernel, logits, max_rows, vocab, ld, a, cfg.cs, live_rows));
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
