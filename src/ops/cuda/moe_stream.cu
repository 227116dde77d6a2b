// MoE experts at decode sizes on tensor cores, streaming the weights (MoeShape::expert_tiles =
// kMoeExpertStream): the same function as the tile kernels of moe_gemm.cuh, with the same bits.
//
// Why: the 16-row tiles give a CTA 64 weight rows, so one token (8 experts) makes only 128 gate_up CTAs,
// each with 24 KB of loads in flight: latency-bound at ~40% of HBM bandwidth. Here the unit of work is an
// item = (plan tile of <= 8 pairs of one expert, group of 16 weight rows): gate_up gate rows 8g .. 8g+7
// with the matching up rows I + 8g .. (8 act columns), down rows 16g .. 16g+15 of H. Each warp owns a
// private cp.async ring (stages of 8 x 64 A + 16 x 64 B bf16, swizzled as in moe_gemm.cuh; gate_up 16
// stages deep: 30 KB of weights in flight a warp, the loads with a 256-byte L2 prefetch) and walks its
// items (items w, w + all warps, ..., w counted round the CTAs first) as ONE flattened sequence of
// 64-column K steps, so the ring keeps prefetching across item boundaries; warps never wait for each
// other (no __syncthreads). The mma's A rows 8..15 read a zero row. The grid is the device's resident
// CTAs (capped by the capacity's worst-case items), the item count is read from the plan in device
// memory (num_tiles), so padding rows and experts with no pairs cost nothing and a graph captured at a
// bucket replays with any live count.
//
// Bits: every output element is the fp32 accumulation, from 0, of mma.sync m16n8k16 products over K in
// increasing 16-column steps, A = the pair's activation row, B = the weight row, exactly the per-element
// sequence of moe_gemm_kernel (every tile size); gate_up rounds silu(g) * u once to bf16 (silu_f32), down
// rounds the sum once. So this kernel, the 16/64/128-row tiles and any capacity give a pair the same bits
// (batch invariance across all capacities, MoeChain.TileConfigsBitIdentical).
#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"

namespace moefold::cuda::moe_detail {
namespace {

using bf16 = __nv_bfloat16;
using namespace ptx;

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kArows = 8;                  // A rows of a stage: the pairs of a plan tile (<= 8)
constexpr int kBrows = 16;                 // B rows (weights) of an item
constexpr int kBK = 64;                    // K columns of a step (128 bytes a row)
constexpr int kAElems = kArows * kBK, kBElems = kBrows * kBK;
constexpr int kStageElems = kAElems + kBElems;  // 3 KB a stage
static_assert(kArows == expert_tile_rows(kMoeExpertStream), "the plan's tiles are the stream kernel's");

/// Ring depths (stages a warp) of one variant: 0 = deep (gate_up 16 stages: 30 KB of weights in flight a
/// warp, 192 KB a CTA; down 8), 1 = co-resident (gate_up 12, down 6: one CTA of each fits on an SM, so
/// the early-started down streams while gate_up runs).
template <GemmMode MODE, int V>
constexpr int stages() {
  return MODE == GemmMode::kExpertGateUp ? (V == 0 ? 16 : 12) : (V == 0 ? 8 : 6);
}
template <GemmMode MODE, int V>
constexpr size_t smem_bytes() {
  return size_t(kWarps) * (size_t(stages<MODE, V>()) * kStageElems + 8) * sizeof(bf16);  // + 16 zero bytes a warp
}
static_assert(smem_bytes<GemmMode::kExpertGateUp, 1>() + smem_bytes<GemmMode::kExpertDown, 1>() + 2048 <= 228 * 1024);
static_assert(smem_bytes<GemmMode::kExpertGateUp, 0>() <= 227 * 1024);

int g_variant = [] {
  const char* v = std::getenv("MOEFOLD_MOE_STREAM_VARIANT");
  return v ? std::atoi(v) & 3 : 0;
}();

/// cp.async of 16 bytes through L2 only, with (kPf) a 256-byte L2 prefetch of the line's neighbourhood:
/// the next K steps of the same weight row then hit in L2.
template <bool kPf>
__device__ __forceinline__ void cp_async16_b(void* dst, const void* src) {
  if constexpr (kPf)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
  else
    cp_async16(dst, src);
}

// kEarly (down only): the weights do not depend on the previous kernel (gate_up) and the plan was
// written by the kernel before it (complete once gate_up's blocks passed their own griddepcontrol.wait,
// which precedes the launch of this grid), so the first item's weight steps are issued (plan read
// through L2 with ld.cg) BEFORE waiting for gate_up; its act rows after.
template <GemmMode MODE, int V, bool kEarly, bool kPf>
__global__ void __launch_bounds__(kThreads, 1) moe_stream_kernel(const GemmParams p, int groups) {
  static_assert(!kEarly || MODE == GemmMode::kExpertDown, "only down may start before its predecessor ends");
  constexpr int kStages = stages<MODE, V>();
  if constexpr (!kEarly) pdl_begin();
  constexpr bool kSwiglu = MODE == GemmMode::kExpertGateUp;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  bf16* ring = reinterpret_cast<bf16*>(smem_raw) + size_t(warp) * (size_t(kStages) * kStageElems + 8);
  bf16* zero = ring + kStages * kStageElems;  // 16 zero bytes: A rows 8..15 of every mma
  if (lane == 0) *reinterpret_cast<uint4*>(zero) = make_uint4(0, 0, 0, 0);
  __syncwarp();

  const int total = __ldcg(p.num_tiles) * groups;
  // Items go round the CTAs first (item i to CTA i % grid), so a few items still spread over all SMs.
  const int w0 = warp * gridDim.x + blockIdx.x, nw = gridDim.x * kWarps;
  if (w0 >= total) return;  // warps are independent: no block-wide barrier below
  const int K = p.K, KT = K / kBK;
  const int steps = ((total - w0 + nw - 1) / nw) * KT;

  // Chunks a lane copies per stage: rows (lane >> 3) + 4 q, 16-byte chunk lane & 7 (B: q = 0..3; A: 0, 1).
  const int ch = lane & 7;
  // ---- producer: the item being loaded ----
  int p_item = w0, p_kt = 0;
  const bf16* a_src[2];
  bool a_ok[2];
  const bf16* b_src[4];
  auto producer_item = [&](int item) {
    const int t = item / groups, g = item - t * groups;
    const int2 tile = __ldcg(p.tiles + t);
    const bf16* bexp = p.B + int64_t(tile.x) * p.b_expert_stride;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int r = (lane >> 3) + 4 * q;
      const int grow = kSwiglu ? (r < 8 ? 8 * g + r : p.b_up_offset + 8 * g + (r - 8)) : kBrows * g + r;
      b_src[q] = bexp + int64_t(grow) * K + ch * 8;
    }
    const int j0 = __ldcg(p.offsets + tile.x) + tile.y;
    const int n = min(kArows, __ldcg(p.offsets + tile.x + 1) - j0);
    int arow = -1;
    if (lane < n) arow = kSwiglu ? __ldcg(p.pairs + j0 + lane) / p.topk : j0 + lane;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int ar = __shfl_sync(0xffffffffu, arow, (lane >> 3) + 4 * q);
      a_ok[q] = ar >= 0;
      a_src[q] = p.A + (ar >= 0 ? int64_t(ar) * K : 0) + ch * 8;
    }
  };
  auto issue_b = [&](int slot, int kt) {
    bf16* b_dst = ring + slot * kStageElems + kAElems;
#pragma unroll
    for (int q = 0; q < 4; ++q) cp_async16_b<kPf>(b_dst + swz((lane >> 3) + 4 * q, ch), b_src[q] + kt * kBK);
  };
  auto issue_a = [&](int slot, int kt) {
    bf16* a_dst = ring + slot * kStageElems;
#pragma unroll
    for (int q = 0; q < 2; ++q)
      cp_async16(a_dst + swz((lane >> 3) + 4 * q, ch), a_ok[q] ? a_src[q] + kt * kBK : p.A, a_ok[q]);
  };
  auto advance = [&] {
    if (++p_kt == KT) {
      p_kt = 0;
      p_item += nw;
      if (p_item < total) producer_item(p_item);
    }
  };
  auto issue = [&](int slot) {
    issue_b(slot, p_kt);
    issue_a(slot, p_kt);
    advance();
  };

  // ---- consumer: the item being computed ----
  int c_item = w0, c_kt = 0, c_g = 0, c_orow = -1;  // output row of tile row lane >> 2 (rows 8..15 are zero)
  float acc[2][4];

  producer_item(w0);
  // Steps issued so far. Invariant: at the top of iteration `step`, issued <= step + kStages - 1 and the
  // group holding step `step` has at most kStages - 2 groups committed after it.
  int issued = 0;
  if constexpr (kEarly) {
    const int first = min(steps, min(kStages - 1, KT));  // steps of the first item only
    for (int s = 0; s < first; ++s) {
      issue_b(s, s);
      cp_async_commit();
    }
    pdl_begin();  // gate_up done: its act rows are visible
    for (int s = 0; s < first; ++s) issue_a(s, s);
    cp_async_commit();
    for (int s = 0; s < first; ++s) advance();
    cp_async_wait<0>();
    issued = first;
  } else {
    for (; issued < min(steps, kStages - 1); ++issued) {
      issue(issued);
      cp_async_commit();
    }
  }
  // ldmatrix row addresses of A: lanes 0-7 / 16-23 rows 0-7 (k 0-7 / 8-15), the others the zero row.
  const bool a_row_live = (lane & 8) == 0;
  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncwarp();
    if (issued < steps) {
      issue(issued % kStages);
      ++issued;
    }
    cp_async_commit();
    if (c_kt == 0) {  // a new item: its rows for the epilogue (used only at its end)
      const int t = c_item / groups;
      c_g = c_item - t * groups;
      const int2 tile = __ldcg(p.tiles + t);
      const int j0 = __ldcg(p.offsets + tile.x) + tile.y;
      const int n = min(kArows, __ldcg(p.offsets + tile.x + 1) - j0);
      const int r = lane >> 2;
      c_orow = r < n ? (kSwiglu ? j0 + r : p.pairs[j0 + r]) : -1;
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[f][q] = 0.0f;
    }
    const bf16* a_s = ring + (step % kStages) * kStageElems;
    const bf16* b_s = a_s + kAElems;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[4], t[4];
      ldmatrix_x4(af, a_row_live ? a_s + swz(lane & 7, ks * 2 + (lane >> 4)) : zero);
      ldmatrix_x4(t, b_s + swz((lane >> 4) * 8 + (lane & 7), ks * 2 + ((lane >> 3) & 1)));
      mma_bf16_16816(acc[0], af, t[0], t[1]);
      mma_bf16_16816(acc[1], af, t[2], t[3]);
    }
    if (++c_kt == KT) {  // epilogue of the item: tile rows 0..7 (accumulator halves 0, 1)
      const int lc = (lane & 3) * 2;
      auto* C = static_cast<bf16*>(p.C);
      if (c_orow >= 0) {
        if constexpr (kSwiglu) {
          const int col = 8 * c_g + lc;
          const float v0 = silu_f32(acc[0][0]) * acc[1][0];
          const float v1 = silu_f32(acc[0][1]) * acc[1][1];
          *reinterpret_cast<__nv_bfloat162*>(C + int64_t(c_orow) * p.ldc + col) = __floats2bfloat162_rn(v0, v1);
        } else {
#pragma unroll
          for (int f = 0; f < 2; ++f) {
            const int col = kBrows * c_g + 8 * f + lc;
            *reinterpret_cast<__nv_bfloat162*>(C + int64_t(c_orow) * p.ldc + col) =
                __floats2bfloat162_rn(acc[f][0], acc[f][1]);
          }
        }
      }
      c_kt = 0;
      c_item += nw;
    }
  }
  cp_async_wait<0>();
}

template <GemmMode MODE, int V, bool kEarly, bool kPf>
void launch(const GemmParams& p, int groups, int max_tiles, cudaStream_t stream) {
  auto kernel = moe_stream_kernel<MODE, V, kEarly, kPf>;
  constexpr size_t smem = smem_bytes<MODE, V>();
  static const int resident = [&] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int dev = 0, sms = 0, per_sm = 0;
    MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
    MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    MOEFOLD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    return std::max(1, sms * std::max(1, per_sm));
  }();
  const int64_t items = int64_t(max_tiles) * groups;
  if (items <= 0) return;
  const int grid = int(std::min<int64_t>((items + kWarps - 1) / kWarps, resident));
  launch_pdl(kernel, dim3(grid), dim3(kThreads), smem, stream, p, groups);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

template <GemmMode MODE, bool kEarly>
void launch_variant(const GemmParams& p, int groups, int max_tiles, cudaStream_t stream) {
  switch (g_variant) {
    case 0: launch<MODE, 0, kEarly, true>(p, groups, max_tiles, stream); break;
    case 1: launch<MODE, 1, kEarly, true>(p, groups, max_tiles, stream); break;
    case 2: launch<MODE, 0, kEarly, false>(p, groups, max_tiles, stream); break;
    default: launch<MODE, 1, kEarly, false>(p, groups, max_tiles, stream); break;
  }
}

bool g_early_down = [] {
  const char* v = std::getenv("MOEFOLD_MOE_EARLY_DOWN");
  return !(v && v[0] == '0' && v[1] == '\0');
}();

}  // namespace

void launch_stream_gate_up(const GemmParams& p, int max_tiles, cudaStream_t stream) {
  MOEFOLD_CHECK(p.N % 8 == 0 && p.K % kBK == 0, fmt::runtime("moe stream gate_up: unsupported I={} H={}"), p.N, p.K);
  launch_variant<GemmMode::kExpertGateUp, false>(p, p.N / 8, max_tiles, stream);
}

void launch_stream_down(const GemmParams& p, int max_tiles, cudaStream_t stream) {
  MOEFOLD_CHECK(p.N % kBrows == 0 && p.K % kBK == 0, fmt::runtime("moe stream down: unsupported H={} I={}"), p.N, p.K);
  if (g_early_down)
    launch_variant<GemmMode::kExpertDown, true>(p, p.N / kBrows, max_tiles, stream);
  else
    launch_variant<GemmMode::kExpertDown, false>(p, p.N / kBrows, max_tiles, stream);
}

void set_stream_early_down(bool on) { g_early_down = on; }
bool stream_early_down() { return g_early_down; }
void set_stream_variant(int v) { g_variant = v & 3; }
int stream_variant() { return g_variant; }

}  // namespace moefold::cuda::moe_detail
