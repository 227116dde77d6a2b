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

// ---- f16 products (one token fragment: decode batches of <= 8 rows) -------------------------------
// The same chain on f16 operands, for fewer instructions: a weight pair decodes in one instruction
// (cvt.rn.f16x2.e4m3x2) instead of four, and the activations are converted once per CTA (stage_tokens_f16)
// instead of being read as bf16 by every warp for every block. Each (token, scale block) of the activations
// is staged in shared memory as f16 times 2^e, e chosen from the block's max |x| so that the scaled max
// lies in [2^14, 2^15). Where every scaled value of the block is exact in f16 (checked while staging), each
// product is 2^e times the bf16 chain's product exactly, the block's partial is 2^e times the bf16 chain's
// partial (the mma's sums of exact products scale with them; the block's max >= 2^-60 keeps them far from
// fp32's subnormals), and partial * 2^-e before the fma with the block scale gives the bf16 chain's bits
// (checked bit for bit by fp8_kernels_test). A block whose f16 copy is not exact for some token (a value
// below f16's grid relative to the block's max, a max below 2^-60, a NaN or an infinity) runs the bf16 chain
// itself, decided per block for the whole warp. So a token's bits are the bf16 chain's for every input, and
// do not depend on the batch or on which kernel ran.

/// f16x2 of two e4m3 bytes of w (sel as e4m3x2_bf16x2), exactly: one instruction.
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t w, uint32_t sel) {
  uint32_t h;
  if (sel == 0x1404u)
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(h) : "r"(w));
  else
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(h) : "r"(w));
  return h;
}

/// block_partials on f16 operands: xa = the lane's 64 bytes of token g's block as staged (f16 x 2^e);
/// p = 2^e x block_partials' p (see above).
template <int MF>
__device__ __forceinline__ void block_partials_f16(const uint4 (&v)[MF][2][2], const uint4 (&xa)[4],
                                                   float (&p)[MF][4]) {
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
      const uint32_t a[4] = {e4m3x2_f16x2(w0, 0x1404u), e4m3x2_f16x2(w1, 0x1404u), e4m3x2_f16x2(w0, 0x3424u),
                             e4m3x2_f16x2(w1, 0x3424u)};
      ptx::mma_f16_16816(p[mf], a, bb0, bb1);
    }
  }
}

/// Token slots of the f16 stage (one n8 token fragment).
constexpr int kF16Slots = 8;

/// The staged tokens in shared memory: x[((kb * 4 + c) * slots + p) * 4 + t] holds columns
/// kb * 128 + 32 t + 8 c .. + 7 of token p as f16 x 2^e (so a warp's 16-byte reads of one (kb, c) are
/// consecutive); mul[kb * kF16Slots + p] = 2^-e, 0 where the block's copy is not exact, 1 for p >= live.
struct F16Stage {
  uint4* x;
  float* mul;
  int slots;
};

/// Shared-memory bytes of an F16Stage for K columns and `slots` (1..8) token slots.
__host__ __device__ constexpr size_t f16_stage_bytes(int64_t K, int slots) {
  const int64_t KB = (K + kBlockK - 1) / kBlockK;
  return size_t(KB * 4 * slots * 4 * 16 + KB * kF16Slots * 4);
}

/// The F16Stage laid out at `smem` (16-byte aligned, f16_stage_bytes(K, slots) bytes).
__device__ __forceinline__ F16Stage f16_stage_at(void* smem, int K, int slots) {
  const int KB = (K + kBlockK - 1) / kBlockK;
  uint4* x = static_cast<uint4*>(smem);
  return F16Stage{x, reinterpret_cast<float*>(x + size_t(KB) * 4 * slots * 4), slots};
}

/// Stages tokens 0 .. live-1 (live <= st.slots) of x ([live, K] bf16, row stride x_stride, 16-byte
/// aligned rows, K % 16 == 0) into st. Called by every thread of the block (ends with __syncthreads).
__device__ __forceinline__ void stage_tokens_f16(const F16Stage& st, const __nv_bfloat16* x, int64_t x_stride,
                                                 int live, int K) {
  const int KB = (K + kBlockK - 1) / kBlockK, per_tok = KB * 16, total = live * per_tok;
  const int tid = int(threadIdx.x), nth = int(blockDim.x);
  for (int i = tid; i < KB * kF16Slots; i += nth)
    if (i % kF16Slots >= live) st.mul[i] = 1.0f;
  // Thread i of a round takes 8 columns (one 16-byte chunk): the 16 chunks of a (token, block) are 16
  // consecutive lanes, which reduce its max and its exactness by shuffles.
  for (int base = 0; base < total; base += 4 * nth) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = base + u * nth + tid, p = i / per_tok, col = (i - p * per_tok) * 8;
      v[u] = i < total && col < K ? __ldg(reinterpret_cast<const uint4*>(x + int64_t(p) * x_stride + col))
                                  : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (base + u * nth >= total) break;  // block-uniform
      const int i = base + u * nth + tid;
      float f[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t w = word(v[u], k);
        f[2 * k] = __uint_as_float(w << 16);
        f[2 * k + 1] = __uint_as_float(w & 0xffff0000u);
      }
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(f[k]));  // a NaN is caught by the exactness test
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      // amax in [2^(b-127), 2^(b-126)) for biased exponent b: scale 2^(141-b) puts it in [2^14, 2^15).
      const int b = int(__float_as_uint(amax) >> 23);
      bool ok = b <= 254 && (amax == 0.0f || b >= 67);  // finite, and 0 or >= 2^-60
      const float sc = ok && amax > 0.0f ? __uint_as_float(uint32_t(268 - b) << 23) : 1.0f;
      const float inv = ok && amax > 0.0f ? __uint_as_float(uint32_t(b - 14) << 23) : 1.0f;
      uint32_t h[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float lo = f[2 * k] * sc, hi = f[2 * k + 1] * sc;
        const __half2 hh = __floats2half2_rn(lo, hi);
        ok = ok && __low2float(hh) == lo && __high2float(hh) == hi;
        h[k] = *reinterpret_cast<const uint32_t*>(&hh);
      }
      int all = ok ? 1 : 0;
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) all &= __shfl_xor_sync(0xffffffffu, all, o);
      if (i < total) {
        const int p = i / per_tok, j = i - p * per_tok, kb = j >> 4, q = j & 15;
        st.x[((kb * 4 + (q & 3)) * st.slots + p) * 4 + (q >> 2)] = make_uint4(h[0], h[1], h[2], h[3]);
        if (q == 0) st.mul[kb * kF16Slots + p] = all ? inv : 0.0f;
      }
    }
  }
  __syncthreads();
}

/// warp_mma_fp8 with one token fragment on f16 products, the same bits (see above): acc[mf][0][..] +=
/// the weight rows . tokens of st over blocks kb0, kb0 + WK, .. . tok_g: the lane's token g in global
/// memory (null: g >= live), read only by blocks that run the bf16 chain. `prologue` runs once the first
/// two blocks' weight loads are issued (a kernel stages its tokens there; it may contain __syncthreads,
/// every thread of the block then calls this). Called by all 32 lanes (convergent).
template <int MF, class Prologue>
__device__ __forceinline__ void warp_mma_fp8_f16(const uint8_t* const (&row)[MF][2], const float* const (&sc)[MF][2],
                                                 const F16Stage& st, const __nv_bfloat16* tok_g, int K, int kb0,
                                                 int WK, float (&acc)[MF][1][4], Prologue&& prologue) {
  const int KB = (K + kBlockK - 1) / kBlockK, lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mf = 0; mf < MF; ++mf)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[mf][0][q] = 0.0f;
  WBlock<MF> b0, b1;
  load_block<MF>(b0, row, sc, nullptr, kb0, KB, K);
  load_block<MF>(b1, row, sc, nullptr, kb0 + WK, KB, K);
  prologue();
  auto step = [&](WBlock<MF>& b, int kb) {
    uint4 v[MF][2][2];
    float s[MF][2];
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        v[mf][h][0] = b.v[mf][h][0];
        v[mf][h][1] = b.v[mf][h][1];
        s[mf][h] = b.s[mf][h];
      }
    load_block<MF>(b, row, sc, nullptr, kb + 2 * WK, KB, K);  // refill while the mma work runs
    const float m0 = st.mul[kb * kF16Slots + 2 * t], m1 = st.mul[kb * kF16Slots + 2 * t + 1];
    float p[MF][4];
    uint4 xa[4];
    if (__any_sync(0xffffffffu, m0 == 0.0f || m1 == 0.0f)) {  // warp-uniform: the bf16 chain
      load_tok(xa, tok_g, kb, K);
      block_partials<MF>(v, xa, p);
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
        acc[mf][0][0] = fmaf(p[mf][0], s[mf][0], acc[mf][0][0]);
        acc[mf][0][1] = fmaf(p[mf][1], s[mf][0], acc[mf][0][1]);
        acc[mf][0][2] = fmaf(p[mf][2], s[mf][1], acc[mf][0][2]);
        acc[mf][0][3] = fmaf(p[mf][3], s[mf][1], acc[mf][0][3]);
      }
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        xa[c] = tok_g != nullptr ? st.x[((kb * 4 + c) * st.slots + g) * 4 + t] : make_uint4(0, 0, 0, 0);
      block_partials_f16<MF>(v, xa, p);
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
        acc[mf][0][0] = fmaf(p[mf][0] * m0, s[mf][0], acc[mf][0][0]);
        acc[mf][0][1] = fmaf(p[mf][1] * m1, s[mf][0], acc[mf][0][1]);
        acc[mf][0][2] = fmaf(p[mf][2] * m0, s[mf][1], acc[mf][0][2]);
        acc[mf][0][3] = fmaf(p[mf][3] * m1, s[mf][1], acc[mf][0][3]);
      }
    }
  };
  for (int kb = kb0; kb < KB;) {
    step(b0, kb);
    kb += WK;
    if (kb >= KB) break;
    step(b1, kb);
    kb += WK;
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
