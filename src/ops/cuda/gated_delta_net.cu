// Gated DeltaNet delta-rule kernels: chunked varlen prefill and one-token recurrent decode, with the
// gating (g, beta from raw a, b) and the q/k L2 norm fused in; fp32 state and fp32 math.
//
// Prefill: one block per (value tile of kBV columns, value head, sequence). The state columns are
// independent, so a block owns S[:, tile] (dk x kBV, fp32, shared memory) and walks its sequence chunk by
// chunk (kGdnChunk rows): normalised q/k of the chunk, the 64x64 decay-masked matrices A (beta k k^T) and
// M (q k^T), the UT transform by forward substitution (I + A) [W | U] = [beta k exp(G) | beta v],
// V' = U - W S, O = exp(G) q S + M V', S = exp(G_last) S + (k exp(G_last - G))^T V'. Blocks of one key
// head recompute A and W. This scalar kernel serves the shapes the tensor-core prefill
// (gated_delta_net_tc.cu, dk = 128) does not cover, and MOEFOLD_GDN_TC=0.
// Decode (gdn_decode_kernel): one block per (value tile of 32 x CPL columns, value head, sequence), 8 warps;
// warp w owns the state rows w, w + 8, ... of the tile, lane l its CPL adjacent columns (one 4/8/16-byte
// load per row), so a warp reads or writes 128 x CPL contiguous bytes per row. The block issues its whole
// state tile's loads first and normalises q/k while they are in flight; the two reductions over dk go
// through shared memory in warp order. A column's arithmetic (and so its bits) is the same for every CPL
// and batch size: CPL only picks how many columns a block covers (more blocks at small batch, fewer,
// wider loads at large batch). gdn_decode_kernel_v1 is the former kernel (32 columns, the state loaded
// after the q/k normalisation), kept for the A/B timing of detail::gdn_recurrent_decode_variant.
// Math: src/ops/cpu/gated_delta_net.cc.
#include "ops/cuda/gated_delta_net.h"

#include <cooperative_groups.h>

#include <cstdlib>
#include <string_view>

#include "ops/cuda/conv1d_step.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gated_delta_net_gating.cuh"
#include "ops/cuda/gated_delta_net_tc.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/silu_approx.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/row_norm.cuh"

namespace moefold::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kC = kGdnChunk;  // 64: the warp scan below assumes 2 entries per lane
constexpr int kBV = 32;        // prefill value columns per block
constexpr int kMaxDk = 256;    // decode register tile bound (dk / kWarps values per thread)

// Argument checks (fmt's compile-time format check does not build under nvcc: runtime format strings).
#define GDN_REQUIRE(cond, f, ...)                                \
  do {                                                           \
    if (!(cond)) ::moefold::fail(fmt::runtime(f), __VA_ARGS__); \
  } while (0)

__device__ __forceinline__ float bf(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// q and k of one row L2-normalised into qdst / kdst (fp32), q also scaled by dk^-0.5; lq(x) / lk(x) give
// entry x of the raw rows. Called by one whole warp; qdst / kdst may be where lq / lk read from.
template <class LoadQ, class LoadK>
__device__ __forceinline__ void normalise_qk(LoadQ lq, LoadK lk, int dk, float qscale, float* qdst, float* kdst,
                                             int lane) {
  float sq = 0.0f, sk = 0.0f;
  for (int x = lane; x < dk; x += 32) {
    const float qv = lq(x), kv = lk(x);
    qdst[x] = qv;
    kdst[x] = kv;
    sq += qv * qv;
    sk += kv * kv;
  }
  sq = warp_sum(sq);
  sk = warp_sum(sk);
  const float iq = rsqrtf(sq + 1e-6f) * qscale, ik = rsqrtf(sk + 1e-6f);
  for (int x = lane; x < dk; x += 32) {  // each lane rescales only the entries it wrote
    qdst[x] *= iq;
    kdst[x] *= ik;
  }
}

// Loads row `row` of q and k (key head kh) into qdst/kdst (fp32) L2-normalised, q also scaled by
// dk^-0.5. Called by one whole warp.
__device__ __forceinline__ void load_qk_normalised(const GdnArgs& p, int64_t row, int kh, int dk, float qscale,
                                                   float* qdst, float* kdst, int lane) {
  const __nv_bfloat16* qr = p.q + row * p.row_stride + int64_t(kh) * dk;
  const __nv_bfloat16* kr = p.k + row * p.row_stride + int64_t(kh) * dk;
  normalise_qk([&](int x) { return bf(qr[x]); }, [&](int x) { return bf(kr[x]); }, dk, qscale, qdst, kdst, lane);
}

// g (log-decay) and beta of row `row`, value head h.
__device__ __forceinline__ void gating(const GdnArgs& p, int64_t row, int h, float& g, float& beta) {
  const float a = bf(p.a[row * p.ab_stride + h]), b = bf(p.b[row * p.ab_stride + h]);
  gdn::gates(a, b, p.A_log[h], p.dt_bias[h], g, beta);
}

// Shared memory of the prefill kernel, in floats (KS = dk + 1 pads rows against bank conflicts).
struct PrefillSmem {
  int ks, S, Kc, Qc, W, U, A, M, G, B, E, total;
  __host__ __device__ PrefillSmem(int dk, int bv) {
    ks = dk + 1;
    S = 0;
    Kc = S + dk * bv;
    Qc = Kc + kC * ks;
    W = Qc + kC * ks;
    U = W + kC * ks;
    A = U + kC * bv;
    M = A + kC * kC;
    G = M + kC * kC;
    B = G + kC;
    E = B + kC;
    total = E + kC;
  }
};

__global__ void __launch_bounds__(kThreads)
    gdn_prefill_kernel(GdnArgs p, const int32_t* __restrict__ cu_seqlens, const GdnSnapshot* __restrict__ snaps,
                       const int32_t* __restrict__ num_snaps_p, int max_snaps, int Hk, int Hv, int dk, int dv,
                       int BV) {
  pdl_begin();
  const int s = blockIdx.z;
  if (s >= *p.num_seqs) return;
  const int bos = cu_seqlens[s], len = cu_seqlens[s + 1] - bos;
  if (len <= 0) return;
  const int h = blockIdx.y, kh = h / (Hv / Hk);
  const int v0 = blockIdx.x * BV;
  const int bv = min(BV, dv - v0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int slot = p.state_slots[s];
  const float qscale = rsqrtf(float(dk));
  const int num_snaps = (snaps != nullptr && num_snaps_p != nullptr) ? min(*num_snaps_p, max_snaps) : 0;

  extern __shared__ float smem[];
  const PrefillSmem L(dk, BV);
  const int KS = L.ks;
  float* Ss = smem + L.S;  // [dk][BV]
  float* Kc = smem + L.Kc;  // [kC][KS]
  float* Qc = smem + L.Qc;
  float* Wm = smem + L.W;  // [kC][KS]
  float* U = smem + L.U;   // [kC][BV]: U, then V'
  float* A = smem + L.A;   // [kC][kC]
  float* M = smem + L.M;
  float* Gs = smem + L.G;
  float* Bs = smem + L.B;
  float* Es = smem + L.E;

  const size_t head_elems = size_t(dk) * dv;
  float* Sg = p.state_pool + (size_t(slot) * Hv + h) * head_elems + v0;
  for (int e = tid; e < dk * bv; e += kThreads) {
    const int x = e / bv, y = e % bv;
    Ss[x * BV + y] = Sg[size_t(x) * dv + y];
  }

  for (int c0 = 0, chunk = 0; c0 < len; c0 += kC, ++chunk) {
    const int Lc = min(kC, len - c0);
    const int64_t row0 = int64_t(bos) + c0;
    // 1. Gating and normalised q/k of the chunk's rows.
    if (tid < Lc) gating(p, row0 + tid, h, Gs[tid], Bs[tid]);
    for (int i = warp; i < Lc; i += kWarps)
      load_qk_normalised(p, row0 + i, kh, dk, qscale, Qc + i * KS, Kc + i * KS, lane);
    __syncthreads();
    // 2. Cumulative log-decay within the chunk (warp 0, two entries per lane).
    if (warp == 0) {
      float ga = lane < Lc ? Gs[lane] : 0.0f, gb = lane + 32 < Lc ? Gs[lane + 32] : 0.0f;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float ta = __shfl_up_sync(0xffffffffu, ga, o), tb = __shfl_up_sync(0xffffffffu, gb, o);
        if (lane >= o) {
          ga += ta;
          gb += tb;
        }
      }
      gb += __shfl_sync(0xffffffffu, ga, 31);
      if (lane < Lc) Gs[lane] = ga;
      if (lane + 32 < Lc) Gs[lane + 32] = gb;
    }
    __syncthreads();
    // 3. A[i][j] = beta_i (k_i . k_j) exp(G_i - G_j) (j < i); M[i][j] = (q_i . k_j) exp(G_i - G_j) (j <= i);
    //    right-hand sides W = beta k exp(G), U = beta v.
    for (int e = tid; e < Lc * Lc; e += kThreads) {
      const int i = e / Lc, j = e % Lc;
      float a = 0.0f, m = 0.0f;
      if (j <= i) {
        const float* ki = Kc + i * KS;
        const float* qi = Qc + i * KS;
        const float* kj = Kc + j * KS;
        float dkk = 0.0f, dqk = 0.0f;
        for (int x = 0; x < dk; ++x) {
          dkk += ki[x] * kj[x];
          dqk += qi[x] * kj[x];
        }
        const float dec = expf(Gs[i] - Gs[j]);
        if (j < i) a = Bs[i] * dkk * dec;
        m = dqk * dec;
      }
      A[i * kC + j] = a;
      M[i * kC + j] = m;
    }
    for (int e = tid; e < Lc * dk; e += kThreads) {
      const int i = e / dk, x = e % dk;
      Wm[i * KS + x] = Bs[i] * Kc[i * KS + x] * expf(Gs[i]);
    }
    for (int e = tid; e < Lc * bv; e += kThreads) {
      const int i = e / bv, y = e % bv;
      U[i * BV + y] = Bs[i] * bf(p.v[(row0 + i) * p.row_stride + int64_t(h) * dv + v0 + y]);
    }
    __syncthreads();
    // 4. Forward substitution (I + A) X = X0, one column of [W | U] per thread (rows in order).
    for (int col = tid; col < dk + bv; col += kThreads) {
      float* X;
      int st;
      if (col < dk) {
        X = Wm + col;
        st = KS;
      } else {
        X = U + (col - dk);
        st = BV;
      }
      for (int i = 1; i < Lc; ++i) {
        float acc = X[i * st];
        const float* Ai = A + i * kC;
        for (int j = 0; j < i; ++j) acc -= Ai[j] * X[j * st];
        X[i * st] = acc;
      }
    }
    __syncthreads();
    // 5. V' = U - W S (in place in U).
    for (int e = tid; e < Lc * bv; e += kThreads) {
      const int i = e / bv, y = e % bv;
      const float* wi = Wm + i * KS;
      float m = 0.0f;
      for (int x = 0; x < dk; ++x) m += wi[x] * Ss[x * BV + y];
      U[i * BV + y] -= m;
    }
    __syncthreads();
    // 6. O_i = exp(G_i) q_i S + sum_{j <= i} M[i][j] V'_j, and the factors exp(G_last - G_j).
    for (int e = tid; e < Lc * bv; e += kThreads) {
      const int i = e / bv, y = e % bv;
      const float* qi = Qc + i * KS;
      float qs = 0.0f;
      for (int x = 0; x < dk; ++x) qs += qi[x] * Ss[x * BV + y];
      float o = expf(Gs[i]) * qs;
      const float* Mi = M + i * kC;
      for (int j = 0; j <= i; ++j) o += Mi[j] * U[j * BV + y];
      p.out[((row0 + i) * Hv + h) * dv + v0 + y] = __float2bfloat16(o);
    }
    if (tid < Lc) Es[tid] = expf(Gs[Lc - 1] - Gs[tid]);
    __syncthreads();
    // 7. S = exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T.
    const float dlast = expf(Gs[Lc - 1]);
    for (int e = tid; e < dk * bv; e += kThreads) {
      const int x = e / bv, y = e % bv;
      float acc = dlast * Ss[x * BV + y];
      for (int j = 0; j < Lc; ++j) acc += Es[j] * Kc[j * KS + x] * U[j * BV + y];
      Ss[x * BV + y] = acc;
    }
    __syncthreads();
    // 8. Snapshots of the state after this chunk.
    for (int n = 0; n < num_snaps; ++n) {
      const GdnSnapshot sn = snaps[n];
      if (sn.seq != s || sn.chunk != chunk) continue;
      float* D = p.state_pool + (size_t(sn.dst_slot) * Hv + h) * head_elems + v0;
      for (int e = tid; e < dk * bv; e += kThreads) {
        const int x = e / bv, y = e % bv;
        D[size_t(x) * dv + y] = Ss[x * BV + y];
      }
    }
  }
  for (int e = tid; e < dk * bv; e += kThreads) {
    const int x = e / bv, y = e % bv;
    Sg[size_t(x) * dv + y] = Ss[x * BV + y];
  }
}

__global__ void __launch_bounds__(kThreads)
    gdn_decode_kernel_v1(GdnArgs p, int Hk, int Hv, int dk, int dv) {
  pdl_begin();
  const int s = blockIdx.z;
  if (s >= *p.num_seqs) return;
  const int h = blockIdx.y, kh = h / (Hv / Hk);
  const int tid = threadIdx.x, lane = tid & 31, part = tid >> 5;
  const int j = blockIdx.x * 32 + lane;
  const bool col_ok = j < dv;
  __shared__ float qn[kMaxDk], kn[kMaxDk], red_m[kWarps][32], red_o[kWarps][32], gb[2];
  const int64_t row = s;
  if (part == 0) load_qk_normalised(p, row, kh, dk, rsqrtf(float(dk)), qn, kn, lane);
  if (part == 1 && lane == 0) {
    float g, beta;
    gating(p, row, h, g, beta);
    gb[0] = expf(g);
    gb[1] = beta;
  }
  __syncthreads();
  const float decay = gb[0], beta = gb[1];
  float* S = p.state_pool + (size_t(p.state_slots[s]) * Hv + h) * size_t(dk) * dv + j;
  constexpr int kR = kMaxDk / kWarps;
  float st[kR];
  float m = 0.0f;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int i = part + kWarps * r;
    st[r] = 0.0f;
    if (i < dk && col_ok) {
      st[r] = S[size_t(i) * dv] * decay;
      m += st[r] * kn[i];
    }
  }
  red_m[part][lane] = m;
  __syncthreads();
  float mt = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mt += red_m[w][lane];
  const float vj = col_ok ? bf(p.v[row * p.row_stride + int64_t(h) * dv + j]) : 0.0f;
  const float d = beta * (vj - mt);
  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int i = part + kWarps * r;
    if (i < dk && col_ok) {
      st[r] += kn[i] * d;
      o += st[r] * qn[i];
      S[size_t(i) * dv] = st[r];
    }
  }
  red_o[part][lane] = o;
  __syncthreads();
  if (part == 0 && col_ok) {
    float ot = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ot += red_o[w][lane];
    p.out[(row * Hv + h) * dv + j] = __float2bfloat16(ot);
  }
}


// CPL float columns as one vector: float, float2 or float4.
template <int CPL>
struct ColVec;
template <>
struct ColVec<1> {
  using T = float;
};
template <>
struct ColVec<2> {
  using T = float2;
};
template <>
struct ColVec<4> {
  using T = float4;
};
template <int CPL>
__device__ __forceinline__ void load_cols(const float* src, float (&d)[CPL]) {
  const typename ColVec<CPL>::T v = *reinterpret_cast<const typename ColVec<CPL>::T*>(src);
  const float* f = reinterpret_cast<const float*>(&v);
#pragma unroll
  for (int c = 0; c < CPL; ++c) d[c] = f[c];
}
template <int CPL>
__device__ __forceinline__ void store_cols(float* dst, const float (&d)[CPL]) {
  typename ColVec<CPL>::T v;
  float* f = reinterpret_cast<float*>(&v);
#pragma unroll
  for (int c = 0; c < CPL; ++c) f[c] = d[c];
  *reinterpret_cast<typename ColVec<CPL>::T*>(dst) = v;
}

// Steps 3 to 5 of a decode block after the tile's state st (rows part + kWarps r, the lane's CPL columns
// from S), v, the normalised q / k (qn, kn: shared memory) and the gates are in place: S = decay S,
// m = S^T k over the warp's rows then over the warps in order, d = beta (v - m), S += k d^T (written back),
// o = S^T q the same way. Returns output column tid of the tile for threads tid < 32 CPL (0 elsewhere).
// Every thread of the block calls it (two barriers). Shared by gdn_decode_kernel and gdn_decode_fused_kernel.
template <int R, int CPL>
__device__ __forceinline__ float decode_update(float (&st)[R][CPL], const float (&vj)[CPL], const float* qn,
                                               const float* kn, float decay, float beta, int dk, bool col_ok, float* S,
                                               int dv, float (*red_m)[32 * CPL], float (*red_o)[32 * CPL]) {
  constexpr int TW = 32 * CPL;
  const int tid = threadIdx.x, lane = tid & 31, part = tid >> 5;
  // 3. m = (decay S)^T k over this warp's rows, then over the warps in order.
  float m[CPL];
#pragma unroll
  for (int c = 0; c < CPL; ++c) m[c] = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = part + kWarps * r;
    if (i < dk && col_ok) {
      const float ki = kn[i];
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        st[r][c] = st[r][c] * decay;
        m[c] += st[r][c] * ki;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < CPL; ++c) red_m[part][lane * CPL + c] = m[c];
  __syncthreads();
  float d[CPL];
#pragma unroll
  for (int c = 0; c < CPL; ++c) {
    float mt = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mt += red_m[w][lane * CPL + c];
    d[c] = beta * (vj[c] - mt);
  }
  // 4. S += k d^T (written back), o = S^T q.
  float o[CPL];
#pragma unroll
  for (int c = 0; c < CPL; ++c) o[c] = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = part + kWarps * r;
    if (i < dk && col_ok) {
      const float ki = kn[i], qi = qn[i];
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        st[r][c] += ki * d[c];
        o[c] += st[r][c] * qi;
      }
      store_cols<CPL>(S + size_t(i) * dv, st[r]);
    }
  }
#pragma unroll
  for (int c = 0; c < CPL; ++c) red_o[part][lane * CPL + c] = o[c];
  __syncthreads();
  float ot = 0.0f;
  if (tid < TW) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ot += red_o[w][tid];
  }
  return ot;
}

// R: state rows per warp (>= dk / kWarps); CPL: columns per lane. CPL > 1 needs dv % (32 * CPL) == 0
// (the launcher checks); CPL == 1 handles any dv (columns past dv masked).
template <int R, int CPL>
__global__ void __launch_bounds__(kThreads, R > 16 ? 1 : (CPL == 4 ? 2 : (CPL == 2 ? 3 : 4)))
    gdn_decode_kernel(GdnArgs p, int Hk, int Hv, int dk, int dv) {
  pdl_begin();
  const int s = blockIdx.z;
  if (s >= *p.num_seqs) return;
  constexpr int TW = 32 * CPL;  // columns of the tile
  const int h = blockIdx.y, kh = h / (Hv / Hk);
  const int tid = threadIdx.x, lane = tid & 31, part = tid >> 5;
  const int j = blockIdx.x * TW + lane * CPL;  // first column of this lane
  const bool col_ok = j < dv;                  // CPL > 1: the whole vector (dv % TW == 0)
  __shared__ float qn[kMaxDk], kn[kMaxDk], red_m[kWarps][TW], red_o[kWarps][TW], gb[2];
  const int64_t row = s;
  float* S = p.state_pool + (size_t(p.state_slots[s]) * Hv + h) * size_t(dk) * dv + j;
  // 1. The tile's state loads, all in flight before anything waits.
  float st[R][CPL];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = part + kWarps * r;
#pragma unroll
    for (int c = 0; c < CPL; ++c) st[r][c] = 0.0f;
    if (i < dk && col_ok) load_cols<CPL>(S + size_t(i) * dv, st[r]);
  }
  float vj[CPL];
#pragma unroll
  for (int c = 0; c < CPL; ++c) vj[c] = 0.0f;
  if (col_ok) {
    const __nv_bfloat16* vr = p.v + row * p.row_stride + int64_t(h) * dv + j;
#pragma unroll
    for (int c = 0; c < CPL; ++c) vj[c] = bf(vr[c]);
  }
  // 2. q/k normalisation and the gates meanwhile.
  if (part == 0) load_qk_normalised(p, row, kh, dk, rsqrtf(float(dk)), qn, kn, lane);
  if (part == 1 && lane == 0) {
    float g, beta;
    gating(p, row, h, g, beta);
    gb[0] = expf(g);
    gb[1] = beta;
  }
  __syncthreads();
  const float ot = decode_update<R, CPL>(st, vj, qn, kn, gb[0], gb[1], dk, col_ok, S, dv, red_m, red_o);
  // 5. The output columns: thread t < TW holds column t's sum over the warps.
  const int jt = blockIdx.x * TW + tid;
  if (tid < TW && jt < dv) p.out[(row * Hv + h) * dv + jt] = __float2bfloat16(ot);
}


// The DeltaNet decode layer between the in-projection and the out-projection in one launch: the causal
// conv1d step (conv1d_step.cuh), gdn_decode_kernel's delta rule (decode_update) and the gated RMSNorm
// (gated_rms_norm_kernel's V = 8 arithmetic), so the bits are those of the three launches. One block per
// (tile of 32 CPL value columns, value head, sequence) as gdn_decode_kernel; a thread-block cluster holds
// every tile of the Hv / Hk value heads of one key head. Each block computes the conv of its key head's
// q and k channels itself (they stay in shared memory) and of its own v columns (whose conv state it
// writes); block rank 0 of the cluster writes the q / k conv state after the cluster barrier that follows
// every block's reads of it. The gated norm needs the head's whole output row: the tiles exchange their
// bf16-rounded outputs through distributed shared memory.
// The same blocks per SM as gdn_decode_kernel (at CPL = 4 two blocks, i.e. <= 128 registers: the batch-64
// decode step is bound by the state's bandwidth, which one block an SM halves).
template <int R, int CPL>
__global__ void __launch_bounds__(kThreads, R > 16 ? 1 : (CPL == 4 ? 2 : (CPL == 2 ? 3 : 4)))
    gdn_decode_fused_kernel(GdnArgs p, GdnDecodeConv cv, GdnDecodeGatedNorm gn, int Hk, int Hv, int dk, int dv) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  pdl_begin();
  const int s = blockIdx.z;
  if (s >= *p.num_seqs) return;  // the same for every block of the cluster
  constexpr int TW = 32 * CPL;
  const int h = blockIdx.y, kh = h / (Hv / Hk);
  const int tid = threadIdx.x, lane = tid & 31, part = tid >> 5;
  const int j = blockIdx.x * TW + lane * CPL;
  const bool col_ok = j < dv;
  __shared__ float qn[kMaxDk], kn[kMaxDk], red_m[kWarps][TW], red_o[kWarps][TW], gb[2], vs[TW], o_tile[TW], inv_s;
  const int64_t row = s;
  const int slot = p.state_slots[s];
  float* S = p.state_pool + (size_t(slot) * Hv + h) * size_t(dk) * dv + j;
  // 1. The tile's state loads, all in flight before anything waits.
  float st[R][CPL];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = part + kWarps * r;
#pragma unroll
    for (int c = 0; c < CPL; ++c) st[r][c] = 0.0f;
    if (i < dk && col_ok) load_cols<CPL>(S + size_t(i) * dv, st[r]);
  }
  // 2. The conv step: the key head's q / k channels (thread t < 2 dk), the tile's v columns (t < TW).
  const int C = 2 * Hk * dk + Hv * dv, K = cv.K;
  const __nv_bfloat16* xr = cv.x + row * cv.x_stride;
  __nv_bfloat16* cst = cv.state_pool + size_t(slot) * C * (K - 1);
  __nv_bfloat16 win_qk[kMaxConvKernel];
  int qk_ch = -1;
  if (tid < 2 * dk) {
    const bool is_q = tid < dk;
    const int i = is_q ? tid : tid - dk;
    qk_ch = (is_q ? 0 : Hk * dk) + kh * dk + i;
    conv1d::load_window(cst + size_t(qk_ch) * (K - 1), xr[qk_ch], K, win_qk);
    (is_q ? qn : kn)[i] = bf(conv1d::output(cv.w + size_t(qk_ch) * K, K, win_qk));
  }
  const int jt = blockIdx.x * TW + tid;
  if (tid < TW && jt < dv) {
    const int c = 2 * Hk * dk + h * dv + jt;
    __nv_bfloat16 win[kMaxConvKernel];
    conv1d::load_window(cst + size_t(c) * (K - 1), xr[c], K, win);
    vs[tid] = bf(conv1d::output(cv.w + size_t(c) * K, K, win));
    conv1d::store_state(cst + size_t(c) * (K - 1), K, win);  // this block's own channel
  }
  __syncthreads();
  float vj[CPL];
#pragma unroll
  for (int c = 0; c < CPL; ++c) vj[c] = col_ok ? vs[lane * CPL + c] : 0.0f;
  // 3. q/k normalisation (in place) and the gates.
  if (part == 0)
    normalise_qk([&](int x) { return qn[x]; }, [&](int x) { return kn[x]; }, dk, rsqrtf(float(dk)), qn, kn, lane);
  if (part == 1 && lane == 0) {
    float g, beta;
    gating(p, row, h, g, beta);
    gb[0] = expf(g);
    gb[1] = beta;
  }
  __syncthreads();
  const float ot = decode_update<R, CPL>(st, vj, qn, kn, gb[0], gb[1], dk, col_ok, S, dv, red_m, red_o);
  // 4. The gated norm of the head's row: the tiles' rounded outputs through distributed shared memory.
  if (tid < TW) o_tile[tid] = jt < dv ? bf(__float2bfloat16(ot)) : 0.0f;
  cluster.sync();  // every o_tile written; every block's reads of the q / k conv state done
  if (part == 0) {
    const int n = dv / 8, ntiles = dv / TW, yi = int(cluster.block_index().y);
    float ss = 0.0f;
    if (lane < n) {
      float f[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int col = 8 * lane + e;
        const float* src = cluster.map_shared_rank(o_tile, col / TW + yi * ntiles);
        f[e] = src[col % TW];
      }
      ss = detail::add_squares<8>(ss, f);
    }
    for (int o = gn.tpr >> 1; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) inv_s = rsqrtf(ss / float(dv) + gn.eps);
  }
  __syncthreads();
  if (tid < TW && jt < dv) {
    const float f = o_tile[tid], zz = bf(gn.z[row * gn.z_stride + int64_t(h) * dv + jt]), g = bf(gn.w[jt]);
    p.out[(row * Hv + h) * dv + jt] = __float2bfloat16(g * (f * inv_s) * silu_approx(zz));
  }
  if (qk_ch >= 0 && cluster.block_rank() == 0) conv1d::store_state(cst + size_t(qk_ch) * (K - 1), K, win_qk);
  cluster.sync();  // o_tile stays alive until the cluster's other blocks have read it
}

const prof::Kernel kGdnPrefill{"gdn_prefill_kernel", prof::Category::DeltaNet};
const prof::Kernel kGdnDecode{"gdn_decode_kernel", prof::Category::DeltaNet};
const prof::Kernel kGdnDecodeFused{"gdn_decode_fused_kernel", prof::Category::DeltaNet};

void check_common(const GdnArgs& a, int max_seqs, const GdnDims& d, const char* fn) {
  GDN_REQUIRE(a.q && a.k && a.v && a.a && a.b && a.A_log && a.dt_bias && a.state_pool && a.state_slots &&
                  a.num_seqs && a.out,
              "{}: null pointer argument", fn);
  GDN_REQUIRE(d.num_k_heads > 0 && d.num_v_heads > 0 && d.num_v_heads % d.num_k_heads == 0,
              "{}: Hv = {} must be a positive multiple of Hk = {}", fn, d.num_v_heads, d.num_k_heads);
  GDN_REQUIRE(d.num_v_heads <= 65535, "{}: Hv = {} exceeds 65535", fn, d.num_v_heads);
  GDN_REQUIRE(d.k_dim >= 1 && d.k_dim <= kMaxDk && d.v_dim >= 1, "{}: bad head sizes dk = {}, dv = {}", fn,
              d.k_dim, d.v_dim);
  GDN_REQUIRE(max_seqs >= 0 && max_seqs <= 65535, "{}: max_seqs = {} must be in [0, 65535]", fn, max_seqs);
  GDN_REQUIRE(a.row_stride > 0 && a.ab_stride >= d.num_v_heads, "{}: bad row strides {} / {}", fn, a.row_stride,
              a.ab_stride);
}

}  // namespace

namespace detail {
/// Work of `rows` tokens over `seqs` sequences: q, k, v, a, b read and o written (bf16), each sequence's
/// fp32 state read and written once; FLOPs of the recurrent form (per token and value head the three
/// dk x dv products S^T k, k d^T, S^T q; the chunked form does more arithmetic for the same result).
prof::Work gdn_work(int64_t rows, int64_t seqs, const GdnDims& d) {
  const double io = double(2 * d.num_k_heads * d.k_dim + d.num_v_heads * d.v_dim) + 2.0 * d.num_v_heads +
                    double(d.num_v_heads) * d.v_dim;
  const double state = double(d.num_v_heads) * d.k_dim * d.v_dim * 4;
  return prof::Work{double(rows) * io * 2 + double(seqs) * state * 2,
                    6.0 * double(rows) * d.num_v_heads * d.k_dim * d.v_dim};
}
}  // namespace detail

void gdn_chunked_prefill(const GdnArgs& args, const int32_t* cu_seqlens, int max_seqs, const GdnSnapshot* snapshots,
                         const int32_t* num_snapshots, int max_snapshots, const GdnDims& dims, cudaStream_t stream) {
  check_common(args, max_seqs, dims, "gdn_chunked_prefill");
  GDN_REQUIRE(cu_seqlens != nullptr, "{}: null cu_seqlens", "gdn_chunked_prefill");
  GDN_REQUIRE(max_snapshots == 0 || (snapshots != nullptr && num_snapshots != nullptr),
              "gdn_chunked_prefill: max_snapshots = {} but no snapshot list", max_snapshots);
  if (max_seqs == 0) return;
  if (detail::gdn_prefill_tc_enabled() && detail::gdn_prefill_tc_supported(args, dims)) {
    detail::gdn_prefill_tc(args, cu_seqlens, max_seqs, snapshots, num_snapshots, max_snapshots, dims, stream);
    return;
  }
  const int bv = dims.v_dim < kBV ? dims.v_dim : kBV;
  const size_t smem = size_t(PrefillSmem(dims.k_dim, bv).total) * sizeof(float);
  int dev = 0, max_smem = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  GDN_REQUIRE(smem <= size_t(max_smem), "gdn_chunked_prefill: dk = {} needs {} bytes of shared memory, device has {}",
              dims.k_dim, smem, max_smem);
  MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(gdn_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((dims.v_dim + bv - 1) / bv), unsigned(dims.num_v_heads), unsigned(max_seqs));
  LaunchScope launch(kGdnPrefill, stream, [&] {  // rows are known only from the step (zero work outside one)
    const prof::StepFacts* f = prof::step_facts();
    return f ? detail::gdn_work(f->rows, work_seqs(max_seqs), dims) : prof::Work{};
  });
  launch_pdl(gdn_prefill_kernel, dim3(grid), dim3(kThreads), smem, stream, args, cu_seqlens, max_snapshots > 0 ? snapshots : nullptr,
                                                       max_snapshots > 0 ? num_snapshots : nullptr, max_snapshots,
                                                       dims.num_k_heads, dims.num_v_heads, dims.k_dim, dims.v_dim, bv);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

namespace detail {
int gdn_decode_auto_cols(int max_seqs, const GdnDims& d) {
  if (d.k_dim > 128) return 1;  // 32 rows a warp: the register tile allows one column a lane
  static const int sms = [] {
    int dev = 0, n = 0;
    MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
    MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  // The widest tiles that still give at least every other SM a block. Measured on the H200 at the 35B
  // shape (docs/benchmarks.md): 4 columns a lane are fastest from 8 sequences (256 blocks) on, 2 at 2
  // sequences (128 blocks), 1 at one sequence (128 blocks of 32 columns; 2 columns tie).
  const int64_t heads = int64_t(max_seqs) * d.num_v_heads;
  for (int cpl : {4, 2}) {
    if (d.v_dim % (32 * cpl) != 0) continue;
    if (2 * heads * (d.v_dim / (32 * cpl)) >= sms) return cpl;
  }
  return 1;
}

void gdn_recurrent_decode_variant(const GdnArgs& args, int max_seqs, const GdnDims& dims, int variant,
                                  cudaStream_t stream) {
  check_common(args, max_seqs, dims, "gdn_recurrent_decode");
  GDN_REQUIRE(variant == -1 || variant == 0 || variant == 1 || variant == 2 || variant == 4,
              "gdn_recurrent_decode: unknown variant {}", variant);
  if (max_seqs == 0) return;
  const int cpl = variant < 0 ? gdn_decode_auto_cols(max_seqs, dims) : variant;
  GDN_REQUIRE(cpl <= 1 || (dims.k_dim <= 128 && dims.v_dim % (32 * cpl) == 0),
              "gdn_recurrent_decode: {} columns a lane need dk <= 128 and dv % {} == 0 (dk = {}, dv = {})", cpl,
              32 * cpl, dims.k_dim, dims.v_dim);
  const int tw = 32 * (cpl == 0 ? 1 : cpl);
  const dim3 grid(unsigned((dims.v_dim + tw - 1) / tw), unsigned(dims.num_v_heads), unsigned(max_seqs));
  LaunchScope launch(kGdnDecode, stream,
                     [&] { return detail::gdn_work(work_seqs(max_seqs), work_seqs(max_seqs), dims); });
  const bool wide = dims.k_dim > 128;
  auto kernel = cpl == 0 ? gdn_decode_kernel_v1
                : cpl == 4 ? gdn_decode_kernel<16, 4>
                : cpl == 2 ? gdn_decode_kernel<16, 2>
                : wide     ? gdn_decode_kernel<32, 1>
                           : gdn_decode_kernel<16, 1>;
  launch_pdl(kernel, dim3(grid), dim3(kThreads), 0, stream, args, dims.num_k_heads, dims.num_v_heads, dims.k_dim,
             dims.v_dim);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}
}  // namespace detail


bool gdn_decode_fused_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOEFOLD_FUSE_GDN_DECODE");
    return v && std::string_view(v) == "1";
  }();
  return on;
}

bool gdn_decode_fused_supported(const GdnArgs& args, const GdnDecodeConv& conv, const GdnDecodeGatedNorm& norm,
                                int max_seqs, const GdnDims& d) {
  if (max_seqs <= 0 || d.k_dim > 128 || d.num_v_heads % d.num_k_heads != 0) return false;
  if (conv.K < 1 || conv.K > kMaxConvKernel || d.v_dim % 32 != 0 || d.v_dim > 256) return false;
  const int cpl = detail::gdn_decode_auto_cols(max_seqs, d);
  if (d.v_dim % (32 * cpl) != 0) return false;
  const int cluster = d.v_dim / (32 * cpl) * (d.num_v_heads / d.num_k_heads);
  if (cluster > 8) return false;
  // The gated norm's bits are those of gated_rms_norm's 8-element vectors (its width for these buffers).
  return detail::vec_width(d.v_dim, {args.out, norm.z, norm.w}, {norm.z_stride}) == 8 &&
         detail::row_geom(d.v_dim, 8).tpr <= 32;
}

void gdn_decode_fused(const GdnArgs& args, const GdnDecodeConv& conv, const GdnDecodeGatedNorm& norm, int max_seqs,
                      const GdnDims& dims, cudaStream_t stream) {
  check_common(args, max_seqs, dims, "gdn_decode_fused");
  GDN_REQUIRE(conv.x && conv.w && conv.state_pool && norm.z && norm.w, "{}: null pointer argument", "gdn_decode_fused");
  GDN_REQUIRE(gdn_decode_fused_supported(args, conv, norm, max_seqs, dims),
              "gdn_decode_fused: shape not supported (dk = {}, dv = {}, Hk = {}, Hv = {}, K = {})", dims.k_dim,
              dims.v_dim, dims.num_k_heads, dims.num_v_heads, conv.K);
  const int cpl = detail::gdn_decode_auto_cols(max_seqs, dims), tw = 32 * cpl;
  GdnDecodeGatedNorm gn = norm;
  gn.tpr = detail::row_geom(dims.v_dim, 8).tpr;
  const dim3 grid(unsigned(dims.v_dim / tw), unsigned(dims.num_v_heads), unsigned(max_seqs));
  LaunchScope launch(kGdnDecodeFused, stream, [&] {
    const int64_t n = work_seqs(max_seqs);
    const int C = 2 * dims.num_k_heads * dims.k_dim + dims.num_v_heads * dims.v_dim;
    prof::Work w = detail::gdn_work(n, n, dims);
    w.bytes += double(n) * C * (conv.K - 1) * 4 + double(C) * conv.K * 2 + double(n) * dims.num_v_heads * dims.v_dim * 2;
    return w;
  });
  auto kernel = cpl == 4 ? gdn_decode_fused_kernel<16, 4>
                : cpl == 2 ? gdn_decode_fused_kernel<16, 2>
                           : gdn_decode_fused_kernel<16, 1>;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = grid.x;
  attr[0].val.clusterDim.y = unsigned(dims.num_v_heads / dims.num_k_heads);
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  MOEFOLD_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args, conv, gn, dims.num_k_heads, dims.num_v_heads, dims.k_dim,
                                        dims.v_dim));
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void gdn_recurrent_decode(const GdnArgs& args, int max_seqs, const GdnDims& dims, cudaStream_t stream) {
  detail::gdn_recurrent_decode_variant(args, max_seqs, dims, -1, stream);
}

}  // namespace moefold::cuda
