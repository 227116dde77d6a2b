// Gated DeltaNet chunked prefill on tensor cores, split into a chunk-parallel kernel and a sequential
// state pass (the gated WY / UT form, chunk C = 64, dk = 128; same math and precision as the fused
// gdn_prefill_tc_kernel in gated_delta_net_tc.cu, whose comment explains the notation and the bf16 +
// residual operands).
//
//   gdn_tc_chunk_base_kernel: base[s] = first global chunk of sequence s (chunks of the live sequences
//     before it; one block).
//   gdn_tc_chunk_kernel: one block of 4 warps per (global chunk, key head), all in parallel: the q/k
//     inverse norms and the raw products K K^T, Q K^T once, then per value head of that key head the
//     gates, the scan G, A = tril(beta_i k_i.k_j e^{G_i - G_j}, -1), T = (I + A)^-1 (diagonal
//     blocks by substitution, off-diagonal ones on tf32 tensor cores), M = tril(q_i.k_j e^{G_i - G_j}) and
//     the row scales. Writes one record per (chunk, head) (Rec in gated_delta_net_tc_rec.cuh): T as bf16 hi + lo mma fragments,
//     M as bf16 fragments, four row scales and e^{G_L}, each in the register layout of the state-pass
//     thread that uses it, so that the state pass loads them with 16-byte loads and no shared memory.
//   gdn_tc_scan_kernel: one block per (BV value columns, value head, sequence) walks the sequence's chunks
//     with the fp32 state in registers: K S, Q S, R = beta (V - e^G K S / |k|), V' = T R, O = e^G Q S + M V'
//     (stored), S = e^{G_L} S + K^T (e^{G_L - G} V'); snapshots written straight into their slots.
// The records live in a scratch buffer of windows of global chunks (bounded: MOEFOLD_GDN_TC_SCRATCH_MB,
// default 512 MiB); a launch larger than one window runs chunk kernel + state pass per window, the state
// carried through its slot between windows.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gated_delta_net_tc.h"
#include "ops/cuda/gated_delta_net_tc_mma.cuh"
#include "ops/cuda/gated_delta_net_tc_rec.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda::detail {
namespace {

using namespace gdn_tc;

// State pass shared memory for BV value columns: kStages stages of q, k, v rows, then S (bf16 + residual)
// and the per-chunk tiles R (bf16 + residual), V', V' e^(G_L - G) / |k| (bf16 + residual).
template <int BV>
struct ScanSmem {
  static constexpr int kVLD = BV + 8;
  static constexpr int kStageQ = 0;
  static constexpr int kStageK = kStageQ + kC * kQLD * 2;
  static constexpr int kStageV = kStageK + kC * kQLD * 2;
  static constexpr int kStageBytes = kStageV + kC * kVLD * 2;
  static constexpr int kOffS = 0;  // offsets past the stages
  static constexpr int kOffSL = kOffS + kDK * kVLD * 2;
  static constexpr int kOffVN = kOffSL + kDK * kVLD * 2;
  static constexpr int kOffVE = kOffVN + kC * kVLD * 2;
  static constexpr int kOffVL = kOffVE + kC * kVLD * 2;
  static constexpr int kOffRH = kOffVL + kC * kVLD * 2;
  static constexpr int kOffRL = kOffRH + kC * kVLD * 2;
  static constexpr int kRestBytes = kOffRL + kC * kVLD * 2;
  static constexpr int smem_bytes(int stages) { return stages * kStageBytes + kRestBytes; }
};

// Streams rows [row0, row0 + n) of q, k (key head kh) and v (columns [vcol, vcol + BV)) into a stage;
// rows n..63 are zero-filled.
template <int BV>
__device__ __forceinline__ void scan_load(const GdnArgs& p, char* stage, int64_t row0, int n, int kh, int vcol,
                                          int tid) {
  using L = ScanSmem<BV>;
  __nv_bfloat16* Q = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageQ);
  __nv_bfloat16* K = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageK);
  __nv_bfloat16* V = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageV);
#pragma unroll 4
  for (int e = tid; e < kC * (kDK / 8); e += kThreads) {
    const int r = e / (kDK / 8), c = (e % (kDK / 8)) * 8;
    const bool ok = r < n;
    const int64_t off = (row0 + (ok ? r : 0)) * p.row_stride + int64_t(kh) * kDK + c;
    cp_async16(Q + r * kQLD + c, p.q + off, ok);
    cp_async16(K + r * kQLD + c, p.k + off, ok);
  }
  for (int e = tid; e < kC * (BV / 8); e += kThreads) {
    const int r = e / (BV / 8), c = (e % (BV / 8)) * 8;
    const bool ok = r < n;
    cp_async16(V + r * L::kVLD + c, p.v + (row0 + (ok ? r : 0)) * p.row_stride + vcol + c, ok);
  }
  cp_async_commit();
}

// One block per (BV value columns blockIdx.x, value head blockIdx.y, sequence blockIdx.z): the sequence's
// chunks inside the window [w0, w1) of global chunks, in order.
template <int BV, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_tc_scan_kernel(GdnArgs p, const int32_t* __restrict__ cu_seqlens, const int32_t* __restrict__ base,
                       const char* __restrict__ recs, int w0, int w1, const GdnSnapshot* __restrict__ snaps,
                       const int32_t* __restrict__ num_snaps_p, int max_snaps, int Hk, int Hv, int dv,
                       unsigned long long* __restrict__ phase_cycles) {
  using L = ScanSmem<BV>;
  constexpr int kVLD = L::kVLD, kStageBytes = L::kStageBytes;
  constexpr int kNT = BV / 8, kNP = BV / 16;
  pdl_begin();
  const int s = blockIdx.z;
  if (s >= *p.num_seqs) return;
  const int bos = cu_seqlens[s], len = cu_seqlens[s + 1] - bos;
  if (len <= 0) return;
  const int gbase = base[s], nchunks = (len + kC - 1) / kC;
  const int cb = max(gbase, w0) - gbase, ce = min(gbase + nchunks, w1) - gbase;
  if (cb >= ce) return;
  const int h = blockIdx.y, kh = h / (Hv / Hk);
  const int v0 = blockIdx.x * BV;
  __shared__ unsigned long long prof_acc[kGdnTcPhases];
  long long prof_last = 0;
  if (phase_cycles != nullptr && threadIdx.x < kGdnTcPhases) prof_acc[threadIdx.x] = 0;
#define GDN_PHASE(k)                                 \
  if (phase_cycles != nullptr && threadIdx.x == 0) { \
    const long long now = clock64();                 \
    if ((k) > 0) prof_acc[(k)] += now - prof_last;   \
    prof_last = now;                                 \
  }
  const int vcol = h * dv + v0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, t4 = lane & 3;
  const int lrow = lane & 15, lcol = (lane >> 4) * 8, bm = lane >> 3;
  const int slot = p.state_slots[s];
  const int num_snaps = (snaps != nullptr && num_snaps_p != nullptr) ? min(*num_snaps_p, max_snaps) : 0;

  extern __shared__ __align__(16) char smem_all[];
  char* smem = smem_all + kStages * kStageBytes;
  __nv_bfloat16* Ss = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffS);
  __nv_bfloat16* SL = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffSL);
  __nv_bfloat16* VN = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffVN);
  __nv_bfloat16* VE = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffVE);
  __nv_bfloat16* VL = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffVL);
  __nv_bfloat16* RH = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffRH);
  __nv_bfloat16* RL = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffRL);

  // State rows [32w, 32w + 32) x BV columns in mma C layout (as in gdn_prefill_tc_kernel).
  const size_t head_elems = size_t(kDK) * dv;
  float* Sg = p.state_pool + (size_t(slot) * Hv + h) * head_elems + v0;
  float Sa[2][kNT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int x = 32 * warp + 16 * mt + g8 + 8 * hf, y = 8 * nt + 2 * t4;
        const float2 v = *reinterpret_cast<const float2*>(Sg + size_t(x) * dv + y);
        Sa[mt][nt][2 * hf] = v.x;
        Sa[mt][nt][2 * hf + 1] = v.y;
        const __nv_bfloat162 sh = __floats2bfloat162_rn(v.x, v.y);
        *reinterpret_cast<__nv_bfloat162*>(Ss + x * kVLD + y) = sh;
        *reinterpret_cast<uint32_t*>(SL + x * kVLD + y) = pack_bf16(v.x - __low2float(sh), v.y - __high2float(sh));
      }

  if constexpr (kStages == 2) scan_load<BV>(p, smem_all, int64_t(bos) + cb * kC, min(kC, len - cb * kC), kh, vcol, tid);

  for (int chunk = cb; chunk < ce; ++chunk) {
    GDN_PHASE(0);
    const int c0 = chunk * kC, Lc = min(kC, len - c0);
    const int64_t row0 = int64_t(bos) + c0;
    const char* rec = recs + (size_t(gbase + chunk - w0) * Hv + h) * Rec::kBytes;
    // This chunk's record: T (bf16 hi + lo) and M fragments of this warp's rows, the row scales.
    uint32_t Th[4][4], Tl[4][4], Mf[4][4];
    {
      const uint4* Tr = reinterpret_cast<const uint4*>(rec + Rec::kT) + ((warp * 4) * 32 + lane) * 2;
      const uint4* Mr = reinterpret_cast<const uint4*>(rec + Rec::kM) + (warp * 4) * 32 + lane;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint4 a = make_uint4(0u, 0u, 0u, 0u), b = a, m = a;
        if (ks <= warp) {
          a = __ldg(Tr + ks * 64);
          b = __ldg(Tr + ks * 64 + 1);
          m = __ldg(Mr + ks * 32);
        }
        Th[ks][0] = a.x, Th[ks][1] = a.y, Th[ks][2] = a.z, Th[ks][3] = a.w;
        Tl[ks][0] = b.x, Tl[ks][1] = b.y, Tl[ks][2] = b.z, Tl[ks][3] = b.w;
        Mf[ks][0] = m.x, Mf[ks][1] = m.y, Mf[ks][2] = m.z, Mf[ks][3] = m.w;
      }
    }
    const float4* vec = reinterpret_cast<const float4*>(rec + Rec::kVec);
    const float4 vr0 = __ldg(vec + 16 * warp + g8), vr1 = __ldg(vec + 16 * warp + g8 + 8);
    const float dlast = __ldg(reinterpret_cast<const float*>(rec + Rec::kDecay));

    char* stage = smem_all + (kStages == 2 ? ((chunk - cb) & 1) * kStageBytes : 0);
    __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageQ);
    __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageK);
    __nv_bfloat16* Vs = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageV);
    if constexpr (kStages == 1) {
      __syncthreads();  // every warp is done with the previous chunk's stage
      scan_load<BV>(p, smem_all, row0, Lc, kh, vcol, tid);
    }
    cp_async_wait_all();
    __syncthreads();  // this chunk's rows landed; every warp is done with the previous chunk
    GDN_PHASE(1);
    if constexpr (kStages == 2)
      if (chunk + 1 < ce)
        scan_load<BV>(p, smem_all + ((chunk + 1 - cb) & 1) * kStageBytes, row0 + kC, min(kC, len - c0 - kC), kh, vcol,
                      tid);

    // ---- KS = K S (raw k rows of warp w, S as bf16 + residual) and O = Q S (raw q, bf16 S).
    // K S against S's bf16 part and its residual accumulate separately (two shorter mma chains), summed below.
    float accK[kNT][4], accKL[kNT][4], accO[kNT][4], accU[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) accK[n][e] = accKL[n][e] = accO[n][e] = accU[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kDK / 16; ++kk) {
      uint32_t ka[4], qa[4];
      ldsm_x4(ka, Ks + (16 * warp + lrow) * kQLD + kk * 16 + lcol);
      ldsm_x4(qa, Qs + (16 * warp + lrow) * kQLD + kk * 16 + lcol);
#pragma unroll
      for (int np = 0; np < kNP; ++np) {
        uint32_t b[4], bl[4];
        const int off = (16 * kk + (bm & 1) * 8 + (lane & 7)) * kVLD + 16 * np + (bm >> 1) * 8;
        ldsm_x4_t(b, Ss + off);
        ldsm_x4_t(bl, SL + off);
        mma_bf16(accK[2 * np], ka, b[0], b[1]);
        mma_bf16(accK[2 * np + 1], ka, b[2], b[3]);
        mma_bf16(accKL[2 * np], ka, bl[0], bl[1]);
        mma_bf16(accKL[2 * np + 1], ka, bl[2], bl[3]);
        mma_bf16(accO[2 * np], qa, b[0], b[1]);
        mma_bf16(accO[2 * np + 1], qa, b[2], b[3]);
      }
    }
    // ---- R = beta (V - e^G KS / |k|) to shared memory as bf16 + residual.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * warp + g8 + 8 * hf;
      const float bi = hf ? vr1.x : vr0.x, ci = hf ? vr1.y : vr0.y;
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        const int y = 8 * n + 2 * t4;
        const float2 vv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Vs + i * kVLD + y));
        const float k0 = accK[n][2 * hf] + accKL[n][2 * hf], k1 = accK[n][2 * hf + 1] + accKL[n][2 * hf + 1];
        const float r0 = bi * vv.x - ci * k0, r1 = bi * vv.y - ci * k1;
        const __nv_bfloat162 rh = __floats2bfloat162_rn(r0, r1);
        *reinterpret_cast<__nv_bfloat162*>(RH + i * kVLD + y) = rh;
        *reinterpret_cast<uint32_t*>(RL + i * kVLD + y) = pack_bf16(r0 - __low2float(rh), r1 - __high2float(rh));
      }
    }
    __syncthreads();
    GDN_PHASE(2);

    // ---- V' = T R (rows of warp w), T and R each as bf16 + residual (the residual product dropped).
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (ks > warp) continue;
#pragma unroll
      for (int np = 0; np < kNP; ++np) {
        uint32_t b[4], bl[4];
        const int off = (16 * ks + (bm & 1) * 8 + (lane & 7)) * kVLD + 16 * np + (bm >> 1) * 8;
        ldsm_x4_t(b, RH + off);
        ldsm_x4_t(bl, RL + off);
        mma_bf16(accU[2 * np], Th[ks], b[0], b[1]);
        mma_bf16(accU[2 * np + 1], Th[ks], b[2], b[3]);
        mma_bf16(accU[2 * np], Tl[ks], b[0], b[1]);
        mma_bf16(accU[2 * np + 1], Tl[ks], b[2], b[3]);
        mma_bf16(accU[2 * np], Th[ks], bl[0], bl[1]);
        mma_bf16(accU[2 * np + 1], Th[ks], bl[2], bl[3]);
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * warp + g8 + 8 * hf;
      const float el = hf ? vr1.z : vr0.z, eg = hf ? vr1.w : vr0.w;
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        const int y = 8 * n + 2 * t4;
        const float u0 = accU[n][2 * hf], u1 = accU[n][2 * hf + 1];
        *reinterpret_cast<uint32_t*>(VN + i * kVLD + y) = pack_bf16(u0, u1);
        const __nv_bfloat162 eh = __floats2bfloat162_rn(u0 * el, u1 * el);
        *reinterpret_cast<__nv_bfloat162*>(VE + i * kVLD + y) = eh;
        *reinterpret_cast<uint32_t*>(VL + i * kVLD + y) =
            pack_bf16(u0 * el - __low2float(eh), u1 * el - __high2float(eh));
        accO[n][2 * hf] *= eg;
        accO[n][2 * hf + 1] *= eg;
      }
    }
    __syncthreads();
    GDN_PHASE(3);

    // ---- O += M V' and store; S = e^{G_L} S + K^T (e^{G_L - G} V').
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (ks > warp) continue;
#pragma unroll
      for (int np = 0; np < kNP; ++np) {
        uint32_t b[4];
        ldsm_x4_t(b, VN + (16 * ks + (bm & 1) * 8 + (lane & 7)) * kVLD + 16 * np + (bm >> 1) * 8);
        mma_bf16(accO[2 * np], Mf[ks], b[0], b[1]);
        mma_bf16(accO[2 * np + 1], Mf[ks], b[2], b[3]);
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * warp + g8 + 8 * hf;
      if (i < Lc) {
        __nv_bfloat16* o = p.out + ((row0 + i) * Hv + h) * dv + v0;
#pragma unroll
        for (int n = 0; n < kNT; ++n)
          *reinterpret_cast<uint32_t*>(o + 8 * n + 2 * t4) = pack_bf16(accO[n][2 * hf], accO[n][2 * hf + 1]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) Sa[mt][nt][e] *= dlast;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t ka[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldsm_x4_t(ka[mt], Ks + (16 * ks + (bm >> 1) * 8 + (lane & 7)) * kQLD + 32 * warp + 16 * mt + (bm & 1) * 8);
#pragma unroll
      for (int np = 0; np < kNP; ++np) {
        uint32_t b[4], bl[4];
        ldsm_x4_t(b, VE + (16 * ks + (bm & 1) * 8 + (lane & 7)) * kVLD + 16 * np + (bm >> 1) * 8);
        ldsm_x4_t(bl, VL + (16 * ks + (bm & 1) * 8 + (lane & 7)) * kVLD + 16 * np + (bm >> 1) * 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16(Sa[mt][2 * np], ka[mt], b[0], b[1]);
          mma_bf16(Sa[mt][2 * np + 1], ka[mt], b[2], b[3]);
          mma_bf16(Sa[mt][2 * np], ka[mt], bl[0], bl[1]);
          mma_bf16(Sa[mt][2 * np + 1], ka[mt], bl[2], bl[3]);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int x = 32 * warp + 16 * mt + g8 + 8 * hf, y = 8 * nt + 2 * t4;
          const float s0 = Sa[mt][nt][2 * hf], s1 = Sa[mt][nt][2 * hf + 1];
          const __nv_bfloat162 sh = __floats2bfloat162_rn(s0, s1);
          *reinterpret_cast<__nv_bfloat162*>(Ss + x * kVLD + y) = sh;
          *reinterpret_cast<uint32_t*>(SL + x * kVLD + y) = pack_bf16(s0 - __low2float(sh), s1 - __high2float(sh));
        }
    for (int n = 0; n < num_snaps; ++n) {
      const GdnSnapshot sn = snaps[n];
      if (sn.seq != s || sn.chunk != chunk) continue;
      float* D = p.state_pool + (size_t(sn.dst_slot) * Hv + h) * head_elems + v0;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int x = 32 * warp + 16 * mt + g8 + 8 * hf, y = 8 * nt + 2 * t4;
            *reinterpret_cast<float2*>(D + size_t(x) * dv + y) = make_float2(Sa[mt][nt][2 * hf], Sa[mt][nt][2 * hf + 1]);
          }
    }
    GDN_PHASE(4);
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int x = 32 * warp + 16 * mt + g8 + 8 * hf, y = 8 * nt + 2 * t4;
        *reinterpret_cast<float2*>(Sg + size_t(x) * dv + y) = make_float2(Sa[mt][nt][2 * hf], Sa[mt][nt][2 * hf + 1]);
      }
  if (phase_cycles != nullptr && threadIdx.x == 0)
    for (int k = 1; k < kGdnTcPhases; ++k) atomicAdd(phase_cycles + k, prof_acc[k]);
#undef GDN_PHASE
}

const prof::Kernel kGdnTcScan{"gdn_tc_scan_kernel", prof::Category::DeltaNet};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The records' scratch, one per device, grown on demand (never during a stream capture).
struct ScratchPool {
  std::mutex mu;
  std::map<int, std::pair<char*, size_t>> bufs;
};
ScratchPool& scratch_pool() {
  static ScratchPool* pool = new ScratchPool();  // never destroyed: frees after the driver's teardown crash
  return *pool;
}

char* scratch(size_t bytes, cudaStream_t stream) {
  int dev = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  ScratchPool& pool = scratch_pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  auto& [ptr, have] = pool.bufs[dev];
  if (have >= bytes) return ptr;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  MOEFOLD_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) return nullptr;  // no allocation inside a capture
  if (ptr != nullptr) MOEFOLD_CUDA_CHECK(cudaFree(ptr));   // synchronises: earlier launches are done with it
  ptr = nullptr;
  have = 0;
  if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // out of memory: clear it, the caller takes the fused kernel
    ptr = nullptr;
    return nullptr;
  }
  have = bytes;
  return ptr;
}

template <int BV, int kStages>
void launch_scan(dim3 grid, cudaStream_t stream, const GdnArgs& args, const int32_t* cu, const int32_t* base,
                 const char* recs, int w0, int w1, const GdnSnapshot* snaps, const int32_t* num_snaps, int max_snaps,
                 const GdnDims& d, unsigned long long* phases) {
  const int smem = ScanSmem<BV>::smem_bytes(kStages);
  MOEFOLD_CUDA_CHECK(
      cudaFuncSetAttribute(gdn_tc_scan_kernel<BV, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  launch_pdl(gdn_tc_scan_kernel<BV, kStages>, grid, dim3(kThreads), size_t(smem), stream, args, cu, base, recs, w0, w1,
             snaps, num_snaps, max_snaps, d.num_k_heads, d.num_v_heads, d.v_dim, phases);
}

}  // namespace

bool gdn_prefill_tc_split(const GdnArgs& args, const int32_t* cu_seqlens, int max_seqs, const GdnSnapshot* snapshots,
                          const int32_t* num_snapshots, int max_snapshots, const GdnDims& dims, cudaStream_t stream) {
  if (args.max_rows <= 0 || env_int("MOEFOLD_GDN_TC_SPLIT", 1) == 0) return false;
  // Upper bound on the launch's chunks: sum over sequences of ceil(len / 64) <= (rows + 63 * nonempty) / 64.
  const int64_t bound = (args.max_rows + int64_t(kC - 1) * std::min<int64_t>(max_seqs, args.max_rows)) / kC;
  const int64_t rec_bytes = int64_t(Rec::kBytes) * dims.num_v_heads;
  const int64_t cap = int64_t(std::max(1, env_int("MOEFOLD_GDN_TC_SCRATCH_MB", 512))) << 20;
  int64_t window = std::max<int64_t>(1, cap / rec_bytes);
  if (const int w = env_int("MOEFOLD_GDN_TC_WINDOW", 0); w > 0) window = w;  // chunks per window (tests)
  window = std::min(window, bound);
  const size_t base_bytes = (size_t(max_seqs + 1) * sizeof(int32_t) + 255) & ~size_t(255);
  char* buf = scratch(base_bytes + size_t(window * rec_bytes), stream);
  if (buf == nullptr) return false;
  int32_t* base = reinterpret_cast<int32_t*>(buf);
  char* recs = buf + base_bytes;

  int dev = 0, sms = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // Value columns per state-pass block: 16 when dv is not a multiple of 32 or the 32-column grid would not
  // fill the SMs, else 32 (MOEFOLD_GDN_TC_BV=16|32 forces). Input stages: 2 while the grid is resident at
  // once (one 32-column or two 16-column blocks per SM), else 1 (MOEFOLD_GDN_TC_STAGES=1|2 forces).
  const int64_t blocks32 = int64_t(dims.v_dim / 32) * dims.num_v_heads * max_seqs;
  int bv = (dims.v_dim % 32 != 0 || blocks32 < sms) ? 16 : 32;
  if (const int e = env_int("MOEFOLD_GDN_TC_BV", 0); (e == 16 || e == 32) && dims.v_dim % e == 0) bv = e;
  const dim3 grid(unsigned(dims.v_dim / bv), unsigned(dims.num_v_heads), unsigned(max_seqs));
  const int64_t blocks = int64_t(grid.x) * grid.y * grid.z;
  int stages = blocks <= int64_t(sms) * (bv == 16 ? 2 : 1) ? 2 : 1;
  if (const int e = env_int("MOEFOLD_GDN_TC_STAGES", 0); e == 1 || e == 2) stages = e;

  // Value heads per chunk-kernel block: all that share a key head, up to 8 (MOEFOLD_GDN_TC_GROUP=1 forces one).
  int group = dims.num_v_heads / dims.num_k_heads;
  if (group > 8 || env_int("MOEFOLD_GDN_TC_GROUP", 0) == 1) group = 1;
  launch_chunk_base(cu_seqlens, args.num_seqs, max_seqs, base, stream);
  const GdnSnapshot* snaps = max_snapshots > 0 ? snapshots : nullptr;
  const int32_t* nsnaps = max_snapshots > 0 ? num_snapshots : nullptr;
  unsigned long long* phases = gdn_prefill_tc_phase_buffer();
  for (int64_t w0 = 0; w0 < bound; w0 += window) {
    const int64_t n = std::min(window, bound - w0);
    launch_chunk_records(args, cu_seqlens, base, max_seqs, int(w0), int(n), dims, group, recs, stream);
    LaunchScope launch(kGdnTcScan, stream, [&] {
      const prof::StepFacts* f = prof::step_facts();
      return f && w0 == 0 ? gdn_work(f->rows, work_seqs(max_seqs), dims) : prof::Work{};
    });
    const int w1 = int(w0 + n);
    if (bv == 32) {
      if (stages == 2) launch_scan<32, 2>(grid, stream, args, cu_seqlens, base, recs, int(w0), w1, snaps, nsnaps, max_snapshots, dims, phases);
      else launch_scan<32, 1>(grid, stream, args, cu_seqlens, base, recs, int(w0), w1, snaps, nsnaps, max_snapshots, dims, phases);
    } else {
      if (stages == 2) launch_scan<16, 2>(grid, stream, args, cu_seqlens, base, recs, int(w0), w1, snaps, nsnaps, max_snapshots, dims, phases);
      else launch_scan<16, 1>(grid, stream, args, cu_seqlens, base, recs, int(w0), w1, snaps, nsnaps, max_snapshots, dims, phases);
    }
    MOEFOLD_CUDA_CHECK_LAUNCH();
  }
  return true;
}

}  // namespace moefold::cuda::detail
