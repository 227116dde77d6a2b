// MoE router on the GPU: logits = x . W_router^T in fp32 (tensor cores, moe_gemm.cuh dense mode), then one
// warp per live row computes the fp32 softmax and the top-k exactly as cpu::router_topk does: e = exp(l -
// max) rounded to fp32 (computed in fp64, so it is the correctly rounded value a libm expf returns), the
// denominator summed in fp64, p = fp32(e / sum); NaN logits rank below every number; ties go to the
// lower expert index; k rounds of a warp max over a 64-bit key (valid, p bits, ~index) pick distinct
// experts; the renormalising sum is taken in fp64 in slot order.
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"

namespace moefold::cuda {
namespace {

using moe_detail::GemmCfg;
using moe_detail::GemmMode;
using moe_detail::GemmParams;
using moe_detail::moe_gemm_kernel;

template <class Cfg>
void launch_router_gemm(const GemmParams& p, int capacity, cudaStream_t stream) {
  auto kernel = moe_gemm_kernel<Cfg, GemmMode::kDenseF32>;
  static bool attr_set = false;  // per instantiation; setting it twice is harmless
  if (!attr_set) {
    MOEFOLD_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes)));
    attr_set = true;
  }
  const dim3 grid((p.N + Cfg::kBN - 1) / Cfg::kBN, (capacity + Cfg::kBM - 1) / Cfg::kBM);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

constexpr int kTopkWarps = 8;

template <int VPT>
__global__ void __launch_bounds__(kTopkWarps * 32)
    router_topk_kernel(const float* __restrict__ logits, const int32_t* __restrict__ num_rows, int capacity,
                       int E, int k, bool renormalize, int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kTopkWarps + warp;
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  if (t >= live) return;
  const float* l = logits + int64_t(t) * E;

  float v[VPT];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    v[i] = e < E ? l[e] : NAN;
    if (e < E && !isnan(v[i])) m = fmaxf(m, v[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));

  // e = exp(l - m) in fp32 (0 for NaN logits, all 0 when the max is infinite), sum in fp64.
  double part = 0.0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    float p = 0.0f;
    if (e < E && !isnan(v[i]) && !isinf(m)) p = float(exp(double(v[i] - m)));
    if (e < E) part += double(p);
    v[i] = p;  // reuse: now the unnormalised probability
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  const double denom = part;

  // Ranking keys: bit 63 = logit is a number, bits 62..32 = p (non-negative fp32 bits order like values),
  // bits 31..0 = ~expert (lower index wins ties). 0 = absent or already taken.
  uint64_t key[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    if (e < E) {
      const bool is_num = !isnan(l[e]);
      const float p = denom > 0.0 ? float(double(v[i]) / denom) : 0.0f;
      key[i] = (uint64_t(is_num) << 63) | (uint64_t(__float_as_uint(p)) << 32) | uint64_t(~uint32_t(e));
    } else {
      key[i] = 0;
    }
  }

  double sum = 0.0;
  int32_t* out_ids = ids + int64_t(t) * k;
  float* out_w = weights + int64_t(t) * k;
  for (int s = 0; s < k; ++s) {
    uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < VPT; ++i) best = key[i] > best ? key[i] : best;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t other = __shfl_xor_sync(0xffffffffu, best, o);
      best = other > best ? other : best;
    }
    const int e = int(~uint32_t(best & 0xffffffffu));
    const float p = __uint_as_float(uint32_t(best >> 32) & 0x7fffffffu);
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      if (key[i] == best) key[i] = 0;
    sum += double(p);
    if (lane == 0) {
      out_ids[s] = e;
      out_w[s] = p;
    }
  }
  if (renormalize && lane == 0 && sum > 0.0) {
    for (int s = 0; s < k; ++s) out_w[s] = float(double(out_w[s]) / sum);
  }
}

template <int VPT>
void launch_topk(const float* logits, const int32_t* num_rows, const MoeShape& s, bool renormalize, int32_t* ids,
                 float* weights, cudaStream_t stream) {
  const int blocks = (s.capacity + kTopkWarps - 1) / kTopkWarps;
  router_topk_kernel<VPT><<<blocks, kTopkWarps * 32, 0, stream>>>(logits, num_rows, s.capacity, s.E, s.k,
                                                                    renormalize, ids, weights);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace

void moe_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const int32_t* num_rows,
                       const MoeShape& s, float* logits, cudaStream_t stream) {
  MOEFOLD_CHECK(s.capacity >= 1 && s.E >= 2 && s.E % 2 == 0 && s.H % 64 == 0,
                fmt::runtime("moe_router_logits: unsupported shape capacity={} E={} H={}"), s.capacity, s.E, s.H);
  GemmParams p;
  p.A = x;
  p.B = w_router;
  p.C = logits;
  p.num_rows = num_rows;
  p.capacity = s.capacity;
  p.K = s.H;
  p.N = s.E;
  p.ldc = s.E;
  if (s.capacity <= 64)
    launch_router_gemm<GemmCfg<16, 16, 1, 1, 4>>(p, s.capacity, stream);
  else
    launch_router_gemm<GemmCfg<64, 64, 2, 2, 4>>(p, s.capacity, stream);
}

void moe_router_topk(const float* logits, const int32_t* num_rows, const MoeShape& s, bool renormalize,
                     int32_t* ids, float* weights, cudaStream_t stream) {
  MOEFOLD_CHECK(s.E >= 1 && s.E <= 512 && s.k >= 1 && s.k <= s.E, fmt::runtime("moe_router_topk: unsupported E={} k={}"),
                s.E, s.k);
  const int vpt = (s.E + 31) / 32;
  if (vpt <= 1) launch_topk<1>(logits, num_rows, s, renormalize, ids, weights, stream);
  else if (vpt <= 2) launch_topk<2>(logits, num_rows, s, renormalize, ids, weights, stream);
  else if (vpt <= 4) launch_topk<4>(logits, num_rows, s, renormalize, ids, weights, stream);
  else if (vpt <= 8) launch_topk<8>(logits, num_rows, s, renormalize, ids, weights, stream);
  else launch_topk<16>(logits, num_rows, s, renormalize, ids, weights, stream);
}

}  // namespace moefold::cuda
