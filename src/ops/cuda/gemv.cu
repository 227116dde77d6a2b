// Weight-streaming GEMV for decode batches of up to 32 rows (see gemv.h for the contract).
//
// Tiling. One block owns 16 output columns (weight rows; the SwiGLU variant 8 gate + 8 up rows) and the
// whole K; its warps_k warps split K into contiguous ranges of 32-wide steps. A warp runs one
// mma.sync m16n8k16 chain per 8-row weight tile with A = x (16 batch rows a tile, rows >= live zero)
// and B = w^T, so a weight fragment comes straight from global memory: lane (g = lane / 4, t = lane % 4)
// loads 16 bytes of weight row g at k = 32 s + 8 t, and the same 16 bytes of x rows g and g + 8. The
// 8 loaded k are split over the step's two mma halves as (0,1 | 2,3) and (4,5 | 6,7), a permutation of
// k inside the step that A and B share, so the products are the right ones and every k is used once.
// Each lane thus issues 2 weight loads a step (two 8-row tiles) and U steps of loads before the first
// mma (U = 4 for one row tile, 2 for two), and weights bypass L1 (ld.global.nc.L1::no_allocate) so x
// stays cached there. __launch_bounds__(512, 1) matters: without the ", 1" ptxas kept ~60 registers by
// sinking each load to just before its mma (3-4 loads in flight per warp instead of 16; nvdisasm).
// Partial tiles go through shared memory and are added in warp order by the epilogue threads, which
// add the bias, apply the epilogue and store the live rows only.
//
// Why mma.sync rather than FMA: at 16 rows a CUDA-core GEMV needs 16 FMA per weight element, about the
// SM's whole FMA rate at HBM speed; the tensor cores do it for free. Why no split of K across blocks:
// the reduction would need a second pass or atomics; instead small N gets more warps per block.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
namespace {

using bf16 = __nv_bfloat16;
using detail::live_count;

enum class Epi : int { Bf16, F32, Swiglu, Residual };

constexpr int kStepK = 32;        // k per step: two mma k16 halves
constexpr int kTiles = 2;         // 8-row weight tiles per block
constexpr int kMaxWarpsK = 16;    // warps per block (the K split) at most
constexpr int kTargetWarps = 2048;  // default split: blocks * warps_k >= this (~132 SMs x 16 warps)

const prof::Kernel kGemvBf16{"gemv_bf16_kernel", prof::Category::DenseGemm};
const prof::Kernel kGemvF32{"gemv_bf16_f32out_kernel", prof::Category::DenseGemm};
const prof::Kernel kGemvSwiglu{"gemv_swiglu_kernel", prof::Category::DenseGemm};
const prof::Kernel kGemvResidual{"gemv_residual_kernel", prof::Category::DenseGemm};

struct Args {
  const bf16* x;
  const bf16* w;
  const void* bias;   // bf16, or fp32 for Epi::F32; nullable
  const bf16* res;    // Epi::Residual only
  void* y;            // bf16, or fp32 for Epi::F32
  int64_t K, n_out;   // n_out: output columns (N; I for SwiGLU, whose weight has 2I rows)
  int64_t x_stride, y_stride, res_stride;
  const int32_t* live;
  int max_rows, steps, warps_k;
};

using ptx::ld_stream16;

/// 16 bytes at p if `ok`, else zeros, as one predicated load (no branch, so the scheduler can issue a
/// whole step's loads back to back). STREAM: the weight path (read-only, no L1 allocation, 256-byte L2
/// prefetch); else the read-only path through L1 (x, re-read by the other blocks on the SM).
template <bool STREAM>
__device__ __forceinline__ uint4 ld16_pred(const void* p, bool ok) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if constexpr (STREAM) {
    asm("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
        " @q ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "l"(p), "r"(int(ok)));
  } else {
    asm("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
        " @q ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "l"(p), "r"(int(ok)));
  }
  return v;
}

__device__ __forceinline__ uint32_t pack2(unsigned short lo, unsigned short hi) {
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

/// The 8 bf16 row[k .. k+7] as 4 packed pairs (lower k in the low half); zeros where !ok or k+i >= K.
/// VEC: one 16-byte load (needs row + k 16-byte aligned and K % 8 == 0); STREAM picks the weight path.
template <bool VEC, bool STREAM>
__device__ __forceinline__ uint4 load8(const bf16* row, int64_t k, int64_t K, bool ok) {
  if constexpr (VEC) {
    return ld16_pred<STREAM>(row + k, ok && k < K);
  } else {
    if (!ok || k >= K) return make_uint4(0u, 0u, 0u, 0u);
    const unsigned short* p = reinterpret_cast<const unsigned short*>(row + k);
    unsigned short e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = k + i < K ? __ldg(p + i) : (unsigned short)0;
    return make_uint4(pack2(e[0], e[1]), pack2(e[2], e[3]), pack2(e[4], e[5]), pack2(e[6], e[7]));
  }
}

__device__ __forceinline__ float bf16r(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// MT: 16-row batch tiles (1: max_rows <= 16, 2: <= 32). VW: 16-byte weight loads; VX: 16-byte x loads.
template <int MT, bool VW, bool VX, Epi E>
__global__ void __launch_bounds__(kMaxWarpsK * 32, 1) gemv_kernel(const Args a) {
  pdl_begin();
  constexpr int U = MT == 1 ? 4 : 2;                           // steps of loads in flight per warp
  constexpr int COLS = E == Epi::Swiglu ? 8 : kTiles * 8;       // output columns per block
  constexpr int ROWS = MT * 16;
  constexpr int PN = kTiles * 8;                               // partial columns per warp
  extern __shared__ float part[];                              // [warps_k][ROWS][PN]

  const int live = int(live_count(a.live, a.max_rows));
  if (live <= 0) return;
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int64_t col0 = int64_t(blockIdx.x) * COLS, K = a.K;

  const bf16* wrow[kTiles];
  bool wok[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int64_t c = E == Epi::Swiglu ? col0 + g : col0 + j * 8 + g;  // output column of weight row
    wok[j] = c < a.n_out;
    const int64_t r = E == Epi::Swiglu ? c + j * a.n_out : c;          // tile 1 of SwiGLU: the up rows
    wrow[j] = a.w + (wok[j] ? r : 0) * K;
  }
  const bf16* xrow[MT][2];
  bool xok[MT][2];
  uint32_t xmask[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + h * 8 + g;
      xok[mt][h] = r < live;  // padding rows are never read
      xrow[mt][h] = a.x + (xok[mt][h] ? int64_t(r) * a.x_stride : 0);
      xmask[mt][h] = xok[mt][h] ? 0xFFFFFFFFu : 0u;
    }

  // This warp's steps [s0, s1): depends only on (steps, warps_k).
  const int s0 = int(int64_t(warp) * a.steps / a.warps_k), s1 = int(int64_t(warp + 1) * a.steps / a.warps_k);
  float acc[MT][kTiles][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.0f;

  // UU steps from s: every load (weights and x) is issued before the first mma waits on one. GUARD:
  // loads checked against s1, K and the row bounds (the tail); else unconditional, for the 16-byte
  // paths' full steps: weight rows past N read row 0 (their columns are never stored), x rows past the
  // live count read row 0 (a live row) and are masked to zero, so padding rows are never read.
  auto block = [&](int s, auto uu, auto guard) {
    constexpr int UU = decltype(uu)::value;
    constexpr bool GUARD = decltype(guard)::value;
    uint4 wv[UU][kTiles], xv[UU][MT][2];
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      const int64_t k = int64_t(s + u) * kStepK + 8 * t;
      const bool in = !GUARD || s + u < s1;
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
        wv[u][j] = GUARD || !VW ? load8<VW, true>(wrow[j], k, K, wok[j] && in) : ld_stream16(wrow[j] + k);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (GUARD || !VX) {
            xv[u][mt][h] = load8<VX, false>(xrow[mt][h], k, K, xok[mt][h] && in);
          } else {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(xrow[mt][h] + k));
            const uint32_t msk = xmask[mt][h];
            xv[u][mt][h] = make_uint4(v.x & msk, v.y & msk, v.z & msk, v.w & msk);
          }
        }
    }
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      if (!GUARD || s + u < s1) {  // warp-uniform: steps past the range add nothing (not even +0)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint4 lo = xv[u][mt][0], hi = xv[u][mt][1];
          const uint32_t a1[4] = {lo.x, hi.x, lo.y, hi.y};  // k (0,1 | 2,3) of this lane's 8
          const uint32_t a2[4] = {lo.z, hi.z, lo.w, hi.w};  // k (4,5 | 6,7)
#pragma unroll
          for (int j = 0; j < kTiles; ++j) {
            ptx::mma_bf16_16816(acc[mt][j], a1, wv[u][j].x, wv[u][j].y);
            ptx::mma_bf16_16816(acc[mt][j], a2, wv[u][j].z, wv[u][j].w);
          }
        }
      }
    }
  };
  // Steps in ascending order either way: full U-step blocks while every k of them is < K, then the
  // guarded tail one step at a time (the split between the two does not change the order).
  const int s_full = VW ? min(s1, int(K / kStepK)) : s0;
  int s = s0;
  for (; s + U <= s_full; s += U) block(s, std::integral_constant<int, U>{}, std::false_type{});
  for (; s < s1; ++s) block(s, std::integral_constant<int, 1>{}, std::true_type{});

  // Partials: D fragment (row g / g+8 of the batch tile, columns 2t, 2t+1 of the weight tile).
  float* pw = part + size_t(warp) * ROWS * PN;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int m = mt * 16 + g, n = j * 8 + 2 * t;
      pw[m * PN + n] = acc[mt][j][0];
      pw[m * PN + n + 1] = acc[mt][j][1];
      pw[(m + 8) * PN + n] = acc[mt][j][2];
      pw[(m + 8) * PN + n + 1] = acc[mt][j][3];
    }
  __syncthreads();

  const int nw = a.warps_k;
  for (int e = int(threadIdx.x); e < ROWS * COLS; e += int(blockDim.x)) {
    const int m = e / COLS, c = e % COLS;
    const int64_t col = col0 + c;
    if (m >= live || col >= a.n_out) continue;
    auto sum = [&](int n) {  // fixed warp order
      float v = part[m * PN + n];
      for (int w = 1; w < nw; ++w) v += part[(size_t(w) * ROWS + m) * PN + n];
      return v;
    };
    if constexpr (E == Epi::F32) {
      float v = sum(c);
      if (a.bias) v += static_cast<const float*>(a.bias)[col];
      static_cast<float*>(a.y)[m * a.y_stride + col] = v;
    } else if constexpr (E == Epi::Swiglu) {
      float gt = sum(c), up = sum(8 + c);
      if (a.bias) {
        gt += __bfloat162float(static_cast<const bf16*>(a.bias)[col]);
        up += __bfloat162float(static_cast<const bf16*>(a.bias)[a.n_out + col]);
      }
      gt = bf16r(gt);  // the chain's GEMM output rounding, then cuda::swiglu's math
      up = bf16r(up);
      static_cast<bf16*>(a.y)[m * a.y_stride + col] = __float2bfloat16_rn(detail::siluf_(gt) * up);
    } else {
      float v = sum(c);
      if (a.bias) v += __bfloat162float(static_cast<const bf16*>(a.bias)[col]);
      if constexpr (E == Epi::Residual) v = __bfloat162float(a.res[m * a.res_stride + col]) + bf16r(v);
      static_cast<bf16*>(a.y)[m * a.y_stride + col] = __float2bfloat16_rn(v);
    }
  }
}

template <Epi E, int MT>
void launch_mt(const Args& a, bool vw, bool vx, unsigned blocks, size_t smem, cudaStream_t stream) {
  const unsigned threads = unsigned(a.warps_k) * 32;
  if (vw && vx) launch_pdl(gemv_kernel<MT, true, true, E>, dim3(blocks), dim3(threads), smem, stream, a);
  else if (vw) launch_pdl(gemv_kernel<MT, true, false, E>, dim3(blocks), dim3(threads), smem, stream, a);
  else launch_pdl(gemv_kernel<MT, false, false, E>, dim3(blocks), dim3(threads), smem, stream, a);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int pick_warps_k(int64_t groups, int steps) {
  int nwk = 4;
  while (nwk < kMaxWarpsK && groups * nwk < kTargetWarps) nwk *= 2;
  while (nwk > 1 && nwk > steps) nwk /= 2;
  return nwk;
}

template <Epi E>
void run(const char* what, const prof::Kernel& kern, Args a, int64_t max_rows, int64_t weight_rows,
         cudaStream_t stream, int warps_k) {
  constexpr int COLS = E == Epi::Swiglu ? 8 : kTiles * 8;
  MOEFOLD_CHECK(max_rows >= 0 && max_rows <= kGemvMaxRows, "{}: max_rows {} outside [0, {}]", what, max_rows,
                kGemvMaxRows);
  MOEFOLD_CHECK(a.K >= 1 && a.n_out >= 1, "{}: bad sizes K={} N={}", what, a.K, a.n_out);
  if (a.x_stride == 0) a.x_stride = a.K;
  if (a.y_stride == 0) a.y_stride = a.n_out;
  if (a.res_stride == 0) a.res_stride = a.y_stride;
  MOEFOLD_CHECK(a.x_stride >= a.K && a.y_stride >= a.n_out && a.res_stride >= a.n_out,
                "{}: bad strides x_stride={} (K={}) y_stride={} res_stride={} (N={})", what, a.x_stride, a.K,
                a.y_stride, a.res_stride, a.n_out);
  MOEFOLD_CHECK(warps_k >= 0 && warps_k <= kMaxWarpsK, "{}: warps_k {} outside [0, {}]", what, warps_k, kMaxWarpsK);
  const int64_t steps = (a.K + kStepK - 1) / kStepK, groups = (a.n_out + COLS - 1) / COLS;
  MOEFOLD_CHECK(steps < (int64_t(1) << 30) && groups < (int64_t(1) << 31), "{}: K={} N={} too large", what, a.K,
                a.n_out);
  if (max_rows == 0) return;
  MOEFOLD_CHECK(a.x && a.w && a.y && (E != Epi::Residual || a.res), "{}: null pointer", what);
  a.max_rows = int(max_rows);
  a.steps = int(steps);
  a.warps_k = warps_k ? warps_k : pick_warps_k(groups, a.steps);
  const bool vw = a.K % 8 == 0 && aligned16(a.w);
  const bool vx = vw && aligned16(a.x) && a.x_stride % 8 == 0;
  const int mt = max_rows <= 16 ? 1 : 2;
  const size_t smem = size_t(a.warps_k) * size_t(mt) * 16 * kTiles * 8 * sizeof(float);
  LaunchScope launch(kern, stream, [&] {
    const double out_bytes = E == Epi::F32 ? 4.0 : 2.0, rows = double(work_rows(max_rows, a.live));
    return prof::Work{double(weight_rows) * double(a.K) * 2 + rows * double(a.K) * 2 +
                          rows * double(a.n_out) * out_bytes * (E == Epi::Residual ? 2 : 1),
                      2.0 * rows * double(a.K) * double(weight_rows)};
  });
  if (mt == 1) launch_mt<E, 1>(a, vw, vx, unsigned(groups), smem, stream);
  else launch_mt<E, 2>(a, vw, vx, unsigned(groups), smem, stream);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

Args make_args(const bf16* x, const bf16* w, const void* bias, const bf16* res, void* y, int64_t K, int64_t n_out,
               const int32_t* live, int64_t x_stride, int64_t y_stride, int64_t res_stride) {
  Args a{};
  a.x = x;
  a.w = w;
  a.bias = bias;
  a.res = res;
  a.y = y;
  a.K = K;
  a.n_out = n_out;
  a.live = live;
  a.x_stride = x_stride;
  a.y_stride = y_stride;
  a.res_stride = res_stride;
  return a;
}

}  // namespace

int gemv_default_warps_k(int64_t N, int64_t K, int cols_per_block) {
  MOEFOLD_CHECK(N >= 1 && K >= 1 && cols_per_block >= 1, "gemv_default_warps_k: bad sizes N={} K={}", N, K);
  return pick_warps_k((N + cols_per_block - 1) / cols_per_block, int(std::min<int64_t>((K + kStepK - 1) / kStepK, 1 << 30)));
}

void gemv_bf16(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t max_rows, int64_t K, int64_t N,
               const int32_t* live_rows, cudaStream_t stream, int64_t x_stride, int64_t y_stride, int warps_k) {
  run<Epi::Bf16>("gemv_bf16", kGemvBf16, make_args(x, w, bias, nullptr, y, K, N, live_rows, x_stride, y_stride, 0),
                 max_rows, N, stream, warps_k);
}

void gemv_bf16_f32out(const bf16* x, const bf16* w, const float* bias, float* y, int64_t max_rows, int64_t K,
                      int64_t N, const int32_t* live_rows, cudaStream_t stream, int64_t x_stride, int64_t y_stride,
                      int warps_k) {
  run<Epi::F32>("gemv_bf16_f32out", kGemvF32,
                make_args(x, w, bias, nullptr, y, K, N, live_rows, x_stride, y_stride, 0), max_rows, N, stream,
                warps_k);
}

void gemv_swiglu_bf16(const bf16* x, const bf16* w_gate_up, const bf16* bias, bf16* out, int64_t max_rows, int64_t K,
                      int64_t I, const int32_t* live_rows, cudaStream_t stream, int64_t x_stride,
                      int64_t out_stride) {
  run<Epi::Swiglu>("gemv_swiglu_bf16", kGemvSwiglu,
                   make_args(x, w_gate_up, bias, nullptr, out, K, I, live_rows, x_stride, out_stride, 0), max_rows,
                   2 * I, stream, 0);
}

void gemv_residual_bf16(const bf16* x, const bf16* w, const bf16* bias, const bf16* residual, bf16* y,
                        int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
                        int64_t x_stride, int64_t y_stride, int64_t res_stride) {
  run<Epi::Residual>("gemv_residual_bf16", kGemvResidual,
                     make_args(x, w, bias, residual, y, K, N, live_rows, x_stride, y_stride, res_stride), max_rows,
                     N, stream, 0);
}

}  // namespace moefold::cuda
