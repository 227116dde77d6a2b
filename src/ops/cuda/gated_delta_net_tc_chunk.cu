// Chunk-parallel kernels of the split tensor-core prefill (gated_delta_net_tc_split.cu has the overview):
// the global chunk numbering and, per (chunk, key head), the chunk-local part of every value head of that
// key head, written as records (gated_delta_net_tc_rec.cuh) for the state pass.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gated_delta_net_gating.cuh"
#include "ops/cuda/gated_delta_net_tc_mma.cuh"
#include "ops/cuda/gated_delta_net_tc_rec.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda::detail::gdn_tc {
namespace {

// Chunk kernel shared memory (bytes): q, k tiles, A, the per-row vectors; T reuses q's tile and the
// solve's per-warp scratch k's once A and M are formed.
struct ChunkSmem {
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kC * kQLD * 2;
  static constexpr int kA = kK + kC * kQLD * 2;
  static constexpr int kVec = kA + kC * kFLD * 4;  // fp32 [7][kC]: G, beta, beta e^G, e^G, e^(G_L - G), 1/|q|, 1/|k|
  static constexpr int kBytes = kVec + 7 * kC * 4;
  static_assert(kC * kFLD * 4 <= kC * kQLD * 2, "T fits in q's tile");
  static_assert(4 * 16 * kXLD * 4 <= kC * kQLD * 2, "the solve's scratch fits in k's tile");
};

// base[s] for s = 0..max_seqs: number of chunks of the live sequences before s (padding entries: the total).
__global__ void __launch_bounds__(1024) gdn_tc_chunk_base_kernel(const int32_t* __restrict__ cu,
                                                                 const int32_t* __restrict__ num_seqs_p, int max_seqs,
                                                                 int32_t* __restrict__ base) {
  pdl_begin();
  __shared__ int warp_sums[32];
  const int ns = min(*num_seqs_p, max_seqs);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int carry = 0;
  for (int t0 = 0; t0 <= max_seqs; t0 += blockDim.x) {
    const int s = t0 + threadIdx.x;
    int x = 0;  // chunks of sequence s - 1
    if (s >= 1 && s - 1 < ns) {
      const int len = cu[s] - cu[s - 1];
      x = len > 0 ? (len + kC - 1) / kC : 0;
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int w = lane < nw ? warp_sums[lane] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += y;
      }
      if (lane < nw) warp_sums[lane] = w;
    }
    __syncthreads();
    if (s <= max_seqs) base[s] = carry + x + (warp > 0 ? warp_sums[warp - 1] : 0);
    carry += warp_sums[nw - 1];
    __syncthreads();  // warp_sums is rewritten by the next tile
  }
}

// One block per (global chunk w0 + blockIdx.x, group blockIdx.y of `group` value heads sharing one key
// head): the chunk-local part of each of those heads, into its record. The raw products K K^T and Q K^T
// and the q / k norms are the key head's (computed once); gates, decay masks and T are per value head.
// kMinBlocks: blocks per SM the register budget is cut for (4: 128 registers, small spills; 3: 168).
template <int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gdn_tc_chunk_kernel(GdnArgs p, const int32_t* __restrict__ cu_seqlens, const int32_t* __restrict__ base,
                        int max_seqs, int w0, int Hk, int Hv, int group, char* __restrict__ recs) {
  pdl_begin();
  const int gc = w0 + int(blockIdx.x);
  if (gc >= base[max_seqs]) return;
  int lo = 0, hi = max_seqs;  // base[lo] <= gc < base[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (base[mid] <= gc) lo = mid;
    else hi = mid;
  }
  const int s = lo, chunk = gc - base[s];
  const int bos = cu_seqlens[s], len = cu_seqlens[s + 1] - bos;
  const int c0 = chunk * kC, Lc = min(kC, len - c0);
  const int64_t row0 = int64_t(bos) + c0;
  const int h0 = blockIdx.y * group, kh = h0 / (Hv / Hk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, t4 = lane & 3;
  const float qscale = rsqrtf(float(kDK));

  extern __shared__ __align__(16) char smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem + ChunkSmem::kQ);
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem + ChunkSmem::kK);
  float* Af = reinterpret_cast<float*>(smem + ChunkSmem::kA);
  float* Tf = reinterpret_cast<float*>(smem + ChunkSmem::kQ);  // after the raw products: q's tile
  float* Xs = reinterpret_cast<float*>(smem + ChunkSmem::kK) + warp * 16 * kXLD;
  float* Gs = reinterpret_cast<float*>(smem + ChunkSmem::kVec);
  float* Bs = Gs + kC;
  float* BG = Bs + kC;
  float* EG = BG + kC;
  float* EL = EG + kC;
  float* RQ = EL + kC;
  float* RK = RQ + kC;

#pragma unroll 4
  for (int e = tid; e < kC * (kDK / 8); e += kThreads) {
    const int r = e / (kDK / 8), c = (e % (kDK / 8)) * 8;
    const bool ok = r < Lc;
    const int64_t off = (row0 + (ok ? r : 0)) * p.row_stride + int64_t(kh) * kDK + c;
    cp_async16(Qs + r * kQLD + c, p.q + off, ok);
    cp_async16(Ks + r * kQLD + c, p.k + off, ok);
  }
  cp_async_commit();
  // Raw gate logits of rows lane and lane + 32 for the next value head (warp 0), fetched one head ahead.
  float ra0 = 0.f, rb0 = 0.f, ra1 = 0.f, rb1 = 0.f;
  const auto fetch = [&](int h) {
    ra0 = rb0 = ra1 = rb1 = 0.f;
    if (lane < Lc)
      ra0 = __bfloat162float(p.a[(row0 + lane) * p.ab_stride + h]), rb0 = __bfloat162float(p.b[(row0 + lane) * p.ab_stride + h]);
    if (lane + 32 < Lc)
      ra1 = __bfloat162float(p.a[(row0 + lane + 32) * p.ab_stride + h]),
      rb1 = __bfloat162float(p.b[(row0 + lane + 32) * p.ab_stride + h]);
  };
  if (warp == 0) fetch(h0);
  cp_async_wait_all();
  __syncthreads();

  // ---- Inverse norms of q, k (a half-warp per row).
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

  // ---- Raw products (registers, kept for every value head of the group): K_ra K^T for A's row block
  //      ra = 3 - w (balances the triangle), Q_w K^T for M's row block w.
  const int lrow = lane & 15, lcol = (lane >> 4) * 8;
  const int bm = lane >> 3;
  const int ra = 3 - warp;
  float accA[8][4], accM[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) accA[n][e] = accM[n][e] = 0.f;
#pragma unroll
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

  for (int g = 0; g < group; ++g) {
    const int h = h0 + g;
    char* rec = recs + (size_t(blockIdx.x) * Hv + h) * Rec::kBytes;
    // ---- Gates and the scan G of head h (warp 0); the next head's logits fetched meanwhile.
    if (warp == 0) {
      const float A_log = p.A_log[h], dt_bias = p.dt_bias[h];
      float ga = 0.f, ba = 0.f, gb = 0.f, bb = 0.f;
      if (lane < Lc) gdn::gates(ra0, rb0, A_log, dt_bias, ga, ba);
      if (lane + 32 < Lc) gdn::gates(ra1, rb1, A_log, dt_bias, gb, bb);
      if (g + 1 < group) fetch(h + 1);
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
    __syncthreads();  // gates and norms visible; (g = 0) every warp is done with the q / k tiles,
                      // (g > 0) with the previous head's T
    if (tid < kC)
      reinterpret_cast<float4*>(rec + Rec::kVec)[tid] =
          make_float4(Bs[tid], BG[tid] * RK[tid], EL[tid] * RK[tid], EG[tid] * RQ[tid]);
    if (tid == 0) *reinterpret_cast<float*>(rec + Rec::kDecay) = EG[kC - 1];

    // ---- A (row block ra) to shared fp32; M (row block w) to the record as bf16 A fragments.
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
    {
      uint32_t Mf[4][4];
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
      uint4* Mr = reinterpret_cast<uint4*>(rec + Rec::kM) + (warp * 4) * 32 + lane;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        if (ks <= warp) Mr[ks * 32] = make_uint4(Mf[ks][0], Mf[ks][1], Mf[ks][2], Mf[ks][3]);
    }
    __syncthreads();  // A complete

    // ---- Diagonal blocks: T_ww = (I + A_ww)^-1, lane c < 16 owns column c (right-looking substitution).
    {
      const int c = lane & 15;
      const float* Ab = Af + 16 * warp * kFLD + 16 * warp;
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
    __syncthreads();

    // ---- Column block j = w: T_ij = -T_ii (sum_{k=j}^{i-1} A_ik T_kj), i = j+1..3 in order (tf32 mma).
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
    __syncthreads();

    // ---- T's fragments (rows of warp w, k-blocks ks <= w) as bf16 + residual, into the record.
    uint4* Tr = reinterpret_cast<uint4*>(rec + Rec::kT) + ((warp * 4) * 32 + lane) * 2;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (ks > warp) continue;
      uint32_t th[4], tl[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * warp + g8 + 8 * (e & 1), j = 16 * ks + 2 * t4 + 8 * (e >> 1);
        const float2 tv = *reinterpret_cast<const float2*>(Tf + i * kFLD + j);
        const __nv_bfloat162 h2 = __floats2bfloat162_rn(tv.x, tv.y);
        th[e] = *reinterpret_cast<const uint32_t*>(&h2);
        tl[e] = pack_bf16(tv.x - __low2float(h2), tv.y - __high2float(h2));
      }
      Tr[ks * 64] = make_uint4(th[0], th[1], th[2], th[3]);
      Tr[ks * 64 + 1] = make_uint4(tl[0], tl[1], tl[2], tl[3]);
    }
  }
}

const prof::Kernel kGdnTcBase{"gdn_tc_chunk_base_kernel", prof::Category::DeltaNet};
const prof::Kernel kGdnTcChunk{"gdn_tc_chunk_kernel", prof::Category::DeltaNet};

}  // namespace

void launch_chunk_base(const int32_t* cu_seqlens, const int32_t* num_seqs, int max_seqs, int32_t* base,
                       cudaStream_t stream) {
  LaunchScope launch(kGdnTcBase, stream);
  launch_pdl(gdn_tc_chunk_base_kernel, dim3(1), dim3(1024), 0, stream, cu_seqlens, num_seqs, max_seqs, base);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void launch_chunk_records(const GdnArgs& args, const int32_t* cu_seqlens, const int32_t* base, int max_seqs, int w0,
                          int n, const GdnDims& dims, int group, char* recs, cudaStream_t stream) {
  // MOEFOLD_GDN_TC_CHUNK_BLOCKS=3 takes the 3-blocks-per-SM register budget (A/B runs).
  const char* e = std::getenv("MOEFOLD_GDN_TC_CHUNK_BLOCKS");
  void (*kernel)(GdnArgs, const int32_t*, const int32_t*, int, int, int, int, int, char*) =
      (e && e[0] == '3' && e[1] == '\0') ? gdn_tc_chunk_kernel<3> : gdn_tc_chunk_kernel<4>;
  MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ChunkSmem::kBytes));
  LaunchScope launch(kGdnTcChunk, stream);
  launch_pdl(kernel, dim3(unsigned(n), unsigned(dims.num_v_heads / group)), dim3(kThreads),
             size_t(ChunkSmem::kBytes), stream, args, cu_seqlens, base, max_seqs, w0, dims.num_k_heads,
             dims.num_v_heads, group, recs);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda::detail::gdn_tc
