// Prefill attention on Hopper warpgroup MMA (wgmma, sm_90a) over the paged KV cache; contract as
// attention.h: AttnKernel::Auto / Wgmma / WgmmaVt for head_dim 64, 128, 192, 256.
//
// Same tiling as attention_flash.cu (a block owns 128 (token, q head) rows of one KV head; key
// tiles gathered through the block table with cp.async: 128 keys for head_dim <= 128 in the
// MN-major variant, else 64), but the matrix products run on wgmma: each
// of the two warpgroups owns 64 rows, S = Q K^T is m64nBNk16 with Q and K read from shared memory in
// the 128-byte swizzled K-major layout (so each K tile is read by the tensor cores once per
// warpgroup, not once per warp as with ldmatrix), and O += P V is m64nDk16 with P in registers (the
// S accumulator layout is the m16n8k16 A-fragment layout) and V stored swizzled like K and read as
// an MN-major operand (the transpose bit; K and V double-buffered, one barrier per tile). The
// WgmmaVt variant instead transposes each V tile through shared memory into key-contiguous rows (a
// K-major operand). Online softmax as the flash kernel. The default for head_dim 64/128/192/256.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <mutex>

#include "core/error.h"
#include "ops/cuda/attention_flash.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/wgmma.cuh"

namespace moefold::cuda::detail {
using namespace ptx;
namespace {

constexpr int kThreads = 256, kBM = 128;

/// kVt: V staged row-major and transposed into Vt (K-major B of P V); otherwise V tiles are stored
/// swizzled like K and read as an MN-major B operand (the wgmma transpose bit), double-buffered.
template <int D, bool kVt>
struct WgCfg {
  static constexpr int BN = (D <= 128 && !kVt) ? 128 : 64;  // keys per tile
  static constexpr int CH = D / 8;
  static constexpr int VS = D + 8;  // staging row stride of V (elements)
  static constexpr uint32_t q_bytes = kBM * D * 2, k_bytes = BN * D * 2, vst_bytes = BN * VS * 2, vt_bytes = D * 128;
  // Q | K[2] | (Vt | V staging) or V[2]; each region 1024-byte aligned (the swizzle follows address bits).
  static constexpr uint32_t q_off = 0, k_off = q_bytes, v_off = k_off + 2 * k_bytes, vt_off = v_off,
                            vst_off = vt_off + vt_bytes;
  static constexpr size_t smem = (kVt ? size_t(vst_off + vst_bytes) : size_t(v_off + 2 * k_bytes)) + 1024;
};

/// Byte offset of the 16-byte chunk holding elements (r, c .. c + 7) of an R-row, K-major matrix
/// stored as column tiles of 64 elements in the 128-byte swizzle layout.
__device__ __forceinline__ uint32_t sw_off(int r, int c, int R) {
  return uint32_t((c >> 6) * R * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int D, bool kVt>
__device__ __forceinline__ void mma_pv(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (kVt) {
    if constexpr (D == 64) wg::mma_rs_n64(o, a, db);
    else if constexpr (D == 128) wg::mma_rs_n128(o, a, db);
    else if constexpr (D == 192) wg::mma_rs_n192(o, a, db);
    else wg::mma_rs_n256(o, a, db);
  } else {
    if constexpr (D == 64) wg::mma_rs_n64_mn(o, a, db);
    else if constexpr (D == 128) wg::mma_rs_n128_mn(o, a, db);
    else if constexpr (D == 192) wg::mma_rs_n192_mn(o, a, db);
    else wg::mma_rs_n256_mn(o, a, db);
  }
}

template <int D, bool kVt, bool kPipe>
__global__ void __launch_bounds__(kThreads, 1) attn_wgmma_kernel(const FlashArgs a) {
  static_assert(!(kVt && kPipe), "the pipelined loop reads V MN-major");
  pdl_begin();
  using C = WgCfg<D, kVt>;
  constexpr int BN = C::BN, CH = C::CH, VS = C::VS, NT = BN / 8, KT = D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* Qb = base + C::q_off;
  unsigned char* Kb = base + C::k_off;
  unsigned char* Vtb = base + C::vt_off;  // kVt: Vt; else V[2]
  bf16* Vst = reinterpret_cast<bf16*>(base + C::vst_off);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3, wg = warp >> 2;
  const int s = blockIdx.z;
  const int qtile = a.qtiles - 1 - int(blockIdx.y);
  const int kvh = int(blockIdx.x) / a.head_chunks, hchunk = int(blockIdx.x) % a.head_chunks;
  const int row0 = a.cu[s], n = a.cu[s + 1] - row0, ctx = a.ctx[s];
  if (ctx < 0) return;
  const int t0 = qtile * a.TB;
  if (t0 >= n) return;
  const int kv_end = ctx + min(t0 + a.TB, n);

  for (int idx = tid; idx < kBM * CH; idx += kThreads) {
    const int rb = idx / CH, c = idx % CH, tb = rb / a.HB, hg = hchunk * a.HB + rb % a.HB;
    unsigned char* d = Qb + sw_off(rb, c * 8, kBM);
    if (tb < a.TB && t0 + tb < n && hg < a.G)
      cp_async16(d, a.q + int64_t(row0 + t0 + tb) * a.q_ts + int64_t(kvh * a.G + hg) * a.q_hs + c * 8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
  const int32_t* bt = a.bt + int64_t(s) * a.max_blocks;
  // K tile (swizzled, buffer st) and V tile (row-major staging) of keys [kb, kb + BN).
  auto load_kv = [&](int st, int kb, bool do_k = true, bool do_v = true) {
#pragma unroll
    for (int i = 0; i < BN * CH / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int rr = idx / CH, c = idx % CH, key = kb + rr;
      unsigned char* dk = Kb + st * C::k_bytes + sw_off(rr, c * 8, BN);
      void* dv = kVt ? static_cast<void*>(Vst + rr * VS + c * 8)
                     : static_cast<void*>(Vtb + st * C::k_bytes + sw_off(rr, c * 8, BN));
      if (key < kv_end) {
        const int pi = a.bs_shift >= 0 ? key >> a.bs_shift : key / a.block_size;
        const int64_t slot = int64_t(bt[pi]) * a.block_size + (key - pi * a.block_size);
        const int64_t off = (slot * a.Hkv + kvh) * D + c * 8;
        if (do_k) cp_async16(dk, a.kc + off);
        if (do_v) cp_async16(dv, a.vc + off);
      } else {
        if (do_k) *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
        if (do_v) *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
      }
    }
  };
  load_kv(0, 0, true, !kPipe);  // pipelined: V(0) follows with K(1)
  cp_async_commit();

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
  const int full_end = ctx + t0 + 1;
  const uint32_t q_addr = smem_u32(Qb) + uint32_t(wg * 64 * 128), k_addr = smem_u32(Kb), vt_addr = smem_u32(Vtb);

  float o[D / 2];
#pragma unroll
  for (int j = 0; j < D / 2; ++j) o[j] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = a.scale_log2;

  const int ntiles = (kv_end + BN - 1) / BN;
  if constexpr (kPipe) {
    // Iteration jt: S(jt) = Q K(jt)^T and O += P(jt - 1) V(jt - 1) are issued back to back; the
    // softmax of S(jt) runs while the tensor cores do P V. Loads: K(jt + 1) and V(jt) at the top of
    // iteration jt (their buffers last held K(jt - 1) / V(jt - 2), both consumed before the barrier).
    uint32_t pprev[BN / 16][4];
    for (int jt = 0; jt <= ntiles; ++jt) {
      const int kb = jt * BN, st = jt & 1;
      cp_async_wait_all();
      wg::fence_proxy_async();
      __syncthreads();  // K(jt) and V(jt - 1) landed for every thread
      if (jt + 1 < ntiles) load_kv(st ^ 1, kb + BN, true, false);
      if (jt < ntiles) load_kv(st, kb, false, true);
      cp_async_commit();
      float sc[NT * 4];
      if (jt < ntiles) {
#pragma unroll
        for (int j = 0; j < NT * 4; ++j) sc[j] = 0.0f;
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
          const uint32_t koff = uint32_t((kk >> 2) * BN * 128 + (kk & 3) * 32);
          const uint64_t da = wg::desc_sw128(q_addr + uint32_t((kk >> 2) * kBM * 128 + (kk & 3) * 32));
          const uint64_t db = wg::desc_sw128(k_addr + uint32_t(st) * C::k_bytes + koff);
          if constexpr (BN == 64) wg::mma_ss_n64(sc, da, db, kk > 0 ? 1 : 0);
          else wg::mma_ss_n128(sc, da, db, kk > 0 ? 1 : 0);
        }
        wg::commit();
      }
      if (jt > 0) {
        wg::fence();
#pragma unroll
        for (int k2 = 0; k2 < BN / 16; ++k2)
          mma_pv<D, false>(o, pprev[k2],
                           wg::desc_sw128_mn(vt_addr + uint32_t(st ^ 1) * C::k_bytes + uint32_t(k2 * 2048), BN * 128, 1024));
        wg::commit();
      }
      if (jt == ntiles) {
        wg::wait<0>();
        wg::fence_regs(o);
        break;
      }
      if (jt > 0) wg::wait<1>();
      else wg::wait<0>();
      wg::fence_regs(sc);
      if (kb + BN > full_end) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kb + 8 * j + 2 * tig + (e & 1) > lim[e >> 1]) sc[4 * j + e] = -INFINITY;
      }
      float mx[2] = {m[0], m[1]}, msc[2], alpha[2];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(sc[4 * j], sc[4 * j + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        msc[i] = mx[i] == -INFINITY ? 0.0f : mx[i] * sl2;
        alpha[i] = mx[i] == m[i] ? 1.0f : fast_exp2(m[i] * sl2 - msc[i]);  // exactly 1: see below
        m[i] = mx[i];
        l[i] *= alpha[i];
      }
      uint32_t pcur[BN / 16][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float p0 = fast_exp2(fmaf(sc[4 * j], sl2, -msc[0])), p1 = fast_exp2(fmaf(sc[4 * j + 1], sl2, -msc[0]));
        const float p2 = fast_exp2(fmaf(sc[4 * j + 2], sl2, -msc[1])), p3 = fast_exp2(fmaf(sc[4 * j + 3], sl2, -msc[1]));
        l[0] += p0 + p1;
        l[1] += p2 + p3;
        pcur[j / 2][(j & 1) * 2 + 0] = pack2(p0, p1);
        pcur[j / 2][(j & 1) * 2 + 1] = pack2(p2, p3);
      }
      if (jt > 0) {
        wg::wait<0>();  // P(jt - 1) V(jt - 1) done: O and pprev free
        wg::fence_regs(o);
      }
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[4 * j] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
#pragma unroll
      for (int k2 = 0; k2 < BN / 16; ++k2)
#pragma unroll
        for (int r = 0; r < 4; ++r) pprev[k2][r] = pcur[k2][r];
    }
  } else
  for (int jt = 0; jt < ntiles; ++jt) {
    const int kb = jt * BN, st = jt & 1;
    cp_async_wait_all();
    wg::fence_proxy_async();
    __syncthreads();  // K(jt), V(jt) staged (and Q); every warpgroup is done with Vt and K(jt - 1)
    // V(jt) staging -> Vt: row d holds keys 0..63 of dim d (pairs of dims per thread).
    if constexpr (kVt) {
#pragma unroll
    for (int i = 0; i < (D / 2) * 8 / kThreads; ++i) {
      const int q = tid + i * kThreads, d2 = q % (D / 2), kc = q / (D / 2);
      uint32_t w[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) w[k] = *reinterpret_cast<const uint32_t*>(Vst + (kc * 8 + k) * VS + 2 * d2);
      uint4 lo, hi;
      lo.x = __byte_perm(w[0], w[1], 0x5410), lo.y = __byte_perm(w[2], w[3], 0x5410);
      lo.z = __byte_perm(w[4], w[5], 0x5410), lo.w = __byte_perm(w[6], w[7], 0x5410);
      hi.x = __byte_perm(w[0], w[1], 0x7632), hi.y = __byte_perm(w[2], w[3], 0x7632);
      hi.z = __byte_perm(w[4], w[5], 0x7632), hi.w = __byte_perm(w[6], w[7], 0x7632);
      *reinterpret_cast<uint4*>(Vtb + sw_off(2 * d2, kc * 8, D)) = lo;
      *reinterpret_cast<uint4*>(Vtb + sw_off(2 * d2 + 1, kc * 8, D)) = hi;
    }
    wg::fence_proxy_async();
    __syncthreads();  // Vt complete; V staging free
    }
    if (jt + 1 < ntiles) load_kv(st ^ 1, kb + BN);
    cp_async_commit();

    float sc[NT * 4];
#pragma unroll
    for (int j = 0; j < NT * 4; ++j) sc[j] = 0.0f;
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      const uint32_t koff = uint32_t((kk >> 2) * BN * 128 + (kk & 3) * 32);  // BN rows x 128 B per column tile
      const uint64_t da = wg::desc_sw128(q_addr + uint32_t((kk >> 2) * kBM * 128 + (kk & 3) * 32));
      const uint64_t db = wg::desc_sw128(k_addr + uint32_t(st) * C::k_bytes + koff);
      if constexpr (BN == 64) wg::mma_ss_n64(sc, da, db, kk > 0 ? 1 : 0);
      else wg::mma_ss_n128(sc, da, db, kk > 0 ? 1 : 0);
    }
    wg::commit();
    wg::wait<0>();
    wg::fence_regs(sc);

    if (kb + BN > full_end) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kb + 8 * j + 2 * tig + (e & 1) > lim[e >> 1]) sc[4 * j + e] = -INFINITY;
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(sc[4 * j], sc[4 * j + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
    }
    float msc[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      msc[i] = mx[i] == -INFINITY ? 0.0f : mx[i] * sl2;
      // An unchanged max rescales by exactly 1, so that a key tile wholly past this row's last key
      // (the block reads keys up to its LAST row's) leaves m, l and O as they were: the row's bits do
      // not depend on where its query tile starts and ends. (exp2(m * sl2 - msc) is not 1 there: the
      // compiler contracts it into fma(m, sl2, -msc), m * sl2's rounding error.)
      const float alpha = mx[i] == m[i] ? 1.0f : fast_exp2(m[i] * sl2 - msc[i]);
      m[i] = mx[i];
      l[i] *= alpha;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[4 * j + 2 * i] *= alpha;
        o[4 * j + 2 * i + 1] *= alpha;
      }
    }
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float p0 = fast_exp2(fmaf(sc[4 * j], sl2, -msc[0])), p1 = fast_exp2(fmaf(sc[4 * j + 1], sl2, -msc[0]));
      const float p2 = fast_exp2(fmaf(sc[4 * j + 2], sl2, -msc[1])), p3 = fast_exp2(fmaf(sc[4 * j + 3], sl2, -msc[1]));
      l[0] += p0 + p1;
      l[1] += p2 + p3;
      pa[j / 2][(j & 1) * 2 + 0] = pack2(p0, p1);
      pa[j / 2][(j & 1) * 2 + 1] = pack2(p2, p3);
    }
    wg::fence();
#pragma unroll
    for (int k2 = 0; k2 < BN / 16; ++k2) {
      // kVt: Vt rows (dims) of 64 keys, K advanced by 16 keys = 32 bytes inside the swizzled row; else
      // V rows (keys) of 64-dim column tiles BN * 128 bytes apart, K advanced by 16 keys = 2 groups.
      const uint64_t db = kVt ? wg::desc_sw128(vt_addr + uint32_t(k2 * 32))
                              : wg::desc_sw128_mn(vt_addr + uint32_t(st) * C::k_bytes + uint32_t(k2 * 2048),
                                                  BN * 128, 1024);
      mma_pv<D, kVt>(o, pa[k2], db);
    }
    wg::commit();
    wg::wait<0>();
    wg::fence_regs(o);
  }
  cp_async_wait_all();

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
    bf16* orow = a.out + (grow * a.Hq + head[i]) * D;
    const bf16* grow_gate = a.gate ? a.gate + grow * a.g_ts + int64_t(head[i]) * a.g_hs : nullptr;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int d = 8 * j + 2 * tig;
      float v0 = o[4 * j + 2 * i] * inv, v1 = o[4 * j + 2 * i + 1] * inv;
      if (grow_gate) {
        const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(grow_gate + d));
        v0 *= sigmoidf_(gf.x);
        v1 *= sigmoidf_(gf.y);
      }
      *reinterpret_cast<__nv_bfloat162*>(orow + d) = __floats2bfloat162_rn(v0, v1);
    }
  }
}

template <int D, bool kVt, bool kPipe>
void launch_vt(const FlashArgs& a, dim3 grid, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(attn_wgmma_kernel<D, kVt, kPipe>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(WgCfg<D, kVt>::smem)));
  });
  launch_pdl(attn_wgmma_kernel<D, kVt, kPipe>, grid, dim3(kThreads), WgCfg<D, kVt>::smem, stream, a);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

template <int D>
void launch(const FlashArgs& a, dim3 grid, int variant, cudaStream_t stream) {
  if (variant == 1) launch_vt<D, true, false>(a, grid, stream);
  else if (variant == 2) launch_vt<D, false, true>(a, grid, stream);
  else launch_vt<D, false, false>(a, grid, stream);
}

}  // namespace

bool wgmma_supports_head_dim(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 192 || head_dim == 256;
}

void launch_attention_wgmma(FlashArgs a, int num_seqs, int max_q_len, int variant, cudaStream_t stream) {
  MOEFOLD_CHECK(wgmma_supports_head_dim(a.dh), "attention (wgmma): head_dim {} not supported (64, 128, 192, 256)", a.dh);
  a.HB = std::min(a.G, kBM);
  a.TB = kBM / a.HB;
  a.head_chunks = (a.G + a.HB - 1) / a.HB;
  a.bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __builtin_ctz(unsigned(a.block_size)) : -1;
  a.qtiles = (max_q_len + a.TB - 1) / a.TB;
  MOEFOLD_CHECK(a.qtiles <= 65535, "attention_prefill: {} query rows per sequence exceed the grid ({} tiles)",
                max_q_len, a.qtiles);
  const dim3 grid(unsigned(a.Hkv * a.head_chunks), unsigned(a.qtiles), unsigned(num_seqs));
  switch (a.dh) {
    case 64: launch<64>(a, grid, variant, stream); break;
    case 128: launch<128>(a, grid, variant, stream); break;
    case 192: launch<192>(a, grid, variant, stream); break;
    default: launch<256>(a, grid, variant, stream); break;
  }
}

}  // namespace moefold::cuda::detail
