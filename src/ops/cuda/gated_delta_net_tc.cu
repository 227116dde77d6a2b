// Gated DeltaNet chunked prefill on tensor cores (mma.sync m16n8k16 bf16 -> fp32; the triangular solve's
// block products in tf32 m16n8k8), the gated WY / UT form with chunk C = 64, dk = 128: the fused kernel, the
// fallback of the split path (gated_delta_net_tc_split.cu: the same math with the state-independent work in
// a chunk-parallel kernel), which gdn_prefill_tc tries first.
//
// One block of 4 warps per (32 value columns, value head, sequence) walks its sequence chunk by chunk;
// for grids of at most one block per SM the next chunk's raw q, k, v rows stream into a second
// shared-memory stage (cp.async) meanwhile, larger grids run two blocks per SM with one stage each. Warp w
// owns chunk rows R_w = [16w, 16w + 16) unless said otherwise. Per chunk (G = cumulative log-decay):
//   0. inverse norms 1/|q|, 1/|k| (the raw bf16 q, k feed the tensor cores exactly; the norms scale the
//      products), gates g / beta (warp 0) and the scan G.
//   1. A = tril(beta_i k_i.k_j exp(G_i - G_j), -1) (warp w computes row block 3 - w: balances the
//      triangle) into shared fp32; M = tril(q_i.k_j exp(G_i - G_j)) kept in registers as bf16 fragments.
//   2. T = (I + A)^-1: each warp inverts its 16x16 diagonal block by forward substitution (fp32), then
//      warp j fills column block j: T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj (tf32 tensor cores).
//   3. KS = K S and R = diag(beta) (V - diag(exp G) KS) (each warp its rows, to shared memory), and
//      O = exp(G) Q S; then V' = T R (W = T diag(beta exp G) K is never formed: the dense K S is spread
//      evenly over the warps, only the small triangular T R stays with the row owner).
//   4. O += M V' (rows < chunk length stored), S = exp(G_last) S + K^T diag(exp(G_last - G)) V'.
// The state S (dk x 32, fp32) lives in registers, warp w holding rows [32w, 32w + 32); a bf16 copy in
// shared memory feeds the S products. Rows past the chunk's end are zero (k = q = v = beta = g = 0), which
// makes them no-ops. Precision: every product accumulates in fp32, q and k enter unrounded (raw bf16, the
// norms scale the products), and every operand on the state's path is bf16 + a bf16 residual (S in K S, T
// and R in T R, e^{G_L - G} V' in the update): single bf16 there moved the state by ~1e-3 relative in an
// emulation against an fp64 recurrence (slow decays). M, V' and S in O are single bf16 (bf16 output).
// Math: src/ops/cpu/gated_delta_net.cc.
#include "ops/cuda/gated_delta_net_tc.h"

#include <cstdint>
#include <cstdlib>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gated_delta_net_gating.cuh"
#include "ops/cuda/gated_delta_net_tc_mma.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda::detail {
namespace {

using namespace gdn_tc;

constexpr int kC = kGdnChunk;  // 64 rows per chunk
constexpr int kDK = 128;       // key dim
constexpr int kThreads = 128;  // 4 warps
constexpr int kQLD = kDK + 8;  // bf16 row pitch of q / k tiles (272 B: conflict-free ldmatrix)
constexpr int kFLD = kC + 4;   // fp32 row pitch of A and T
constexpr int kXLD = 24;       // fp32 row pitch of the per-warp 16x16 scratch

// Shared memory map (bytes) for BV value columns per block: kStages input stages, then the rest. A and
// the solve's scratch (live from step 1 to 2) share a region with V', its scaled copies and K S (live in
// steps 3 and 4).
constexpr int cmax(int a, int b) { return a > b ? a : b; }

template <int BV>
struct Layout {
  static constexpr int kVLD = BV + 8;  // bf16 row pitch of v, V', S, K S tiles (conflict-free ldmatrix)
  static constexpr int kStageQ = 0;
  static constexpr int kStageK = kStageQ + kC * kQLD * 2;
  static constexpr int kStageV = kStageK + kC * kQLD * 2;
  static constexpr int kStageBytes = kStageV + kC * kVLD * 2;
  static constexpr int kOffS = 0;                         // bf16 [kDK][kVLD] (offsets from the stages' end): S
  static constexpr int kOffSL = kOffS + kDK * kVLD * 2;   // bf16 [kDK][kVLD]: its bf16 rounding residual
  static constexpr int kOffReg = kOffSL + kDK * kVLD * 2; // shared region:
  static constexpr int kOffA = kOffReg;                   //   fp32 [kC][kFLD]: A
  static constexpr int kOffX = kOffA + kC * kFLD * 4;     //   fp32 [4][16][kXLD]: per-warp scratch of the solve
  static constexpr int kOffVN = kOffReg;                  //   bf16 [kC][kVLD]: V'
  static constexpr int kOffVE = kOffVN + kC * kVLD * 2;   //   bf16 [kC][kVLD]: V' e^(G_L - G) / |k|
  static constexpr int kOffVL = kOffVE + kC * kVLD * 2;   //   bf16 [kC][kVLD]: its bf16 rounding residual
  static constexpr int kOffRH = kOffVL + kC * kVLD * 2;   //   bf16 [kC][kVLD]: R = beta (V - e^G K S / |k|)
  static constexpr int kOffRL = kOffRH + kC * kVLD * 2;   //   bf16 [kC][kVLD]: its bf16 rounding residual
  static constexpr int kRegBytes = cmax(kC * kFLD * 4 + 4 * 16 * kXLD * 4, 5 * kC * kVLD * 2);
  static constexpr int kOffT = kOffReg + kRegBytes;       // fp32 [kC][kFLD]: T
  static constexpr int kOffVec = kOffT + kC * kFLD * 4;   // fp32 [7][kC]: G, beta, beta e^G, e^G, e^(G_L - G), 1/|q|, 1/|k|
  static constexpr int kRestBytes = kOffVec + 7 * kC * 4;
  static constexpr int smem_bytes(int stages) { return stages * kStageBytes + kRestBytes; }
};

// Streams rows [row0, row0 + n) of q, k (key head kh) and v (columns [vcol, vcol + 32)) into a stage;
// rows n..63 are zero-filled. BV: value columns per block.
template <int BV>
__device__ __forceinline__ void load_chunk(const GdnArgs& p, char* stage, int64_t row0, int n, int kh, int vcol,
                                           int tid) {
  using L = Layout<BV>;
  constexpr int kVLD = L::kVLD;
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
    cp_async16(V + r * kVLD + c, p.v + (row0 + (ok ? r : 0)) * p.row_stride + vcol + c, ok);
  }
  cp_async_commit();
}

// kStages = 2: the next chunk's rows stream in during this chunk (for grids of at most one block per SM);
// kStages = 1: ~93 KB of shared memory, two blocks per SM hide each other's loads (larger grids).
// kUnroll: unrolling of the long k loops (A/M, K S / Q S, the state update): kDK / 16 (fully; the
// 32-column default) or 1 (smaller code, measured slower).
template <int BV, int kStages, int kUnroll>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_prefill_tc_kernel(GdnArgs p, const int32_t* __restrict__ cu_seqlens, const GdnSnapshot* __restrict__ snaps,
                          const int32_t* __restrict__ num_snaps_p, int max_snaps, int Hk, int Hv, int dv,
                          unsigned long long* __restrict__ phase_cycles) {
  using L = Layout<BV>;
  constexpr int kVLD = L::kVLD, kStageBytes = L::kStageBytes;
  constexpr int kNT = BV / 8, kNP = BV / 16;  // n-tiles of 8 / ldmatrix pairs of 16 value columns
  pdl_begin();
  const int s = blockIdx.z;
  if (s >= *p.num_seqs) return;
  const int bos = cu_seqlens[s], len = cu_seqlens[s + 1] - bos;
  if (len <= 0) return;
  const int h = blockIdx.y, kh = h / (Hv / Hk);
  const int v0 = blockIdx.x * BV;
  // Optional per-phase cycle counts (thread 0's clock after each barrier; gdn_prefill_tc_profile).
  __shared__ unsigned long long prof_acc[9];
  long long prof_last = 0;
  if (phase_cycles != nullptr && threadIdx.x < 9) prof_acc[threadIdx.x] = 0;
#define GDN_PHASE(k)                                   \
  if (phase_cycles != nullptr && threadIdx.x == 0) {   \
    const long long now = clock64();                   \
    if ((k) > 0) prof_acc[(k)] += now - prof_last;     \
    prof_last = now;                                   \
  }
  const int vcol = h * dv + v0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, t4 = lane & 3;  // mma fragment coordinates
  const int slot = p.state_slots[s];
  const int num_snaps = (snaps != nullptr && num_snaps_p != nullptr) ? min(*num_snaps_p, max_snaps) : 0;
  const float qscale = rsqrtf(float(kDK));
  const float A_log = p.A_log[h], dt_bias = p.dt_bias[h];

  extern __shared__ __align__(16) char smem_all[];
  char* smem = smem_all + kStages * kStageBytes;  // everything past the stages
  __nv_bfloat16* Ss = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffS);
  __nv_bfloat16* VN = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffVN);
  __nv_bfloat16* VE = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffVE);
  __nv_bfloat16* VL = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffVL);
  __nv_bfloat16* SL = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffSL);
  __nv_bfloat16* RH = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffRH);
  __nv_bfloat16* RL = reinterpret_cast<__nv_bfloat16*>(smem + L::kOffRL);
  float* Af = reinterpret_cast<float*>(smem + L::kOffA);
  float* Tf = reinterpret_cast<float*>(smem + L::kOffT);
  float* Xs = reinterpret_cast<float*>(smem + L::kOffX) + warp * 16 * kXLD;
  float* Gs = reinterpret_cast<float*>(smem + L::kOffVec);
  float* Bs = Gs + kC;
  float* BG = Bs + kC;
  float* EG = BG + kC;
  float* EL = EG + kC;
  float* RQ = EL + kC;  // dk^-0.5 / |q_i| (raw bf16 q, k feed the tensor cores; the norms scale the products)
  float* RK = RQ + kC;  // 1 / |k_i|

  // State rows [32w, 32w + 32) x 32 columns in mma C layout: Sa[mt][nt] covers rows 32w + 16mt + {g, g+8},
  // columns 8nt + 2t + {0, 1}.
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

  const int nchunks = (len + kC - 1) / kC;
  if constexpr (kStages == 2) load_chunk<BV>(p, smem_all, bos, min(kC, len), kh, vcol, tid);
  // Raw gate logits of the next chunk's rows lane and lane + 32 (warp 0), prefetched a chunk ahead.
  float ra0 = 0.f, rb0 = 0.f, ra1 = 0.f, rb1 = 0.f;
  if (warp == 0) {
    const int64_t r = bos;
    if (lane < len) ra0 = __bfloat162float(p.a[(r + lane) * p.ab_stride + h]), rb0 = __bfloat162float(p.b[(r + lane) * p.ab_stride + h]);
    if (lane + 32 < len)
      ra1 = __bfloat162float(p.a[(r + lane + 32) * p.ab_stride + h]), rb1 = __bfloat162float(p.b[(r + lane + 32) * p.ab_stride + h]);
  }

  for (int chunk = 0; chunk < nchunks; ++chunk) {
    GDN_PHASE(0);
    const int c0 = chunk * kC, Lc = min(kC, len - c0);
    const int64_t row0 = int64_t(bos) + c0;
    char* stage = smem_all + (kStages == 2 ? (chunk & 1) * kStageBytes : 0);
    __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageQ);
    __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageK);
    __nv_bfloat16* Vs = reinterpret_cast<__nv_bfloat16*>(stage + L::kStageV);
    if constexpr (kStages == 1) {
      __syncthreads();  // every warp is done with the previous chunk's stage
      load_chunk<BV>(p, smem_all, row0, Lc, kh, vcol, tid);
    }
    cp_async_wait_all();
    __syncthreads();  // S0: this chunk's rows landed; every warp is done with the previous chunk
    GDN_PHASE(1);
    if constexpr (kStages == 2)
      if (chunk + 1 < nchunks)
        load_chunk<BV>(p, smem_all + ((chunk + 1) & 1) * kStageBytes, row0 + kC, min(kC, len - c0 - kC), kh, vcol, tid);

    // ---- 0. Inverse norms of q, k (a half-warp per row, 8 values per lane); gates and the scan G.
#pragma unroll 2
    for (int it = 0; it < 8; ++it) {
      const int r = 16 * warp + 2 * it + (lane >> 4), c = (lane & 15) * 8;
      const uint4 qv = *reinterpret_cast<const uint4*>(Qs + r * kQLD + c);
      const uint4 kv = *reinterpret_cast<const uint4*>(Ks + r * kQLD + c);
      const __nv_bfloat162* q2 = reinterpret_cast<const __nv_bfloat162*>(&qv);
      const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&kv);
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = __bfloat1622float2(q2[e]), b = __bfloat1622float2(k2[e]);
        sq += a.x * a.x + a.y * a.y;
        sk += b.x * b.x + b.y * b.y;
      }
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
        sk += __shfl_xor_sync(0xffffffffu, sk, o);
      }
      if ((lane & 15) == 0) {
        RQ[r] = rsqrtf(sq + 1e-6f) * qscale;
        RK[r] = rsqrtf(sk + 1e-6f);
      }
    }
    if (warp == 0) {
      float ga = 0.f, ba = 0.f, gb = 0.f, bb = 0.f;
      if (lane < Lc) gdn::gates(ra0, rb0, A_log, dt_bias, ga, ba);
      if (lane + 32 < Lc) gdn::gates(ra1, rb1, A_log, dt_bias, gb, bb);
      if (chunk + 1 < nchunks) {  // prefetch the next chunk's logits
        const int64_t r = row0 + kC;
        const int n = min(kC, len - c0 - kC);
        ra0 = rb0 = ra1 = rb1 = 0.f;
        if (lane < n) ra0 = __bfloat162float(p.a[(r + lane) * p.ab_stride + h]), rb0 = __bfloat162float(p.b[(r + lane) * p.ab_stride + h]);
        if (lane + 32 < n)
          ra1 = __bfloat162float(p.a[(r + lane + 32) * p.ab_stride + h]),
          rb1 = __bfloat162float(p.b[(r + lane + 32) * p.ab_stride + h]);
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float ta = __shfl_up_sync(0xffffffffu, ga, o), tb = __shfl_up_sync(0xffffffffu, gb, o);
        if (lane >= o) ga += ta, gb += tb;
      }
      gb += __shfl_sync(0xffffffffu, ga, 31);
      const float gl = __shfl_sync(0xffffffffu, gb, 31);  // G of row 63 == G of the last row (g = 0 past it)
      Gs[lane] = ga, Gs[lane + 32] = gb;
      Bs[lane] = ba, Bs[lane + 32] = bb;
      const float ea = __expf(ga), eb = __expf(gb);
      EG[lane] = ea, EG[lane + 32] = eb;
      BG[lane] = ba * ea, BG[lane + 32] = bb * eb;
      EL[lane] = __expf(gl - ga), EL[lane + 32] = __expf(gl - gb);
    }
    __syncthreads();  // S1
    GDN_PHASE(2);

    // ---- 1. A (row block 3 - w) to shared fp32; M (row block w) to bf16 A fragments.
    const int lrow = lane & 15, lcol = (lane >> 4) * 8;  // ldmatrix A-operand addressing
    const int bm = lane >> 3;                           // ldmatrix B-operand matrix index
    uint32_t Mf[4][4];
    {
      const int ra = 3 - warp;
      float accA[8][4], accM[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) accA[n][e] = accM[n][e] = 0.f;
#pragma unroll kUnroll
      for (int kk = 0; kk < kDK / 16; ++kk) {
        uint32_t ka[4], qa[4];
        ldsm_x4(ka, Ks + (16 * ra + lrow) * kQLD + kk * 16 + lcol);
        ldsm_x4(qa, Qs + (16 * warp + lrow) * kQLD + kk * 16 + lcol);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (np > ra && np > warp) continue;
          uint32_t b[4];
          ldsm_x4(b, Ks + (16 * np + (bm >> 1) * 8 + (lane & 7)) * kQLD + kk * 16 + (bm & 1) * 8);
          if (np <= ra) {
            mma_bf16(accA[2 * np], ka, b[0], b[1]);
            mma_bf16(accA[2 * np + 1], ka, b[2], b[3]);
          }
          if (np <= warp) {
            mma_bf16(accM[2 * np], qa, b[0], b[1]);
            mma_bf16(accM[2 * np + 1], qa, b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        if (n / 2 > ra) continue;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 16 * ra + g8 + 8 * hf, j = 8 * n + 2 * t4;
          const float gi = Gs[i], bi = Bs[i] * RK[i];
          const float a0 = j < i ? bi * RK[j] * __expf(gi - Gs[j]) * accA[n][2 * hf] : 0.f;
          const float a1 = j + 1 < i ? bi * RK[j + 1] * __expf(gi - Gs[j + 1]) * accA[n][2 * hf + 1] : 0.f;
          *reinterpret_cast<float2*>(Af + i * kFLD + j) = make_float2(a0, a1);
        }
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int e = 0; e < 4; ++e) Mf[ks][e] = 0u;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        if (n / 2 > warp) continue;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 16 * warp + g8 + 8 * hf, j = 8 * n + 2 * t4;
          const float gi = Gs[i], qi = RQ[i];
          const float m0 = j <= i ? qi * RK[j] * __expf(gi - Gs[j]) * accM[n][2 * hf] : 0.f;
          const float m1 = j + 1 <= i ? qi * RK[j + 1] * __expf(gi - Gs[j + 1]) * accM[n][2 * hf + 1] : 0.f;
          Mf[n / 2][(n & 1) * 2 + hf] = pack_bf16(m0, m1);
        }
      }
    }
    __syncthreads();  // S2
    GDN_PHASE(3);

    // ---- 2a. Diagonal blocks: T_ww = (I + A_ww)^-1, lane c < 16 owns column c.
    {
      const int c = lane & 15;
      const float* Ab = Af + 16 * warp * kFLD + 16 * warp;
      // Right-looking order: once x[j] is final it updates every later row (independent FMAs), so the
      // dependency chain is 15 FMAs long instead of 120.
      float x[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = i == c ? 1.f : 0.f;
#pragma unroll
      for (int j = 0; j < 15; ++j)
#pragma unroll
        for (int i = j + 1; i < 16; ++i) x[i] -= Ab[i * kFLD + j] * x[j];
      if (lane < 16) {
        float* Tb = Tf + 16 * warp * kFLD + 16 * warp + c;
#pragma unroll
        for (int i = 0; i < 16; ++i) Tb[i * kFLD] = x[i];
      }
    }
    // ---- 3a. KS = K S (raw k rows R_w, S as bf16 + residual) and O = e^G Q S (raw q, bf16 S) in registers:
    //          independent of T, so their mma overlap the latency-bound substitution above.
    float accU[kNT][4], accO[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) accU[n][e] = accO[n][e] = 0.f;
    float accK[kNT][4];
    {
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) accK[n][e] = 0.f;
#pragma unroll kUnroll
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
          mma_bf16(accK[2 * np], ka, bl[0], bl[1]);
          mma_bf16(accK[2 * np + 1], ka, bl[2], bl[3]);
          mma_bf16(accO[2 * np], qa, b[0], b[1]);
          mma_bf16(accO[2 * np + 1], qa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // S3
    GDN_PHASE(4);

    // ---- 2b. Column block j = w: T_ij = -T_ii (sum_{k=j}^{i-1} A_ik T_kj), i = j+1..3 in order.
    for (int i = warp + 1; i < 4; ++i) {
      float X[2][4] = {};
      for (int k = warp; k < i; ++k) {
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          const float* Ap = Af + (16 * i + g8) * kFLD + 16 * k + 8 * ks + t4;
          const uint32_t a0 = tf32(Ap[0]), a1 = tf32(Ap[8 * kFLD]), a2 = tf32(Ap[4]), a3 = tf32(Ap[8 * kFLD + 4]);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const float* Bp = Tf + (16 * k + 8 * ks + t4) * kFLD + 16 * warp + 8 * nt + g8;
            mma_tf32(X[nt], a0, a1, a2, a3, tf32(Bp[0]), tf32(Bp[4 * kFLD]));
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        *reinterpret_cast<float2*>(Xs + g8 * kXLD + 8 * nt + 2 * t4) = make_float2(X[nt][0], X[nt][1]);
        *reinterpret_cast<float2*>(Xs + (g8 + 8) * kXLD + 8 * nt + 2 * t4) = make_float2(X[nt][2], X[nt][3]);
      }
      __syncwarp();
      float Y[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const float* Ap = Tf + (16 * i + g8) * kFLD + 16 * i + 8 * ks + t4;
        const uint32_t a0 = tf32(Ap[0]), a1 = tf32(Ap[8 * kFLD]), a2 = tf32(Ap[4]), a3 = tf32(Ap[8 * kFLD + 4]);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const float* Bp = Xs + (8 * ks + t4) * kXLD + 8 * nt + g8;
          mma_tf32(Y[nt], a0, a1, a2, a3, tf32(Bp[0]), tf32(Bp[4 * kXLD]));
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float* Tp = Tf + (16 * i + g8) * kFLD + 16 * warp + 8 * nt + 2 * t4;
        *reinterpret_cast<float2*>(Tp) = make_float2(-Y[nt][0], -Y[nt][1]);
        *reinterpret_cast<float2*>(Tp + 8 * kFLD) = make_float2(-Y[nt][2], -Y[nt][3]);
      }
      __syncwarp();
    }
    __syncthreads();  // S4
    GDN_PHASE(5);
    // ---- 3a'. R = beta (V - e^G KS / |k|) to shared memory as bf16 + residual (after S4: R shares the
    //           region with A, which 2b reads).
    {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * warp + g8 + 8 * hf;
        const float bi = Bs[i], ci = BG[i] * RK[i];  // beta, beta e^G / |k|
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          const int y = 8 * n + 2 * t4;
          const float2 vv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Vs + i * kVLD + y));
          const float r0 = bi * vv.x - ci * accK[n][2 * hf], r1 = bi * vv.y - ci * accK[n][2 * hf + 1];
          const __nv_bfloat162 rh = __floats2bfloat162_rn(r0, r1);
          *reinterpret_cast<__nv_bfloat162*>(RH + i * kVLD + y) = rh;
          *reinterpret_cast<uint32_t*>(RL + i * kVLD + y) = pack_bf16(r0 - __low2float(rh), r1 - __high2float(rh));
        }
      }
    }
    __syncthreads();  // S4b
    GDN_PHASE(6);
    // ---- 3b. V' = T R (rows R_w), T and R each as bf16 + residual (the residual product dropped).
    {
      uint32_t Th[4][4], Tl[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * warp + g8 + 8 * (e & 1), j = 16 * ks + 2 * t4 + 8 * (e >> 1);
          float2 tv = make_float2(0.f, 0.f);
          if (ks <= warp) tv = *reinterpret_cast<const float2*>(Tf + i * kFLD + j);
          const __nv_bfloat162 th = __floats2bfloat162_rn(tv.x, tv.y);
          Th[ks][e] = *reinterpret_cast<const uint32_t*>(&th);
          Tl[ks][e] = pack_bf16(tv.x - __low2float(th), tv.y - __high2float(th));
        }
      }
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
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * warp + g8 + 8 * hf;
      const float el = EL[i] * RK[i], eg = EG[i] * RQ[i];
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
    __syncthreads();  // S5
    GDN_PHASE(7);

    // ---- 4. O += M V' and store; S = e^{G_L} S + K^T (e^{G_L - G} V').
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
    const float dlast = EG[kC - 1];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) Sa[mt][nt][e] *= dlast;
#pragma unroll kUnroll
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
    GDN_PHASE(8);
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
    for (int k = 1; k < 9; ++k) atomicAdd(phase_cycles + k, prof_acc[k]);
#undef GDN_PHASE
}

const prof::Kernel kGdnPrefillTc{"gdn_prefill_tc_kernel", prof::Category::DeltaNet};

unsigned long long* g_phase_buf = nullptr;  // device [kGdnTcPhases] while profiling is on
bool g_profile = false;

}  // namespace

void gdn_prefill_tc_profile(bool on) {
  if (on && g_phase_buf == nullptr) {
    MOEFOLD_CUDA_CHECK(cudaMalloc(&g_phase_buf, kGdnTcPhases * sizeof(unsigned long long)));
    MOEFOLD_CUDA_CHECK(cudaMemset(g_phase_buf, 0, kGdnTcPhases * sizeof(unsigned long long)));
  }
  g_profile = on;
}

unsigned long long* gdn_prefill_tc_phase_buffer() { return g_profile ? g_phase_buf : nullptr; }

void gdn_prefill_tc_profile_read(unsigned long long (&cycles)[kGdnTcPhases]) {
  for (auto& c : cycles) c = 0;
  if (g_phase_buf == nullptr) return;
  MOEFOLD_CUDA_CHECK(cudaMemcpy(cycles, g_phase_buf, sizeof(cycles), cudaMemcpyDeviceToHost));
  MOEFOLD_CUDA_CHECK(cudaMemset(g_phase_buf, 0, sizeof(cycles)));
}

bool gdn_prefill_tc_enabled() {
  const char* v = std::getenv("MOEFOLD_GDN_TC");
  return !(v && v[0] == '0' && v[1] == '\0');
}

bool gdn_prefill_tc_supported(const GdnArgs& a, const GdnDims& d) {
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  int dev = 0, max_smem = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      max_smem < Layout<32>::smem_bytes(2))
    return false;
  return d.k_dim == kDK && d.v_dim % 16 == 0 && a.row_stride % 8 == 0 && aligned(a.q) && aligned(a.k) &&
         aligned(a.v) && (reinterpret_cast<uintptr_t>(a.state_pool) & 7u) == 0 &&
         (reinterpret_cast<uintptr_t>(a.out) & 3u) == 0;
}

void gdn_prefill_tc(const GdnArgs& args, const int32_t* cu_seqlens, int max_seqs, const GdnSnapshot* snapshots,
                    const int32_t* num_snapshots, int max_snapshots, const GdnDims& dims, cudaStream_t stream) {
  if (gdn_prefill_tc_split(args, cu_seqlens, max_seqs, snapshots, num_snapshots, max_snapshots, dims, stream)) return;
  int dev = 0, sms = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // Value columns per block: 32, or 16 when dv is not a multiple of 32 (MOEFOLD_GDN_TC_BV=16 forces 16).
  // Input stages: 2 while the grid fits one block per SM, else 1 (MOEFOLD_GDN_TC_STAGES=1|2 forces).
  // 32-column blocks unroll the long k loops fully (measured 3-6% faster); MOEFOLD_GDN_TC_UNROLL=1 rolls them.
  const char* bv_env = std::getenv("MOEFOLD_GDN_TC_BV");
  const char* st_env = std::getenv("MOEFOLD_GDN_TC_STAGES");
  const char* un_env = std::getenv("MOEFOLD_GDN_TC_UNROLL");
  const int bv = (dims.v_dim % 32 != 0 || (bv_env && std::atoi(bv_env) == 16)) ? 16 : 32;
  const dim3 grid(unsigned(dims.v_dim / bv), unsigned(dims.num_v_heads), unsigned(max_seqs));
  const int64_t blocks = int64_t(grid.x) * grid.y * grid.z;
  int stages = blocks > sms ? 1 : 2;
  if (st_env && (std::atoi(st_env) == 1 || std::atoi(st_env) == 2)) stages = std::atoi(st_env);
  void (*kernel)(GdnArgs, const int32_t*, const GdnSnapshot*, const int32_t*, int, int, int, int,
                 unsigned long long*) =
      bv == 32 ? (stages == 2 ? gdn_prefill_tc_kernel<32, 2, 8> : gdn_prefill_tc_kernel<32, 1, 8>)
               : (stages == 2 ? gdn_prefill_tc_kernel<16, 2, 1> : gdn_prefill_tc_kernel<16, 1, 1>);
  if (bv == 32 && un_env && std::atoi(un_env) == 1)  // rolled k loops (4-5% slower on the H200, 2026-12-01)
    kernel = stages == 2 ? gdn_prefill_tc_kernel<32, 2, 1> : gdn_prefill_tc_kernel<32, 1, 1>;
  const int smem = bv == 32 ? Layout<32>::smem_bytes(stages) : Layout<16>::smem_bytes(stages);
  MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  LaunchScope launch(kGdnPrefillTc, stream, [&] {
    const prof::StepFacts* f = prof::step_facts();
    return f ? gdn_work(f->rows, work_seqs(max_seqs), dims) : prof::Work{};
  });
  launch_pdl(kernel, grid, dim3(kThreads), size_t(smem), stream, args, cu_seqlens,
             max_snapshots > 0 ? snapshots : nullptr, max_snapshots > 0 ? num_snapshots : nullptr, max_snapshots,
             dims.num_k_heads, dims.num_v_heads, dims.v_dim, g_profile ? g_phase_buf : nullptr);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda::detail
