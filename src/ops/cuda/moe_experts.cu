// MoE experts on the GPU: the workspace, the two grouped expert GEMMs (moe_gemm.cuh: gate_up with the
// SwiGLU epilogue writing act per planned pair, down writing y per pair id; at small step capacities the
// streaming kernels of moe_stream.cu or the split GEMVs of moe_gemv.cu instead), the combine (k slots in
// order, fp32, plus the sigmoid-gated shared expert) and the whole chain moe_forward.
// Grids are sized for the capacity's worst case (max row tiles); CTAs past the planned tile count, i.e.
// past the live rows, return at once, so experts with no rows and padding rows cost nothing.
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/l2_hint.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_gemm_wgmma.h"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/row_norm.cuh"

namespace moefold::cuda {
namespace {

using moe_detail::GemmCfg;
using moe_detail::GemmMode;
using moe_detail::GemmParams;
using moe_detail::moe_gemm_kernel;

// Expert-GEMM tile configurations, indexed by moe_detail::expert_config (BM must match
// moe_detail::expert_tile_rows).
// Decode (weight streaming). Measured on the H200 (docs/benchmarks.md): 16 x 64 tiles with a 4-deep
// pipeline beat 16 x 32 / 8-deep (gate_up) + 16 x 64 / 6-deep (down) at 8 and 64 tokens (3.2 vs 3.0 and
// 4.0 vs 3.5 TB/s) and tied at 1 token, so both GEMMs use the former.
using CfgDecodeGateUp = GemmCfg<16, 64, 1, 4, 4>;  // 128 threads, 40 KB smem; 32 act columns a CTA
using CfgDecodeDown = GemmCfg<16, 64, 1, 4, 4>;    // 128 threads, 40 KB
using CfgMedium = GemmCfg<64, 128, 2, 4, 4, 2>;    // 256 threads, 96 KB, 2 CTAs/SM
using CfgPrefill = GemmCfg<128, 128, 2, 4, 3, 2>;  // 256 threads, 96 KB, 2 CTAs/SM
static_assert(CfgDecodeGateUp::kBM == 16 && CfgDecodeDown::kBM == 16 && CfgMedium::kBM == 64 &&
              CfgPrefill::kBM == 128);

// Registry entries: one per GEMM and configuration (moe_detail::expert_config 0/1/2 = BM 16/64/128,
// 3 = the small-batch GEMV, 4 = the streaming kernels), so the table proves which kernels ran.
const prof::Kernel kExpertGemm[2][5] = {
    {{"moe_gemm_kernel:gate_up:bm16", prof::Category::RoutedExpertGemm},
     {"moe_gemm_kernel:gate_up:bm64", prof::Category::RoutedExpertGemm},
     {"moe_gemm_kernel:gate_up:bm128", prof::Category::RoutedExpertGemm},
     {"moe_gemv_gate_up_kernel", prof::Category::RoutedExpertGemm},
     {"moe_stream_kernel:gate_up", prof::Category::RoutedExpertGemm}},
    {{"moe_gemm_kernel:down:bm16", prof::Category::RoutedExpertGemm},
     {"moe_gemm_kernel:down:bm64", prof::Category::RoutedExpertGemm},
     {"moe_gemm_kernel:down:bm128", prof::Category::RoutedExpertGemm},
     {"moe_gemv_down_kernel", prof::Category::RoutedExpertGemm},
     {"moe_stream_kernel:down", prof::Category::RoutedExpertGemm}}};
static_assert(kMoeExpertGemv == 3 && kMoeExpertStream == 4, "kExpertGemm's last columns: the GEMV, the stream kernels");
// The 128-row tiles on wgmma (moe_gemm_wgmma.h, the default; MOEFOLD_MOE_GEMM=mma: the mma.sync tiles).
const prof::Kernel kExpertGemmWgmma[2] = {{"moe_gemm_wgmma_kernel:gate_up", prof::Category::RoutedExpertGemm},
                                          {"moe_gemm_wgmma_kernel:down", prof::Category::RoutedExpertGemm}};

/// Whether configuration `cfg` of `s` runs the wgmma version of the 128-row tiles.
bool wgmma_selected(const MoeShape& s, int cfg) {
  return cfg == 2 && moe_detail::expert_gemm_wgmma();
}
const prof::Kernel kCombine{"moe_combine_kernel", prof::Category::MoeRouting};
const prof::Kernel kCombineOnePass{"moe_combine_onepass_kernel", prof::Category::MoeRouting};
// The one-pass combine with the next layer's input norm in its epilogue (moe_combine's `next`).
const prof::Kernel kCombineNorm{"moe_combine_onepass_kernel:norm", prof::Category::MoeRouting};

/// Work of one expert GEMM from the plan's per-expert counts (pairs = their sum, touched experts = the
/// non-zero ones): the touched experts' weights, the live x rows (gate_up) or the pairs' activations
/// (down) read, the pairs' outputs written; 2 FLOPs per multiply-add of every planned pair.
prof::Work expert_gemm_work(bool gate_up, double pairs, double touched, const MoeShape& s) {
  const double H = s.H, I = s.I;
  if (gate_up)
    return prof::Work{touched * 2 * I * H * 2 + pairs / s.k * H * 2 + pairs * I * 2, 2.0 * pairs * H * 2 * I};
  return prof::Work{touched * H * I * 2 + pairs * I * 2 + pairs * H * 2, 2.0 * pairs * I * H};
}

/// Times the expert GEMM of `launch` with the work of the plan's counts, read after the step from the
/// snapshot moe_plan took (profiling only); without one, an upper bound from the live rows.
void set_expert_work(LaunchScope& launch, bool gate_up, const MoeShape& s, const MoeWorkspace& ws) {
  if (const int32_t* counts = latest_snapshot(ws.counts)) {
    launch.defer_work([counts, gate_up, s] {
      double pairs = 0, touched = 0;
      for (int e = 0; e < s.E; ++e) {
        pairs += counts[e];
        touched += counts[e] > 0 ? 1 : 0;
      }
      return expert_gemm_work(gate_up, pairs, touched, s);
    });
  }
}

prof::Work expert_work_bound(bool gate_up, const MoeShape& s) {
  const prof::StepFacts* f = prof::step_facts();  // the live rows are on the device: the step's, or capacity
  const double pairs = double(f ? std::min<int64_t>(f->rows, s.capacity) : s.capacity) * s.k;
  return expert_gemm_work(gate_up, pairs, std::min<double>(s.E, pairs), s);
}

template <class Cfg, GemmMode MODE>
void launch_expert_gemm(const GemmParams& p, int n_cols, int max_tiles, cudaStream_t stream) {
  auto kernel = moe_gemm_kernel<Cfg, MODE>;
  static bool attr_set = false;
  if (!attr_set) {
    MOEFOLD_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes)));
    attr_set = true;
  }
  const int per_cta = MODE == GemmMode::kExpertGateUp ? Cfg::kBN / 2 : Cfg::kBN;
  const dim3 grid(n_cols / per_cta, max_tiles);
  if (max_tiles == 0) return;
  launch_pdl(kernel, dim3(grid), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, p);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

template <GemmMode MODE>
void dispatch_expert_gemm(const GemmParams& p, const MoeShape& s, const MoeWorkspace& ws, int n_cols,
                          cudaStream_t stream) {
  // Row tiles of this step's shape (CTAs past the plan's num_tiles exit at once).
  const int cfg = moe_detail::expert_config(s);
  const int tiles = std::min(ws.max_tiles, moe_detail::max_row_tiles(s, moe_detail::expert_tile_rows(cfg)));
  // Steps of up to kL2HintMaxRows rows read each touched expert's weights once: evict_first (l2_hint.h).
  // Past that an expert's weights serve more tiles and stay worth keeping (batch 64 measured slower).
  constexpr int kL2HintMaxRows = 8;
  GemmParams q = p;
  if (s.capacity <= kL2HintMaxRows) q.l2_hint = l2_stream_hint();
  switch (cfg) {
    case 0:
      if constexpr (MODE == GemmMode::kExpertGateUp)
        launch_expert_gemm<CfgDecodeGateUp, MODE>(q, n_cols, tiles, stream);
      else
        launch_expert_gemm<CfgDecodeDown, MODE>(q, n_cols, tiles, stream);
      break;
    case kMoeExpertStream:
      if constexpr (MODE == GemmMode::kExpertGateUp)
        moe_detail::launch_stream_gate_up(p, tiles, stream);
      else
        moe_detail::launch_stream_down(p, tiles, stream);
      break;
    case 1: launch_expert_gemm<CfgMedium, MODE>(q, n_cols, tiles, stream); break;
    default:
      if (wgmma_selected(s, cfg)) {
        if constexpr (MODE == GemmMode::kExpertGateUp)
          moe_detail::launch_wgmma_gate_up(p, s.E, tiles, stream);
        else
          moe_detail::launch_wgmma_down(p, s.E, tiles, stream);
      } else {
        launch_expert_gemm<CfgPrefill, MODE>(p, n_cols, tiles, stream);
      }
      break;
  }
}

void check_shape(const MoeShape& s) {
  MOEFOLD_CHECK(s.capacity >= 1 && s.E >= 2 && s.E <= 1024 && s.E % 2 == 0 && s.k >= 1 && s.k <= s.E &&
                    s.H >= 128 && s.H % 128 == 0 && s.I >= 64 && s.I % 64 == 0 && s.expert_tiles >= -1 &&
                    s.expert_tiles <= kMoeExpertStream,
                fmt::runtime("MoE: unsupported shape capacity={} E={} k={} H={} I={} (see MoeShape)"),
                s.capacity, s.E, s.k, s.H, s.I);
  MOEFOLD_CHECK(int64_t(s.capacity) * s.k < (int64_t(1) << 30), fmt::runtime("MoE: capacity * k = {} too large"),
                int64_t(s.capacity) * s.k);
}

size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

// Lays the workspace out from `base` (nullptr: only measures). Returns the bytes used.
size_t layout(const MoeShape& s, char* base, MoeWorkspace* ws) {
  const size_t T = size_t(s.capacity), E = size_t(s.E), k = size_t(s.k), P = T * k;
  const int bm = moe_detail::expert_tile_rows(moe_detail::expert_config(s));
  // Room for the smallest tiles (the most of them): step shapes of any capacity up to this one and any
  // expert configuration fit.
  const int max_tiles = std::max(moe_detail::max_row_tiles(s, bm), moe_detail::max_row_tiles(s, moe_detail::kMinTileRows));
  const size_t cub_bytes = moefold::cuda::moe_plan_cub_temp_bytes(s.capacity, s.k, s.E);
  size_t off = 0;
  auto take = [&](size_t bytes) -> char* {
    char* p = base ? base + off : nullptr;
    off += align256(std::max<size_t>(bytes, 1));
    return p;
  };
  MoeWorkspace w;
  w.logits = reinterpret_cast<float*>(take(T * E * 4));
  w.ids = reinterpret_cast<int32_t*>(take(P * 4));
  w.weights = reinterpret_cast<float*>(take(P * 4));
  w.counts = reinterpret_cast<int32_t*>(take(E * 4));
  w.offsets = reinterpret_cast<int32_t*>(take((E + 1) * 4));
  w.tiles = reinterpret_cast<int2*>(take(size_t(max_tiles) * 8));
  w.num_tiles = reinterpret_cast<int32_t*>(take(4));
  w.status = reinterpret_cast<int32_t*>(take(4));
  w.pairs = reinterpret_cast<int32_t*>(take(P * 4));
  w.act = reinterpret_cast<__nv_bfloat16*>(take(P * size_t(s.I) * 2));
  w.y = reinterpret_cast<__nv_bfloat16*>(take(P * size_t(s.H) * 2));
  if (cub_bytes > 0) {
    w.sort_keys_in = reinterpret_cast<int32_t*>(take(P * 4));
    w.sort_keys_out = reinterpret_cast<int32_t*>(take(P * 4));
    w.sort_vals_in = reinterpret_cast<int32_t*>(take(P * 4));
    w.cub_temp = take(cub_bytes);
    w.cub_temp_bytes = cub_bytes;
  }
  w.max_tiles = max_tiles;
  w.tile_rows = bm;
  w.capacity = s.capacity;
  if (ws) *ws = w;
  return off;
}

// ---- combine ----------------------------------------------------------------------------------------
constexpr int kCombineThreads = 256;

/// sigmoid of the block's sum of the threads' partial dot products `d` (the shared expert's gate
/// logit): a warp butterfly, then the warp sums added in warp order. Every thread of the block calls it
/// and gets the same value.
__device__ __forceinline__ float shared_gate_sigmoid(float d) {
  __shared__ float s_part[kCombineThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
  if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = d;
  __syncthreads();
  float tot = 0.0f;
#pragma unroll
  for (int i = 0; i < kCombineThreads / 32; ++i) tot += s_part[i];
  return 1.0f / (1.0f + expf(-tot));
}

__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const float* __restrict__ weights, const __nv_bfloat16* __restrict__ y,
                       const __nv_bfloat16* __restrict__ shared_out, const __nv_bfloat16* __restrict__ shared_gate_w,
                       const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* residual,
                       const int32_t* __restrict__ num_rows, int capacity, int k, int H, __nv_bfloat16* out) {
  pdl_begin();
  const int t = blockIdx.x;
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  if (t >= live) return;

  float sgate = 1.0f;
  if (shared_out != nullptr && shared_gate_w != nullptr) {
    float d = 0.0f;
    for (int h = threadIdx.x * 8; h < H; h += kCombineThreads * 8) {
      const uint4 xv = *reinterpret_cast<const uint4*>(x + int64_t(t) * H + h);
      const uint4 wv = *reinterpret_cast<const uint4*>(shared_gate_w + h);
      const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
      const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 a = __bfloat1622float2(xp[q]), b = __bfloat1622float2(wp[q]);
        d = fmaf(a.x, b.x, d);
        d = fmaf(a.y, b.y, d);
      }
    }
    sgate = shared_gate_sigmoid(d);
  }

  for (int h = threadIdx.x * 8; h < H; h += kCombineThreads * 8) {
    float acc[8];
    if (residual != nullptr) {
      const uint4 rv = *reinterpret_cast<const uint4*>(residual + int64_t(t) * H + h);
      const __nv_bfloat162* rp = reinterpret_cast<const __nv_bfloat162*>(&rv);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(rp[q]);
        acc[2 * q] = f.x;
        acc[2 * q + 1] = f.y;
      }
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] = 0.0f;
    }
    for (int s = 0; s < k; ++s) {
      const float w = weights[int64_t(t) * k + s];
      const uint4 yv = *reinterpret_cast<const uint4*>(y + (int64_t(t) * k + s) * H + h);
      const __nv_bfloat162* yp = reinterpret_cast<const __nv_bfloat162*>(&yv);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(yp[q]);
        acc[2 * q] += w * f.x;
        acc[2 * q + 1] += w * f.y;
      }
    }
    if (shared_out != nullptr) {
      const uint4 sv = *reinterpret_cast<const uint4*>(shared_out + int64_t(t) * H + h);
      const __nv_bfloat162* sp = reinterpret_cast<const __nv_bfloat162*>(&sv);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(sp[q]);
        acc[2 * q] += sgate * f.x;
        acc[2 * q + 1] += sgate * f.y;
      }
    }
    uint4 ov;
    __nv_bfloat162* op = reinterpret_cast<__nv_bfloat162*>(&ov);
#pragma unroll
    for (int q = 0; q < 4; ++q) op[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
    *reinterpret_cast<uint4*>(out + int64_t(t) * H + h) = ov;
  }
}

// moe_combine_kernel's function and bytes in one memory pass when every row is one chunk a thread
// (H <= 8 * kCombineThreads) and k <= KMAX: the weights, the k y chunks, residual, shared_out and the
// gate's x / w chunks are all loaded first (independent loads in flight together), then the shared gate's
// reduction (the same per-thread fma chain, butterfly and warp-order sum), then the same fp32 sums in slot
// order. The previous kernel waited for the reduction before its element loads and for each slot's y in
// turn (a runtime-k loop).
// kNorm: the epilogue also writes the next layer's input norm of the rounded row (NormEpi), with
// rms_norm_kernel's thread layout and reduction (row_norm.cuh): thread j holds elements [8j, 8j + 8) as
// there when H / 8 vectors give row_geom(H, 8) = {tpr <= kCombineThreads, k = 1}, the host's condition.
// x may alias norm.x: every thread's x loads are consumed before the gate's barrier, the norm's stores
// come after the norm's barrier.
struct NormEpi {
  const __nv_bfloat16* w = nullptr;
  __nv_bfloat16* x = nullptr;
  float eps = 0.0f;
  int tpr = 0;
  bool zero_centred = false;
};

template <int KMAX, bool kNorm>
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_onepass_kernel(const float* __restrict__ weights, const __nv_bfloat16* __restrict__ y,
                               const __nv_bfloat16* __restrict__ shared_out,
                               const __nv_bfloat16* __restrict__ shared_gate_w, const __nv_bfloat16* x,
                               const __nv_bfloat16* residual, const int32_t* __restrict__ num_rows, int capacity,
                               int k, int H, __nv_bfloat16* out, NormEpi norm) {
  pdl_begin();
  const int t = blockIdx.x;
  int live = *num_rows;
  live = live < 0 ? 0 : (live > capacity ? capacity : live);
  if (t >= live) return;
  const int h = threadIdx.x * 8;
  const bool mine = h < H;
  const bool gated = shared_out != nullptr && shared_gate_w != nullptr;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float w[KMAX];
  uint4 yv[KMAX];
#pragma unroll
  for (int s = 0; s < KMAX; ++s) {
    const bool on = s < k;
    w[s] = on ? weights[int64_t(t) * k + s] : 0.0f;
    yv[s] = on && mine ? *reinterpret_cast<const uint4*>(y + (int64_t(t) * k + s) * H + h) : zero;
  }
  const uint4 rv = residual != nullptr && mine ? *reinterpret_cast<const uint4*>(residual + int64_t(t) * H + h) : zero;
  const uint4 sv = shared_out != nullptr && mine ? *reinterpret_cast<const uint4*>(shared_out + int64_t(t) * H + h) : zero;
  const uint4 xv = gated && mine ? *reinterpret_cast<const uint4*>(x + int64_t(t) * H + h) : zero;
  const uint4 gv = gated && mine ? *reinterpret_cast<const uint4*>(shared_gate_w + h) : zero;

  float sgate = 1.0f;
  if (gated) {
    float d = 0.0f;
    if (mine) {
      const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
      const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&gv);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 a = __bfloat1622float2(xp[q]), b = __bfloat1622float2(wp[q]);
        d = fmaf(a.x, b.x, d);
        d = fmaf(a.y, b.y, d);
      }
    }
    sgate = shared_gate_sigmoid(d);
  }
  if constexpr (!kNorm) {
    if (!mine) return;
  }
  float acc[8];
  {
    const __nv_bfloat162* rp = reinterpret_cast<const __nv_bfloat162*>(&rv);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = residual != nullptr ? __bfloat1622float2(rp[q]) : make_float2(0.0f, 0.0f);
      acc[2 * q] = f.x;
      acc[2 * q + 1] = f.y;
    }
  }
#pragma unroll
  for (int s = 0; s < KMAX; ++s) {
    if (s >= k) break;
    const __nv_bfloat162* yp = reinterpret_cast<const __nv_bfloat162*>(&yv[s]);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = __bfloat1622float2(yp[q]);
      acc[2 * q] += w[s] * f.x;
      acc[2 * q + 1] += w[s] * f.y;
    }
  }
  if (shared_out != nullptr) {
    const __nv_bfloat162* sp = reinterpret_cast<const __nv_bfloat162*>(&sv);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = __bfloat1622float2(sp[q]);
      acc[2 * q] += sgate * f.x;
      acc[2 * q + 1] += sgate * f.y;
    }
  }
  uint4 ov;
  __nv_bfloat162* op = reinterpret_cast<__nv_bfloat162*>(&ov);
#pragma unroll
  for (int q = 0; q < 4; ++q) op[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
  if (mine) *reinterpret_cast<uint4*>(out + int64_t(t) * H + h) = ov;
  if constexpr (kNorm) {
    __shared__ float red[32];
    float f[8], g[8], ss = 0.0f;
    if (mine) {
      detail::load_bf16<8>(norm.w + h, g);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 v = __bfloat1622float2(op[q]);
        f[2 * q] = v.x;
        f[2 * q + 1] = v.y;
      }
      ss = detail::add_squares<8>(ss, f);
    }
    ss = detail::row_sum(ss, norm.tpr, red);
    if (!mine) return;
    const float inv = rsqrtf(ss / float(H) + norm.eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = f[e] * inv * (norm.zero_centred ? 1.0f + g[e] : g[e]);
    detail::store_bf16<8>(norm.x + int64_t(t) * H + h, f);
  }
}
constexpr int kCombineOnePassMaxK = 8;

bool g_combine_fast = [] {
  const char* v = std::getenv("MOEFOLD_MOE_COMBINE");
  return !(v && std::string_view(v) == "old");
}();

}  // namespace

namespace moe_detail {
void set_combine_fast(bool on) { g_combine_fast = on; }
bool combine_fast() { return g_combine_fast; }
}  // namespace moe_detail

size_t moe_workspace_bytes(const MoeShape& shape) {
  check_shape(shape);
  return layout(shape, nullptr, nullptr);
}

MoeWorkspace moe_workspace_bind(void* base, size_t bytes, const MoeShape& shape) {
  check_shape(shape);
  MOEFOLD_CHECK(base != nullptr && (reinterpret_cast<uintptr_t>(base) & 255) == 0,
                fmt::runtime("moe_workspace_bind: base must be a 256-byte aligned device pointer"));
  MoeWorkspace ws;
  const size_t need = layout(shape, static_cast<char*>(base), &ws);
  MOEFOLD_CHECK(bytes >= need, fmt::runtime("moe_workspace_bind: {} bytes given, {} needed"), bytes, need);
  return ws;
}

namespace {
// The plan the moe_plan call wrote into `ws`, as both expert GEMMs read it.
GemmParams plan_params(const MoeWorkspace& ws) {
  GemmParams p;
  p.pairs = ws.pairs;
  p.tiles = ws.tiles;
  p.num_tiles = ws.num_tiles;
  p.offsets = ws.offsets;
  return p;
}
// Worst-case plan tiles of the GEMV path at this step's capacity (8 pairs a tile).
int gemv_max_tiles(const MoeShape& s, const MoeWorkspace& ws) {
  return std::min(ws.max_tiles, moe_detail::max_row_tiles(s, moe_detail::expert_tile_rows(kMoeExpertGemv)));
}
}  // namespace

int moe_expert_config(const MoeShape& shape) {
  check_shape(shape);
  return moe_detail::expert_config(shape);
}

void moe_expert_gate_up(const __nv_bfloat16* x, const __nv_bfloat16* gate_up, const MoeShape& s,
                        const MoeWorkspace& ws, cudaStream_t stream) {
  check_shape(s);
  GemmParams p = plan_params(ws);
  p.A = x;
  p.B = gate_up;
  p.C = ws.act;
  p.K = s.H;
  p.N = s.I;
  p.ldc = s.I;
  p.topk = s.k;
  p.b_expert_stride = int64_t(2) * s.I * s.H;
  p.b_up_offset = s.I;
  const int cfg = moe_detail::expert_config(s);
  LaunchScope launch(wgmma_selected(s, cfg) ? kExpertGemmWgmma[0] : kExpertGemm[0][cfg], stream,
                     [&] { return expert_work_bound(true, s); });
  set_expert_work(launch, true, s, ws);
  if (cfg == kMoeExpertGemv)
    moe_detail::launch_gemv_gate_up(x, gate_up, moe_detail::plan_view(ws), s.k, s.H, s.I, gemv_max_tiles(s, ws), ws.act, stream);
  else
    dispatch_expert_gemm<GemmMode::kExpertGateUp>(p, s, ws, s.I, stream);
}

void moe_expert_down(const __nv_bfloat16* down, const MoeShape& s, const MoeWorkspace& ws, cudaStream_t stream) {
  check_shape(s);
  GemmParams p = plan_params(ws);
  p.A = ws.act;
  p.B = down;
  p.C = ws.y;
  p.K = s.I;
  p.N = s.H;
  p.ldc = s.H;
  p.topk = s.k;
  p.b_expert_stride = int64_t(s.H) * s.I;
  const int cfg = moe_detail::expert_config(s);
  LaunchScope launch(wgmma_selected(s, cfg) ? kExpertGemmWgmma[1] : kExpertGemm[1][cfg], stream,
                     [&] { return expert_work_bound(false, s); });
  set_expert_work(launch, false, s, ws);
  if (cfg == kMoeExpertGemv)
    moe_detail::launch_gemv_down(ws.act, down, moe_detail::plan_view(ws), s.H, s.I, gemv_max_tiles(s, ws), ws.y, stream);
  else
    dispatch_expert_gemm<GemmMode::kExpertDown>(p, s, ws, s.H, stream);
}

namespace {
// One pass up to 8192 rows: at 32k rows the H200 measured it 4% slower than the two-pass kernel (same bytes).
bool combine_onepass(const MoeShape& s) {
  return g_combine_fast && s.k <= kCombineOnePassMaxK && s.H <= 8 * kCombineThreads && s.capacity <= 8192;
}

bool g_combine_norm = [] {
  const char* v = std::getenv("MOEFOLD_FUSE_COMBINE_NORM");
  return !(v && std::string_view(v) == "0");
}();

}  // namespace

namespace moe_detail {
void set_combine_norm_fused(bool on) { g_combine_norm = on; }
}  // namespace moe_detail

bool moe_combine_norm_fused(const MoeShape& s, const __nv_bfloat16* out, const MoeNextNorm& next) {
  if (!g_combine_norm || !combine_onepass(s)) return false;
  if (detail::vec_width(s.H, {out, next.x, next.w}, {}) != 8) return false;
  const detail::RowGeom g = detail::row_geom(s.H, 8);
  return g.k == 1 && g.tpr <= kCombineThreads;
}

void moe_combine(const float* weights, const MoeWorkspace& ws, const __nv_bfloat16* shared_out,
                 const __nv_bfloat16* shared_gate_w, const __nv_bfloat16* x, const __nv_bfloat16* residual,
                 const int32_t* num_rows, const MoeShape& s, __nv_bfloat16* out, cudaStream_t stream,
                 const MoeNextNorm* next) {
  check_shape(s);
  MOEFOLD_CHECK(!(shared_out && shared_gate_w) || x != nullptr, fmt::runtime("moe_combine: the shared gate needs x"));
  MOEFOLD_CHECK(next == nullptr || (next->w != nullptr && next->x != nullptr),
                fmt::runtime("moe_combine: the next norm needs its weight and output"));
  const bool onepass = combine_onepass(s);
  const bool fused = next != nullptr && moe_combine_norm_fused(s, out, *next);
  // y of k pairs, weights, shared out, x, residual read; out written
  {
    // y of k pairs, weights, shared out, x, residual read; out written (and the norm's x and w)
    LaunchScope launch(fused ? kCombineNorm : onepass ? kCombineOnePass : kCombine, stream, [&] {
      const double T = double(work_rows(s.capacity, num_rows)), H = s.H;
      const double rows = T * s.k * H * 2 + T * s.k * 4 + (shared_out ? T * H * 2 : 0) +
                          (shared_gate_w ? T * H * 2 + H * 2 : 0) + (residual ? T * H * 2 : 0) + T * H * 2 +
                          (fused ? T * H * 2 + H * 2 : 0);
      return prof::Work{rows, 0};
    });
    if (fused) {
      const NormEpi epi{next->w, next->x, next->eps, detail::row_geom(s.H, 8).tpr, next->zero_centred};
      launch_pdl(moe_combine_onepass_kernel<kCombineOnePassMaxK, true>, dim3(s.capacity), dim3(kCombineThreads), 0,
                 stream, weights, ws.y, shared_out, shared_gate_w, x, residual, num_rows, s.capacity, s.k, s.H, out,
                 epi);
    } else if (onepass) {
      launch_pdl(moe_combine_onepass_kernel<kCombineOnePassMaxK, false>, dim3(s.capacity), dim3(kCombineThreads), 0,
                 stream, weights, ws.y, shared_out, shared_gate_w, x, residual, num_rows, s.capacity, s.k, s.H, out,
                 NormEpi{});
    } else {
      launch_pdl(moe_combine_kernel, dim3(s.capacity), dim3(kCombineThreads), 0, stream, weights, ws.y, shared_out,
                 shared_gate_w, x, residual, num_rows, s.capacity, s.k, s.H, out);
    }
    MOEFOLD_CUDA_CHECK_LAUNCH();
  }
  if (next != nullptr && !fused)
    rms_norm(out, next->w, next->x, s.capacity, s.H, next->eps,
             next->zero_centred ? NormKind::ZeroCentred : NormKind::Plain, num_rows, stream);
}

void moe_forward(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const __nv_bfloat16* gate_up,
                 const __nv_bfloat16* down, const __nv_bfloat16* shared_out, const __nv_bfloat16* shared_gate_w,
                 const __nv_bfloat16* residual, const int32_t* num_rows, const MoeShape& shape, bool renormalize,
                 const MoeWorkspace& ws, __nv_bfloat16* out, cudaStream_t stream, const int32_t* replay,
                 const MoeNextNorm* next) {
  MOEFOLD_CHECK(shape.capacity <= ws.capacity, fmt::runtime("moe_forward: step capacity {} exceeds the workspace's {}"),
                shape.capacity, ws.capacity);
  moe_router_route(x, w_router, num_rows, shape, renormalize, ws, stream, replay);
  moe_expert_gate_up(x, gate_up, shape, ws, stream);
  moe_expert_down(down, shape, ws, stream);
  moe_combine(ws.weights, ws, shared_out, shared_gate_w, x, residual, num_rows, shape, out, stream, next);
}

}  // namespace moefold::cuda
