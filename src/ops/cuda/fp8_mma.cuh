// Tensor-core core of the block-scaled FP8 decode kernels (fp8_gemv.cu, moe_fp8.cu; private to
// src/ops/cuda). W8A16: e4m3 weights decoded exactly to bf16 in registers, bf16 activations, mma.sync
// m16n8k16 with fp32 accumulation; no shared memory on the weight path (each lane loads its own bytes
// straight from HBM with 16-byte non-L1 loads).
//
// Roles: the weight is the A operand (16 weight rows = 16 output features per fragment), the tokens are
// the B operand (8 tokens per n8 fragment), so one mma covers 256 weights and batch 1 wastes nothing on
// the weight side. Lane (g = lane / 4, t = lane % 4) owns weight rows g and g + 8 of each fragment and
// token g of each token fragment.
//
// K permutation: within a 128-column scale block, mma step s (0..7) of lane t uses the physical columns
// 32 t + 4 s .. 32 t + 4 s + 3 (A's k-slots 2t, 2t+1 -> +0, +1; 2t+8, 2t+9 -> +2, +3; B's the same), so
// a lane reads 32 contiguous weight bytes per row and 64 contiguous activation bytes per token per block
// and four lanes cover a row's 128-byte line. The same permutation on both operands leaves the dot
// product unchanged; it depends on K only.
//
// Reduction order (fixed by K and the warp's K stride WK, never by the token count or the tokens in the
// fragment): per scale block, 8 chained mma steps into a fresh fp32 partial, then acc = fma(partial,
// block scale, acc), blocks kb = kb0, kb0 + WK, ... in ascending order; the WK warps' accumulators are
// added in warp order 0, 1, .., WK-1 by the kernels (block_reduce). Each mma output depends on its own
// row and token only, so a token's result is bitwise the same alone or in any batch.
//
// Exact decoding (e4m3x2_bf16x2): Hopper's e4m3 -> f16 conversion, then f16 -> bf16 through fp32; every
// finite e4m3 value is exact in both (at most 4 significant bits, exponents in range).
// Needs K % 16 == 0 and 16-byte aligned weight rows and token rows.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/ptx.cuh"

namespace moefold::cuda::fp8mma {

constexpr int kBlockK = 128;  // scale block = one pipeline unit of K

/// bf16x2 of two e4m3 bytes of w, exactly: sel 0x1404 takes bytes 0 (low half) and 1, 0x3424 bytes 2, 3.
/// Hopper's conversion (cvt.rn.f16x2.e4m3x2, one instruction for the pair: f16 holds every e4m3 value),
/// then f16 -> fp32 -> bf16 (exact: 4 significant bits): four instructions per pair.
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t w, uint32_t sel) {
  uint32_t h;
  if (sel == 0x1404u)
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(h) : "r"(w));
  else
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(h) : "r"(w));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 v = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// One scale block of MF weight fragments as loaded by a lane: rows g, g + 8 of each, 32 bytes each,
/// their block scales, and the lane's 64 bytes of token fragment 0 (prefetched with the weights, so no
/// activation load is waited for on the critical path).
template <int MF>
struct WBlock {
  uint4 v[MF][2][2];
  float s[MF][2];
  uint4 x0[4];
};

/// The lane's 64 activation bytes of block kb for token pointer p (null: a token past the live count,
/// zeros); columns >= K as zeros.
__device__ __forceinline__ void load_tok(uint4 (&x)[4], const __nv_bfloat16* p, int kb, int K) {
  const int k0 = kb * kBlockK + (threadIdx.x & 3) * 32;
#pragma unroll
  for (int c = 0; c < 4; ++c)
    x[c] = p != nullptr && k0 + 8 * c < K ? __ldg(reinterpret_cast<const uint4*>(p + k0 + 8 * c)) : make_uint4(0, 0, 0, 0);
}

/// Loads block kb of the lane's rows (row[mf][h]: the row's first byte, null = a row past the end:
/// zeros; sc[mf][h]: its scale row) when kb < KB; columns >= K load as zeros.
template <int MF>
__device__ __forceinline__ void load_block(WBlock<MF>& b, const uint8_t* const (&row)[MF][2],
                                           const float* const (&sc)[MF][2], const __nv_bfloat16* tok0, int kb,
                                           int KB, int K) {
  const int k0 = kb * kBlockK + (threadIdx.x & 3) * 32;
#pragma unroll
  for (int mf = 0; mf < MF; ++mf)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool ok = kb < KB && row[mf][h] != nullptr;
#pragma unroll
      for (int c = 0; c < 2; ++c)
        b.v[mf][h][c] = ok && k0 + 16 * c < K ? ptx::ld_stream16(row[mf][h] + k0 + 16 * c) : make_uint4(0, 0, 0, 0);
      b.s[mf][h] = ok ? __ldg(sc[mf][h] + kb) : 0.0f;
    }
  load_tok(b.x0, kb < KB ? tok0 : nullptr, kb, K);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/// One scale block of the single-token-fragment chain: p[mf] = the 8 chained mma steps from zero over the
/// block, weights v[mf][h][c] (the lane's 32 bytes of rows g, g + 8 of fragment mf) decoded right before
/// each mma, tokens xa (the lane's 64 bytes of token g), in the K permutation of the header. Shared by
/// warp_mma_fp8 and the one-token stream kernels (moe_fp8_stream.cu), so their chains are one code.
template <int MF>
__device__ __forceinline__ void block_partials(const uint4 (&v)[MF][2][2], const uint4 (&xa)[4], float (&p)[MF][4]) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf)
#pragma unroll
    for (int q = 0; q < 4; ++q) p[mf][q] = 0.0f;
#pragma unroll
  for (int st = 0; st < 8; ++st) {
    const uint32_t bb0 = word(xa[st >> 1], (st & 1) * 2), bb1 = word(xa[st >> 1], (st & 1) * 2 + 1);
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
      const uint32_t w0 = word(v[mf][0][st >> 2], st & 3), w1 = word(v[mf][1][st >> 2], st & 3);
      const uint32_t a[4] = {e4m3x2_bf16x2(w0, 0x1404u), e4m3x2_bf16x2(w1, 0x1404u), e4m3x2_bf16x2(w0, 0x3424u),
                             e4m3x2_bf16x2(w1, 0x3424u)};
      ptx::mma_bf16_16816(p[mf], a, bb0, bb1);
    }
  }
}

/// acc[mf][nt][0..3] (the mma C fragment: rows g, g + 8 of fragment mf; tokens 2t, 2t+1 of token
/// fragment nt) += the weight rows . the tokens over blocks kb0, kb0 + WK, .. < KB (see the header).
/// row/sc: the lane's weight rows (load_block); tok(nt): the lane's token g of fragment nt (null: none);
/// nt_live: token fragments in use (warp-uniform, <= NT). Called by all 32 lanes (convergent).
template <int MF, int NT, class Tok>
__device__ __forceinline__ void warp_mma_fp8(const uint8_t* const (&row)[MF][2], const float* const (&sc)[MF][2],
                                             const Tok& tok, int nt_live, int K, int kb0, int WK,
                                             float (&acc)[MF][NT][4]) {
  const int KB = (K + kBlockK - 1) / kBlockK;
#pragma unroll
  for (int mf = 0; mf < MF; ++mf)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mf][nt][q] = 0.0f;
  WBlock<MF> b0, b1;  // two blocks in flight per lane
  const __nv_bfloat16* t0 = tok(0);
  load_block<MF>(b0, row, sc, t0, kb0, KB, K);
  load_block<MF>(b1, row, sc, t0, kb0 + WK, KB, K);
  // One token fragment (decode batches of <= 8 rows, every expert tile): each step's A is decoded right
  // before its mma (fewer registers); the mma chain is the same as below, so the bits are too.
  auto step1 = [&](WBlock<MF>& b, int kb) {
    uint4 v[MF][2][2], xa[4];
    float s[MF][2];
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        v[mf][h][0] = b.v[mf][h][0];
        v[mf][h][1] = b.v[mf][h][1];
        s[mf][h] = b.s[mf][h];
      }
#pragma unroll
    for (int c = 0; c < 4; ++c) xa[c] = b.x0[c];
    load_block<MF>(b, row, sc, t0, kb + 2 * WK, KB, K);  // refill while the mma work runs
    float p[MF][4];
    block_partials<MF>(v, xa, p);
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
      acc[mf][0][0] = fmaf(p[mf][0], s[mf][0], acc[mf][0][0]);
      acc[mf][0][1] = fmaf(p[mf][1], s[mf][0], acc[mf][0][1]);
      acc[mf][0][2] = fmaf(p[mf][2], s[mf][1], acc[mf][0][2]);
      acc[mf][0][3] = fmaf(p[mf][3], s[mf][1], acc[mf][0][3]);
    }
  };
  auto step = [&](WBlock<MF>& b, int kb) {
    uint32_t a[MF][8][4];
    float s[MF][2];
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
      for (int st = 0; st < 8; ++st) {
        const uint32_t w0 = word(b.v[mf][0][st >> 2], st & 3), w1 = word(b.v[mf][1][st >> 2], st & 3);
        a[mf][st][0] = e4m3x2_bf16x2(w0, 0x1404u);
        a[mf][st][1] = e4m3x2_bf16x2(w1, 0x1404u);
        a[mf][st][2] = e4m3x2_bf16x2(w0, 0x3424u);
        a[mf][st][3] = e4m3x2_bf16x2(w1, 0x3424u);
      }
      s[mf][0] = b.s[mf][0];
      s[mf][1] = b.s[mf][1];
    }
    uint4 xa[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) xa[c] = b.x0[c];
    load_block<MF>(b, row, sc, t0, kb + 2 * WK, KB, K);  // refill while the mma work runs
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt < nt_live) {  // warp-uniform
        uint4 xb[4];
        if (nt + 1 < NT && nt + 1 < nt_live) load_tok(xb, tok(nt + 1), kb, K);
        float p[MF][4];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
          for (int q = 0; q < 4; ++q) p[mf][q] = 0.0f;
#pragma unroll
        for (int st = 0; st < 8; ++st) {
          const uint32_t bb0 = word(xa[st >> 1], (st & 1) * 2), bb1 = word(xa[st >> 1], (st & 1) * 2 + 1);
#pragma unroll
          for (int mf = 0; mf < MF; ++mf) ptx::mma_bf16_16816(p[mf], a[mf][st], bb0, bb1);
        }
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) {
          acc[mf][nt][0] = fmaf(p[mf][0], s[mf][0], acc[mf][nt][0]);
          acc[mf][nt][1] = fmaf(p[mf][1], s[mf][0], acc[mf][nt][1]);
          acc[mf][nt][2] = fmaf(p[mf][2], s[mf][1], acc[mf][nt][2]);
          acc[mf][nt][3] = fmaf(p[mf][3], s[mf][1], acc[mf][nt][3]);
        }
        if (nt + 1 < NT && nt + 1 < nt_live)
#pragma unroll
          for (int c = 0; c < 4; ++c) xa[c] = xb[c];
      }
    }
  };
  auto run = [&](const auto& f) {
    for (int kb = kb0; kb < KB;) {
      f(b0, kb);
      kb += WK;
      if (kb >= KB) break;
      f(b1, kb);
      kb += WK;
    }
  };
  if constexpr (NT == 1) {
    run(step1);
  } else {
    if (nt_live <= 1) run(step1);  // warp-uniform
    else run(step);
  }
}

/// Adds the accumulators of the WK warps sharing wn (warp = wn * WK + wk) in warp order 0..WK-1: on
/// return the wk == 0 warps hold the sums. red: >= (WK - 1) * WN * 32 * MF * NT * 4 floats of shared
/// memory. Called by every thread of the block (contains __syncthreads).
template <int MF, int NT>
__device__ __forceinline__ void block_reduce(float (&acc)[MF][NT][4], float* red, int WK, int WN) {
  constexpr int F = MF * NT * 4;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wk = warp % WK, wn = warp / WK;
  if (WK > 1) {
    __syncthreads();  // red free (a previous use is done)
    if (wk > 0) {
      float* d = red + size_t((wn * (WK - 1) + wk - 1) * F) * 32;
#pragma unroll
      for (int mf = 0; mf < MF; ++mf)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) d[((mf * NT + nt) * 4 + q) * 32 + lane] = acc[mf][nt][q];
    }
    __syncthreads();
    if (wk == 0)
      for (int j = 1; j < WK; ++j) {
        const float* d = red + size_t((wn * (WK - 1) + j - 1) * F) * 32;
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[mf][nt][q] += d[((mf * NT + nt) * 4 + q) * 32 + lane];
      }
  }
}

/// Warps along K for a K-column weight (depends on K and the kernel's block only: part of every
/// output's reduction order): the largest power of two <= max_wk with at least two scale blocks per
/// warp (1 for K <= 256).
inline int warps_along_k(int64_t K, int max_wk = 8) {
  const int64_t KB = (K + kBlockK - 1) / kBlockK;
  int wk = 1;
  while (wk < max_wk && KB >= 4 * wk) wk *= 2;
  return wk;
}

}  // namespace moefold::cuda::fp8mma
