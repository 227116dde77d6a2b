// The one-kernel sampler (sampling.h, sample_rows_cluster): one thread-block cluster per row.
//
// Layout. A cluster of C CTAs (16, or 8 where 16 cannot be scheduled) of kT threads owns one row; CTA
// `rank` owns the contiguous ids [rank * kT * cs, (rank + 1) * kT * cs) and thread t of it the ids
// [base + t * cs, base + (t + 1) * cs) (cs odd, so that thread-strided shared-memory reads hit distinct
// banks). The row is read from global memory ONCE into shared memory; every later pass reads it
// there. Per-thread "active sets" (bit words over the thread's cs entries) hold the candidates of a
// step and shrink as the steps go. About 74 KB of shared memory per CTA at V = 248,320: three CTAs
// per SM. Cross-CTA values travel through distributed shared memory: each CTA writes its partial
// into a slot, cluster.sync(), and every CTA reads all C slots in rank order (double-buffered slots,
// so one barrier per exchange). The building blocks live in sampling_cluster_select.cuh.
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
#include "ops/cuda/sampling_cluster_select.cuh"

namespace moefold::cuda {
using namespace detail;
namespace cg = cooperative_groups;
namespace {
using namespace cluster_select;

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
      for (int64_t i = t; i < n4; i += 4 * kT) {
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
    for_each(c, c.act, [&](int j) {
      mine_w += weight(c.x(j));
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
    if (t == 0) sh->tok = -1;
    __syncthreads();
    const bool cross = P + inc > target, cross_prev = t > 0 && P + excl > target;
    if ((c.rank == 0 || !(P > target)) && cross && !cross_prev) {  // the first chunk where cum > u * Z
      int32_t w_tok = last;  // rounding inside the chunk: its last survivor
      double cum = P + excl;
      bool hit = false;
      for_each(c, c.act, [&](int j) {
        if (hit) return;
        cum += weight(c.x(j));
        if (cum > target) {
          w_tok = int32_t(c.id(j));
          hit = true;
        }
      });
      sh->tok = w_tok;
    }
    __syncthreads();
    if (t == 0) c.mine().bi = sh->tok;
    Slot* f = c.exchange();
    // Exactly one CTA's candidate is >= 0.
    tok = __reduce_max_sync(0xffffffffu, lane_rank(c, f, int32_t(-1), [](const Slot* rs) { return rs->bi; }));
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

bool cluster_sampler_supported(int64_t vocab) {
  return vocab >= 1 && vocab < (int64_t(1) << 31) - 1 && config_for(vocab).cluster > 0;
}

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
