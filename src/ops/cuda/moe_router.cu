// MoE router on the GPU: logits = x . W_router^T in fp32 (tensor cores, split-K over warps), then one
// warp per live row computes the fp32 softmax and the top-k exactly as cpu::router_topk does: e = exp(l -
// max) rounded to fp32 (computed in fp64, so it is the correctly rounded value a libm expf returns), the
// denominator summed in fp64, p = fp32(e / sum); NaN logits rank below every number; ties go to the
// lower expert index; k rounds of a warp max over a 64-bit key (valid, p bits, ~index) pick distinct
// experts; the renormalising sum is taken in fp64 in slot order.
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/moe_topk.cuh"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
namespace {

// Router logits: one CTA computes a 16-row x 16-expert tile; its KSPLIT warps each run an mma.sync chain
// over one contiguous K range (own cp.async pipeline, 64 columns a stage), and the partial tiles are added
// in warp order. KSPLIT depends only on H, never on the capacity, so every capacity (bucket) computes
// each logit with the same operations in the same order: padded and unpadded runs agree bit for bit.
// Decode (1 row) is latency-bound: the K split puts KSPLIT independent load streams on each tile.
constexpr int kRouterBM = 16, kRouterBN = 16, kRouterBK = 64, kRouterStages = 3;

template <int KSPLIT>
__global__ void __launch_bounds__(KSPLIT * 32)
    router_logits_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                         const int32_t* __restrict__ num_rows, int capacity, int H, int E, float* __restrict__ logits) {
  pdl_begin();
  using namespace moe_detail;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  const int m0 = blockIdx.y * kRouterBM, n0 = blockIdx.x * kRouterBN;
  if (m0 >= live) return;
  const int nrows = min(kRouterBM, live - m0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kTile = kRouterBM * kRouterBK;  // elements of one 16 x 64 tile
  __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(smem_raw) + warp * kRouterStages * 2 * kTile;
  __nv_bfloat16* sB = sA + kRouterStages * kTile;

  const int kw = H / KSPLIT, k0 = warp * kw, KT = kw / kRouterBK;
  auto load = [&](int stage, int kt) {
    const int kofs = k0 + kt * kRouterBK;
#pragma unroll
    for (int c = lane; c < kRouterBM * 8; c += 32) {
      const int r = c >> 3, ch = c & 7;
      const bool a_ok = r < nrows, b_ok = n0 + r < E;
      cp_async16(sA + stage * kTile + swz(r, ch), x + (a_ok ? int64_t(m0 + r) * H + kofs + ch * 8 : 0), a_ok);
      cp_async16(sB + stage * kTile + swz(r, ch), w + (b_ok ? int64_t(n0 + r) * H + kofs + ch * 8 : 0), b_ok);
    }
  };
  float acc[2][4] = {};
#pragma unroll
  for (int s = 0; s < kRouterStages - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kRouterStages - 2>();
    __syncwarp();
    {
      const int nk = kt + kRouterStages - 1;
      if (nk < KT) load(nk % kRouterStages, nk);
      cp_async_commit();
    }
    const __nv_bfloat16* a_s = sA + (kt % kRouterStages) * kTile;
    const __nv_bfloat16* b_s = sB + (kt % kRouterStages) * kTile;
#pragma unroll
    for (int ks = 0; ks < kRouterBK / 16; ++ks) {
      uint32_t af[4], bf[4];
      ldmatrix_x4(af, a_s + swz(lane & 15, ks * 2 + (lane >> 4)));
      ldmatrix_x4(bf, b_s + swz((lane >> 4) * 8 + (lane & 7), ks * 2 + ((lane >> 3) & 1)));
      mma_bf16_16816(acc[0], af, bf[0], bf[1]);
      mma_bf16_16816(acc[1], af, bf[2], bf[3]);
    }
    __syncwarp();
  }
  cp_async_wait<0>();
  __syncthreads();
  // Partial tiles to shared memory (reusing the pipeline buffers), then a fixed-order sum over warps.
  float* red = reinterpret_cast<float*>(smem_raw);  // [KSPLIT][16][16]
  const int lr = lane >> 2, lc = (lane & 3) * 2;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      red[(warp * 16 + lr + 8 * h) * 16 + j * 8 + lc] = acc[j][2 * h];
      red[(warp * 16 + lr + 8 * h) * 16 + j * 8 + lc + 1] = acc[j][2 * h + 1];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < kRouterBM * kRouterBN; i += KSPLIT * 32) {
    const int r = i / kRouterBN, c = i % kRouterBN;
    if (r >= nrows || n0 + c >= E) continue;
    float v = red[i];
#pragma unroll
    for (int q = 1; q < KSPLIT; ++q) v += red[q * kRouterBM * kRouterBN + i];
    logits[int64_t(m0 + r) * E + n0 + c] = v;
  }
}

template <int KSPLIT>
void launch_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* num_rows, const MoeShape& s,
                          float* logits, cudaStream_t stream) {
  auto kernel = router_logits_kernel<KSPLIT>;
  constexpr int smem = KSPLIT * kRouterStages * 2 * kRouterBM * kRouterBK * 2;
  static_assert(smem >= KSPLIT * kRouterBM * kRouterBN * 4, "reduction buffer fits in the pipeline buffers");
  static bool attr_set = false;  // per instantiation; setting it twice is harmless
  if (!attr_set) {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  const dim3 grid((s.E + kRouterBN - 1) / kRouterBN, (s.capacity + kRouterBM - 1) / kRouterBM);
  launch_pdl(kernel, dim3(grid), dim3(KSPLIT * 32), smem, stream, x, w, num_rows, s.capacity, s.H, s.E, logits);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

constexpr int kTopkWarps = 8;

template <int VPT>
__global__ void __launch_bounds__(kTopkWarps * 32)
    router_topk_kernel(const float* __restrict__ logits, const int32_t* __restrict__ num_rows, int capacity,
                       int E, int k, bool renormalize, const int32_t* __restrict__ replay,
                       int32_t* __restrict__ ids, float* __restrict__ weights) {
  pdl_begin();
  const int warp = threadIdx.x >> 5;
  const int t = blockIdx.x * kTopkWarps + warp;
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  if (t >= live) return;
  moe_detail::topk_row<VPT>(logits + int64_t(t) * E, E, k, renormalize, replay ? replay + int64_t(t) * k : nullptr,
                            ids + int64_t(t) * k, weights + int64_t(t) * k);
}

template <int VPT>
void launch_topk(const float* logits, const int32_t* num_rows, const MoeShape& s, bool renormalize,
                 const int32_t* replay, int32_t* ids, float* weights, cudaStream_t stream) {
  const int blocks = (s.capacity + kTopkWarps - 1) / kTopkWarps;
  launch_pdl(router_topk_kernel<VPT>, dim3(blocks), dim3(kTopkWarps * 32), 0, stream, logits, num_rows, s.capacity, s.E, s.k,
                                                                    renormalize, replay, ids, weights);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

const prof::Kernel kRouterLogits{"router_logits_kernel", prof::Category::MoeRouting};
const prof::Kernel kRouterTopk{"router_topk_kernel", prof::Category::MoeRouting};

}  // namespace

void moe_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const int32_t* num_rows,
                       const MoeShape& s, float* logits, cudaStream_t stream) {
  MOEFOLD_CHECK(s.capacity >= 1 && s.E >= 2 && s.E % 2 == 0 && s.H % (2 * kRouterBK) == 0,
                fmt::runtime("moe_router_logits: unsupported shape capacity={} E={} H={}"), s.capacity, s.E, s.H);
  LaunchScope launch(kRouterLogits, stream, [&] {  // W, live x rows read, fp32 logits written
    const double T = double(work_rows(s.capacity, num_rows));
    return prof::Work{double(s.E) * s.H * 2 + T * s.H * 2 + T * s.E * 4, 2.0 * T * s.H * s.E};
  });
  // The K split depends on H only (bit-identical logits at every capacity).
  if (s.H % (8 * kRouterBK) == 0)
    launch_router_logits<8>(x, w_router, num_rows, s, logits, stream);
  else if (s.H % (4 * kRouterBK) == 0)
    launch_router_logits<4>(x, w_router, num_rows, s, logits, stream);
  else
    launch_router_logits<2>(x, w_router, num_rows, s, logits, stream);
}

void moe_router_topk(const float* logits, const int32_t* num_rows, const MoeShape& s, bool renormalize,
                     int32_t* ids, float* weights, cudaStream_t stream, const int32_t* replay) {
  MOEFOLD_CHECK(s.E >= 1 && s.E <= 512 && s.k >= 1 && s.k <= s.E, fmt::runtime("moe_router_topk: unsupported E={} k={}"),
                s.E, s.k);
  const int vpt = (s.E + 31) / 32;
  LaunchScope launch(kRouterTopk, stream, [&] {  // logits read, ids and weights written
    const double T = double(work_rows(s.capacity, num_rows));
    return prof::Work{T * s.E * 4 + T * s.k * 8, 0};
  });
  if (vpt <= 1) launch_topk<1>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
  else if (vpt <= 2) launch_topk<2>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
  else if (vpt <= 4) launch_topk<4>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
  else if (vpt <= 8) launch_topk<8>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
  else launch_topk<16>(logits, num_rows, s, renormalize, replay, ids, weights, stream);
}

}  // namespace moefold::cuda
