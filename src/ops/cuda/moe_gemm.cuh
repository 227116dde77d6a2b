// Internal to the MoE chain (included by moe_experts.cu and moe_router.cu only): the grouped tensor-core
// GEMM kernel template, C[rows, N] = A[rows, K] . B[e][N, K]^T with bf16 operands and fp32 accumulation,
// whose rows are the expert plan's row tiles (rows of one expert; A rows gathered through the pair list
// for gate_up), plus the mma / ldmatrix / cp.async helpers the router kernel shares.
//
// Why a kernel of our own rather than CUTLASS: the PyPI package nvidia-cutlass (4.2) ships the headers,
// but (1) this GEMM needs three things at once that CUTLASS's sm90 grouped GEMM does not give without
// custom collectives: device-resident problem sizes derived from a live row count, an A operand gathered
// row by row through the pair list, and a SwiGLU epilogue pairing gate row j with up row I + j; (2) the
// sm90 grouped-GEMM instantiations take many minutes and GBs per TU to compile on the 2-core build
// machine and add a pinned dependency to setup/CI; (3) at decode sizes (1-64 tokens) the work is weight
// streaming, where mma.sync with a cp.async pipeline already runs near HBM bandwidth. The cost: at
// prefill sizes mma.sync (m16n8k16) tops out below wgmma: moe_gemm_wgmma.h is the warpgroup version of
// the 128-row tiles (the default; MOEFOLD_MOE_GEMM=mma keeps these), bitwise the same outputs.
//
// Structure: BK = 64 columns (128 bytes) per stage, STAGES-deep cp.async pipeline, 16-byte chunks
// swizzled by (row & 7) so ldmatrix reads are bank-conflict free; warps tile the CTA as WARPS_M x
// WARPS_N; each warp holds MF x NF m16n8 fp32 accumulators. For SwiGLU the B tile's first BN/2 rows are
// gate rows n0.., the last BN/2 the matching up rows I + n0..; each warp holds the gate and up fragments
// of the same output columns, so silu(g) * u is done in registers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/ptx.cuh"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda::moe_detail {

enum class GemmMode : int {
  kExpertGateUp = 0,  // rows: plan tiles; A = x[pair / k]; out act[pos] = swiglu (bf16)
  kExpertDown = 1,    // rows: plan tiles; A = act[pos];      out y[pair] (bf16)
};

struct GemmParams {
  const __nv_bfloat16* A = nullptr;
  const __nv_bfloat16* B = nullptr;
  void* C = nullptr;
  const int32_t* pairs = nullptr;
  const int2* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  const int32_t* offsets = nullptr;
  int K = 0;         // reduction length (multiple of 64)
  int N = 0;         // output columns (act: I; y: H)
  int ldc = 0;
  int topk = 1;
  int64_t b_expert_stride = 0;  // elements between consecutive experts' B
  int b_up_offset = 0;          // SwiGLU: row offset of the up half (= I)
  int l2_hint = 0;              // B copies evict_first when >= 1 (l2_hint.h; moe_experts.cu says where)
};

using namespace ptx;

__device__ __forceinline__ float silu_f32(float g) { return g / (1.0f + __expf(-g)); }

/// Offset (in elements) of 16-byte chunk `ch` of row `r` in a [rows, 64] bf16 tile, swizzled.
__device__ __forceinline__ int swz(int r, int ch) { return r * 64 + ((ch ^ (r & 7)) << 3); }

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int MIN_BLOCKS = 1>
struct GemmCfg {
  static constexpr int kBM = BM, kBN = BN, kWarpsM = WARPS_M, kWarpsN = WARPS_N, kStages = STAGES;
  static constexpr int kMinBlocks = MIN_BLOCKS;  // CTAs per SM the register budget must allow
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kBK = 64;
  static constexpr size_t kSmemBytes = size_t(STAGES) * (BM + BN) * kBK * sizeof(__nv_bfloat16);
};

template <class Cfg, GemmMode MODE>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) moe_gemm_kernel(const GemmParams p) {
  pdl_begin();
  constexpr int BM = Cfg::kBM, BN = Cfg::kBN, BK = Cfg::kBK, STAGES = Cfg::kStages;
  constexpr int THREADS = Cfg::kThreads;
  constexpr int WM = BM / Cfg::kWarpsM, WN = BN / Cfg::kWarpsN;
  constexpr int MF = WM / 16, NF = WN / 8;
  constexpr bool kSwiglu = MODE == GemmMode::kExpertGateUp;
  static_assert(WM % 16 == 0 && WN % 16 == 0 && NF % 2 == 0, "warp tile");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sB = sA + STAGES * BM * BK;
  __shared__ int s_arow[BM];  // A row of tile row r (-1: beyond the tile's rows)
  __shared__ int s_orow[BM];  // output row of tile row r

  // ---- which rows this CTA owns -----------------------------------------------------------------
  if (int(blockIdx.y) >= *p.num_tiles) return;
  const int2 tile = p.tiles[blockIdx.y];
  const int expert = tile.x;
  const int start = p.offsets[expert], cnt = p.offsets[expert + 1] - start;
  const int pos0 = start + tile.y;
  const int nrows = min(BM, cnt - tile.y);
  for (int r = threadIdx.x; r < BM; r += THREADS) {
    int a = -1, o = -1;
    if (r < nrows) {
      const int pos = pos0 + r;
      if constexpr (MODE == GemmMode::kExpertGateUp) {
        a = p.pairs[pos] / p.topk;
        o = pos;
      } else {
        a = pos;
        o = p.pairs[pos];
      }
    }
    s_arow[r] = a;
    s_orow[r] = o;
  }
  __syncthreads();

  const int K = p.K;
  const int KT = K / BK;
  const __nv_bfloat16* Bexp = p.B + int64_t(expert) * p.b_expert_stride;
  // First output column of this CTA (SwiGLU: act column; B rows n0.. and up_offset + n0..).
  const int n0 = blockIdx.x * (kSwiglu ? BN / 2 : BN);

  const uint64_t b_policy = l2_policy(p.l2_hint >= 1);
  auto load_stage = [&](int stage, int kt) {
    __nv_bfloat16* a_dst = sA + stage * BM * BK;
    __nv_bfloat16* b_dst = sB + stage * BN * BK;
    const int kofs = kt * BK;
    for (int c = threadIdx.x; c < BM * 8; c += THREADS) {
      const int r = c >> 3, ch = c & 7;
      const int ar = s_arow[r];
      const __nv_bfloat16* src = p.A + (ar >= 0 ? int64_t(ar) * K + kofs + ch * 8 : 0);
      cp_async16(a_dst + swz(r, ch), src, ar >= 0);
    }
    for (int c = threadIdx.x; c < BN * 8; c += THREADS) {
      const int r = c >> 3, ch = c & 7;
      int grow;
      if constexpr (kSwiglu) {
        grow = r < BN / 2 ? n0 + r : p.b_up_offset + n0 + (r - BN / 2);
      } else {
        grow = n0 + r;
      }
      cp_async16(b_dst + swz(r, ch), Bexp + int64_t(grow) * K + kofs + ch * 8, true, b_policy);
    }
  };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / Cfg::kWarpsN, wn = warp % Cfg::kWarpsN;

  // Local B-tile row of this warp's n-fragment f.
  auto brow = [&](int f) -> int {
    if constexpr (kSwiglu) {
      constexpr int half = NF / 2;
      return f < half ? wn * (WN / 2) + f * 8 : BN / 2 + wn * (WN / 2) + (f - half) * 8;
    } else {
      return wn * WN + f * 8;
    }
  };

  float acc[MF][NF][4];
#pragma unroll
  for (int i = 0; i < MF; ++i)
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nk = kt + STAGES - 1;
      if (nk < KT) load_stage(nk % STAGES, nk);
      cp_async_commit();
    }
    const __nv_bfloat16* a_s = sA + (kt % STAGES) * BM * BK;
    const __nv_bfloat16* b_s = sB + (kt % STAGES) * BN * BK;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      uint32_t af[MF][4];
#pragma unroll
      for (int i = 0; i < MF; ++i) {
        const int r = wm * WM + i * 16 + (lane & 15);
        ldmatrix_x4(af[i], a_s + swz(r, ks * 2 + (lane >> 4)));
      }
      uint32_t bfr[NF][2];
#pragma unroll
      for (int j = 0; j < NF; j += 2) {
        const int f = (lane >> 4) ? j + 1 : j;
        const int r = brow(f) + (lane & 7);
        uint32_t t[4];
        ldmatrix_x4(t, b_s + swz(r, ks * 2 + ((lane >> 3) & 1)));
        bfr[j][0] = t[0];
        bfr[j][1] = t[1];
        bfr[j + 1][0] = t[2];
        bfr[j + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) mma_bf16_16816(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue ---------------------------------------------------------------------------------
  const int lr = lane >> 2, lc = (lane & 3) * 2;
#pragma unroll
  for (int i = 0; i < MF; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * WM + i * 16 + lr + h * 8;
      if (r >= nrows) continue;
      const int orow = s_orow[r];
      if constexpr (kSwiglu) {
        constexpr int half = NF / 2;
#pragma unroll
        for (int j = 0; j < half; ++j) {
          const int col = n0 + wn * (WN / 2) + j * 8 + lc;
          const float v0 = silu_f32(acc[i][j][2 * h]) * acc[i][j + half][2 * h];
          const float v1 = silu_f32(acc[i][j][2 * h + 1]) * acc[i][j + half][2 * h + 1];
          auto* C = static_cast<__nv_bfloat16*>(p.C);
          *reinterpret_cast<__nv_bfloat162*>(C + int64_t(orow) * p.ldc + col) = __floats2bfloat162_rn(v0, v1);
        }
      } else {
#pragma unroll
        for (int j = 0; j < NF; ++j) {
          const int col = n0 + wn * WN + j * 8 + lc;
          auto* C = static_cast<__nv_bfloat16*>(p.C);
          *reinterpret_cast<__nv_bfloat162*>(C + int64_t(orow) * p.ldc + col) =
              __floats2bfloat162_rn(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
    }
  }
}

}  // namespace moefold::cuda::moe_detail
