// Flash prefill attention over the paged KV cache (see attention.h for the contract).
//
// FlashAttention-2 structure on mma.sync m16n8k16 (bf16 inputs, fp32 accumulate). A block of 8
// warps owns 128 query rows of ONE KV head: rows are (token, q head) pairs, token-major, so the G
// query heads of a KV head share every K/V tile read (GQA); each warp owns 16 rows. K and V tiles of
// 64 keys are gathered from the cache pages through the block table with cp.async into two
// shared-memory stages each (rows padded by 16 bytes: conflict-free ldmatrix): the next K tile loads
// while this tile's S = Q K^T, softmax and P V run, the next V tile while the next S runs. Q stays in
// registers (head_dim <= 128) or shared memory (larger). Online softmax in fp32 on the S fragments
// (each thread owns 2 rows, statistics reduced over the 4-thread quad; exp2 of the scaled scores with
// one FFMA), P rounded to bf16 as the A operand of P V (as FlashAttention does). Causal: keys past a
// tile's last token are never loaded, and the mask is evaluated only on the tiles that straddle the
// diagonal. Tiles are scheduled longest first (reverse query order). The output gate is applied on the
// store. Head sizes below an instance run on the next larger instance with zero-filled dims.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <mutex>

#include "core/error.h"
#include "ops/cuda/attention_flash.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"

namespace moefold::cuda::detail {
using namespace ptx;
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32, kBM = kWarps * 16, kBN = 64;

template <int D>
struct FlashCfg {
  static constexpr int KS = D + 8;        // smem row stride (elements)
  static constexpr int CH = D / 8;        // 16-byte chunks per row
  static constexpr bool kQReg = D <= 128;  // Q fragments held in registers
  static constexpr size_t smem = size_t(kBM + 4 * kBN) * KS * sizeof(bf16);
};

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

/// 2^x on the special-function unit (ex2.approx.ftz: 2 ulp; -inf -> 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1) attn_fa_kernel(const FlashArgs a) {
  pdl_begin();
  using C = FlashCfg<D>;
  constexpr int KS = C::KS, CH = C::CH, NT = kBN / 8, DT = D / 8, KT = D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kBM * KS;      // 2 stages
  bf16* Vs = Ks + 2 * kBN * KS;  // 2 stages

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int s = blockIdx.z;
  const int qtile = a.qtiles - 1 - int(blockIdx.y);  // longest (causal) tiles first
  const int kvh = int(blockIdx.x) / a.head_chunks, hchunk = int(blockIdx.x) % a.head_chunks;
  const int row0 = a.cu[s], n = a.cu[s + 1] - row0, ctx = a.ctx[s];
  if (ctx < 0) return;
  const int t0 = qtile * a.TB;
  if (t0 >= n) return;
  const int kv_end = ctx + min(t0 + a.TB, n);
  const int dch = a.dh / 8;  // live chunks per row

  // Q tile: row rb = (token t0 + rb / HB, head hchunk * HB + rb % HB); invalid rows and dims zero.
  for (int idx = tid; idx < kBM * CH; idx += kThreads) {
    const int rb = idx / CH, c = idx % CH, tb = rb / a.HB, hg = hchunk * a.HB + rb % a.HB;
    bf16* d = Qs + rb * KS + c * 8;
    if (tb < a.TB && t0 + tb < n && hg < a.G && c < dch)
      cp_async16(d, a.q + int64_t(row0 + t0 + tb) * a.q_ts + int64_t(kvh * a.G + hg) * a.q_hs + c * 8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
  cp_async_commit();

  const int32_t* bt = a.bt + int64_t(s) * a.max_blocks;
  // K or V tile of keys [kb, kb + kBN): keys >= kv_end (never-written slots may hold anything) and
  // dims >= dh are zero-filled.
  auto load_kv = [&](bf16* dst, const bf16* cache, int kb) {
#pragma unroll
    for (int i = 0; i < (kBN * CH + kThreads - 1) / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      if ((kBN * CH) % kThreads != 0 && idx >= kBN * CH) break;
      const int rr = idx / CH, c = idx % CH, key = kb + rr;
      bf16* d = dst + rr * KS + c * 8;
      if (key < kv_end && c < dch) {
        const int pi = a.bs_shift >= 0 ? key >> a.bs_shift : key / a.block_size;
        const int64_t page = bt[pi];
        const int64_t slot = page * a.block_size + (key - pi * a.block_size);
        cp_async16(d, cache + (slot * a.Hkv + kvh) * a.dh + c * 8);
      } else {
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
      }
    }
  };
  load_kv(Ks, a.kc, 0);
  cp_async_commit();
  load_kv(Vs, a.vc, 0);
  cp_async_commit();

  // This thread's two rows: warp * 16 + g and + 8.
  int lim[2], tok[2], head[2];
  bool valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rb = warp * 16 + g + 8 * i, tb = rb / a.HB, hg = hchunk * a.HB + rb % a.HB;
    valid[i] = tb < a.TB && t0 + tb < n && hg < a.G;
    tok[i] = t0 + tb;
    head[i] = kvh * a.G + hg;
    lim[i] = valid[i] ? ctx + tok[i] : kv_end - 1;
  }
  const int full_end = ctx + t0 + 1;  // keys below this are visible to every row of the tile

  uint32_t qf[C::kQReg ? KT : 1][4];
  cp_async_wait<2>();  // the Q group
  __syncthreads();
  if constexpr (C::kQReg) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) ldmatrix_x4(qf[kk], Qs + (warp * 16 + (lane & 15)) * KS + kk * 16 + (lane >> 4) * 8);
  }

  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = a.scale_log2;

  const int ntiles = (kv_end + kBN - 1) / kBN;
  for (int jt = 0; jt < ntiles; ++jt) {
    const int kb = jt * kBN, st = jt & 1;
    const bf16* Kt = Ks + st * kBN * KS;
    const bf16* Vt = Vs + st * kBN * KS;
    cp_async_wait<1>();  // K(jt) landed (V(jt) may still be in flight)
    __syncthreads();     // ... for every thread; every warp is done with K(jt - 1)
    if (jt + 1 < ntiles) load_kv(Ks + (st ^ 1) * kBN * KS, a.kc, kb + kBN);
    cp_async_commit();

    float sc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      uint32_t qa[4];
      if constexpr (C::kQReg) {
        qa[0] = qf[kk][0], qa[1] = qf[kk][1], qa[2] = qf[kk][2], qa[3] = qf[kk][3];
      } else {
        ldmatrix_x4(qa, Qs + (warp * 16 + (lane & 15)) * KS + kk * 16 + (lane >> 4) * 8);
      }
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        uint32_t kf[4];
        ldmatrix_x4(kf, Kt + (16 * p + ((lane >> 4) << 3) + (lane & 7)) * KS + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16_16816(sc[2 * p], qa, kf[0], kf[1]);
        mma_bf16_16816(sc[2 * p + 1], qa, kf[2], kf[3]);
      }
    }
    if (kb + kBN > full_end) {  // tile straddles the diagonal (or the end): causal mask
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kb + 8 * j + 2 * tig + (e & 1) > lim[e >> 1]) sc[j][e] = -INFINITY;
    }
    // Online softmax (m in raw score units; probabilities exp2(s * scale_log2 - m * scale_log2)).
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(sc[j][0], sc[j][1]));
      mx[1] = fmaxf(mx[1], fmaxf(sc[j][2], sc[j][3]));
    }
    float msc[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      msc[i] = mx[i] == -INFINITY ? 0.0f : mx[i] * sl2;
      // An unchanged max rescales by exactly 1, so key tiles wholly past a row's last key are exact no-ops
      // and a row's bits do not depend on where its query tile starts (m * sl2 - msc alone contracts to
      // fma(m, sl2, -msc), the rounding error of m * sl2, whose exp2 is not always 1).
      const float alpha = mx[i] == m[i] ? 1.0f : fast_exp2(m[i] * sl2 - msc[i]);
      m[i] = mx[i];
      l[i] *= alpha;
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        o[j][2 * i] *= alpha;
        o[j][2 * i + 1] *= alpha;
      }
    }
    uint32_t pa[kBN / 16][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float p0 = fast_exp2(fmaf(sc[j][0], sl2, -msc[0])), p1 = fast_exp2(fmaf(sc[j][1], sl2, -msc[0]));
      const float p2 = fast_exp2(fmaf(sc[j][2], sl2, -msc[1])), p3 = fast_exp2(fmaf(sc[j][3], sl2, -msc[1]));
      l[0] += p0 + p1;
      l[1] += p2 + p3;
      pa[j / 2][(j & 1) * 2 + 0] = pack2(p0, p1);
      pa[j / 2][(j & 1) * 2 + 1] = pack2(p2, p3);
    }

    cp_async_wait<1>();  // V(jt) landed (K(jt + 1) may still be in flight)
    __syncthreads();     // ... for every thread; every warp is done with V(jt - 1)
    if (jt + 1 < ntiles) load_kv(Vs + (st ^ 1) * kBN * KS, a.vc, kb + kBN);
    cp_async_commit();
#pragma unroll
    for (int k2 = 0; k2 < kBN / 16; ++k2)
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, Vt + (16 * k2 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KS + 16 * dp + (lane >> 4) * 8);
        mma_bf16_16816(o[2 * dp], pa[k2], vf[0], vf[1]);
        mma_bf16_16816(o[2 * dp + 1], pa[k2], vf[2], vf[3]);
      }
  }
  cp_async_wait_all();  // no copy outlives the block

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
    const int64_t grow = row0 + tok[i];
    const float inv = 1.0f / l[i];
    bf16* orow = a.out + (grow * a.Hq + head[i]) * a.dh;
    const bf16* grow_gate = a.gate ? a.gate + grow * a.g_ts + int64_t(head[i]) * a.g_hs : nullptr;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      const int d = 8 * j + 2 * tig;
      if (8 * j >= a.dh) break;
      float v0 = o[j][2 * i] * inv, v1 = o[j][2 * i + 1] * inv;
      if (grow_gate) {
        const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(grow_gate + d));
        v0 *= sigmoidf_(gf.x);
        v1 *= sigmoidf_(gf.y);
      }
      *reinterpret_cast<__nv_bfloat162*>(orow + d) = __floats2bfloat162_rn(v0, v1);
    }
  }
}

template <int D>
void launch(const FlashArgs& a, dim3 grid, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(attn_fa_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(FlashCfg<D>::smem)));
  });
  launch_pdl(attn_fa_kernel<D>, grid, dim3(kThreads), FlashCfg<D>::smem, stream, a);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

/// The instance running head size dh (0 when none).
int instance_for(int dh) {
  if (dh < 16 || dh > 256 || dh % 16 != 0) return 0;
  for (int d : {32, 64, 80, 96, 128, 192, 256})
    if (dh <= d) return d;
  return 0;
}

}  // namespace

bool flash_supports_head_dim(int head_dim) { return instance_for(head_dim) != 0; }

void launch_attention_flash(FlashArgs a, int num_seqs, int max_q_len, cudaStream_t stream) {
  const int inst = instance_for(a.dh);
  MOEFOLD_CHECK(inst != 0, "attention: head_dim {} not supported on the GPU (multiples of 16 from 16 to 256)", a.dh);
  a.HB = std::min(a.G, kBM);
  a.TB = kBM / a.HB;
  a.head_chunks = (a.G + a.HB - 1) / a.HB;
  a.bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __builtin_ctz(unsigned(a.block_size)) : -1;
  a.qtiles = (max_q_len + a.TB - 1) / a.TB;
  MOEFOLD_CHECK(a.qtiles <= 65535, "attention_prefill: {} query rows per sequence exceed the grid ({} tiles)",
                max_q_len, a.qtiles);
  const dim3 grid(unsigned(a.Hkv * a.head_chunks), unsigned(a.qtiles), unsigned(num_seqs));
  switch (inst) {
    case 32: launch<32>(a, grid, stream); break;
    case 64: launch<64>(a, grid, stream); break;
    case 80: launch<80>(a, grid, stream); break;
    case 96: launch<96>(a, grid, stream); break;
    case 128: launch<128>(a, grid, stream); break;
    case 192: launch<192>(a, grid, stream); break;
    default: launch<256>(a, grid, stream); break;
  }
}

}  // namespace moefold::cuda::detail
