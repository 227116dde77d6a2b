// MoE experts at decode sizes on tensor cores, streaming the weights (MoeShape::expert_tiles =
// kMoeExpertStream): the same function as the tile kernels of moe_gemm.cuh, with the same bits.
//
// Why: the 16-row tiles give a CTA 64 weight rows, so one token (8 experts) makes only 128 gate_up CTAs,
// each with 24 KB of loads in flight: latency-bound at ~40% of HBM bandwidth. Here the unit of work is an
// item = (plan tile of <= 16 pairs of one expert, group of 16 weight rows): gate_up gate rows 8g .. 8g+7
// with the matching up rows I + 8g .. (8 act columns), down rows 16g .. 16g+15 of H. Each warp owns a
// private cp.async ring (kStages x (16 x 64 A + 16 x 64 B) bf16, swizzled as in moe_gemm.cuh) and walks
// its items (items w, w + all warps, ..., w counted round the CTAs first) as ONE flattened sequence of
// 64-column K steps, so the ring keeps prefetching across item boundaries; warps never wait for each
// other (no __syncthreads). The
// grid is the device's resident CTAs (capped by the capacity's worst-case items), the item count is read
// from the plan in device memory (num_tiles), so padding rows and experts with no pairs cost nothing and
// a graph captured at a bucket replays with any live count.
//
// Used (moe_expert_config) with batch_invariant at step capacities <= kMoeStreamMaxRows (1): measured on
// the H200 it is 12% faster than the 16-row tiles at one token and slower from two tokens on, where the
// tiles keep more independent weight streams in flight (docs/benchmarks.md).
//
// Bits: every output element is the fp32 accumulation, from 0, of mma.sync m16n8k16 products over K in
// increasing 16-column steps, A = the pair's activation row, B = the weight row, exactly the per-element
// sequence of moe_gemm_kernel (every tile size); gate_up rounds silu(g) * u once to bf16 (silu_f32), down
// rounds the sum once. So this kernel, the 16/64/128-row tiles and any capacity give a pair the same bits
// (batch invariance across all capacities, MoeChain.TileConfigsBitIdentical).
//
// The shared expert as extra items (StreamShared, moe_forward_shared in moe_shared_stream.cu): when
// given, ceil(live / 16) tiles of the live token rows x the same 16-row groups follow the routed items
// (A = x rows / the shared act rows directly, B = the dense shared weights), so one launch of each
// kernel also runs the shared expert. Its items reproduce the dense chain of the other capacities
// (invariant GEMM gate_up, swiglu_kernel, invariant GEMM down) bit for bit: the K steps are cut into
// the invariant GEMM's S = decode_gemm_splits(N, K) contiguous splits (chunks [s KT / S, (s+1) KT / S)),
// each an mma.sync chain from 0 in ascending k (the same per-element sequence as decode_gemm_kernel's
// split), the partials folded in split order (total = p0, then total + p1, ...), no bias; gate_up rounds
// the gate and the up sums to bf16 each, then act = bf16(siluf_(g) * u) with swiglu_kernel's fp32
// formula (detail::siluf_); down rounds the folded sum once.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/l2_hint.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"

namespace moefold::cuda::moe_detail {
namespace {

using bf16 = __nv_bfloat16;
using namespace ptx;

constexpr int kRows = 16;                  // A rows (pairs of a plan tile) and B rows (weights) of an item
constexpr int kBK = 64;                    // K columns of a step (128 bytes a row)
constexpr int kTileElems = kRows * kBK;    // one operand of one stage
// Warps a CTA (kW) and ring depth per warp. Default (kW = 4): gate_up 8 stages (7 K steps = 14 KB of
// weights in flight; 128 KB a CTA), down 6 (96 KB a CTA), so that one CTA of each fits on an SM at once
// (228 KB): the down kernel, launched early by PDL, then streams its first weights while gate_up still
// runs (see kEarly below). Wide (kW = 5, MOEFOLD_MOE_STREAM_WIDE=1): gate_up 6 stages (120 KB), down 5
// (100 KB): 660 gate_up and 1320 down warps on 132 SMs, so the 35B shape's batch-1 items with the shared
// expert (576 gate_up, 1152 down) are one item a warp instead of two for some warps.
template <GemmMode MODE, int kW>
constexpr int stages() {
  if constexpr (kW == 4) return MODE == GemmMode::kExpertGateUp ? 8 : 6;
  return MODE == GemmMode::kExpertGateUp ? 6 : 5;
}
template <GemmMode MODE, int kW>
constexpr size_t smem_bytes() {
  return size_t(kW) * stages<MODE, kW>() * 2 * kTileElems * sizeof(bf16);
}
static_assert(smem_bytes<GemmMode::kExpertGateUp, 4>() + smem_bytes<GemmMode::kExpertDown, 4>() + 2048 <= 228 * 1024);
static_assert(smem_bytes<GemmMode::kExpertGateUp, 5>() + smem_bytes<GemmMode::kExpertDown, 5>() + 2048 <= 228 * 1024);
static_assert(kRows == expert_tile_rows(kMoeExpertStream), "the plan's tiles are the stream kernel's");

bool g_early_down = [] {
  const char* v = std::getenv("MOEFOLD_MOE_EARLY_DOWN");
  return !(v && v[0] == '0' && v[1] == '\0');
}();
// MOEFOLD_MOE_STREAM_WIDE: unset = the 5-warp configuration for launches with shared-expert items only (the
// H200 measured it 23% faster for the fused batch-1 layer and 3% slower for routed items alone), 1 = always,
// 0 = never; same bits in every case.
int wide_mode_from_env() {
  const char* v = std::getenv("MOEFOLD_MOE_STREAM_WIDE");
  if (!v || !*v) return -1;
  const std::string s(v);
  MOEFOLD_CHECK(s == "0" || s == "1", fmt::runtime("MOEFOLD_MOE_STREAM_WIDE={}: expected 0 or 1"), s);
  return s == "1" ? 1 : 0;
}
int g_wide = wide_mode_from_env();  // -1: with shared items only, 0: never, 1: always

// kEarly (down only): the weights do not depend on the previous kernel (gate_up) and the plan was
// written by the kernel before it (complete once gate_up's blocks passed their own griddepcontrol.wait,
// which precedes the launch of this grid), so the first item's weight steps are issued (plan read
// through L2 with ld.cg) BEFORE waiting for gate_up; its act rows after.
template <GemmMode MODE, bool kEarly, int kW>
__global__ void __launch_bounds__(kW * 32, 1) moe_stream_kernel(const GemmParams p, const StreamShared sh, int groups) {
  static_assert(!kEarly || MODE == GemmMode::kExpertDown, "only down may start before its predecessor ends");
  constexpr int kStages = stages<MODE, kW>();
  if constexpr (!kEarly) pdl_begin();
  constexpr bool kSwiglu = MODE == GemmMode::kExpertGateUp;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  bf16* sA = reinterpret_cast<bf16*>(smem_raw) + size_t(warp) * kStages * 2 * kTileElems;
  bf16* sB = sA + kStages * kTileElems;

  // Routed plan tiles, then (with the shared expert) ceil(live / 16) tiles of the live token rows.
  const int nt = __ldcg(p.num_tiles);
  int s_live = 0;
  if (sh.B != nullptr) s_live = min(max(__ldcg(sh.live), 0), sh.capacity);
  const int total = (nt + (s_live + kRows - 1) / kRows) * groups;
  // Items go round the CTAs first (item i to CTA i % grid), so a few items still spread over all SMs.
  const int w0 = warp * gridDim.x + blockIdx.x, nw = gridDim.x * kW;
  if (w0 >= total) return;  // warps are independent: no block-wide barrier below
  const int K = p.K, KT = K / kBK;
  const int steps = ((total - w0 + nw - 1) / nw) * KT;

  // The chunks a lane copies per stage: rows (lane >> 3) + 4 q, 16-byte chunk lane & 7, q = 0..3.
  const int ch = lane & 7;
  // ---- producer: the item being loaded ----
  int p_item = w0, p_kt = 0;
  const bf16* a_src[4];
  bool a_ok[4];
  const bf16* b_src[4];
  auto producer_item = [&](int item) {
    const int t = item / groups, g = item - t * groups;
    int arow = -1;
    const bf16 *abase, *bexp;
    int up_offset;
    if (t < nt) {  // routed: a plan tile of one expert
      const int2 tile = __ldcg(p.tiles + t);
      const int j0 = __ldcg(p.offsets + tile.x) + tile.y;
      const int n = min(kRows, __ldcg(p.offsets + tile.x + 1) - j0);
      if (lane < n) arow = kSwiglu ? p.pairs[j0 + lane] / p.topk : j0 + lane;
      abase = p.A;
      bexp = p.B + int64_t(tile.x) * p.b_expert_stride;
      up_offset = p.b_up_offset;
    } else {  // shared expert: token rows 16 (t - nt) ..
      const int r0 = kRows * (t - nt);
      if (r0 + lane < s_live) arow = r0 + lane;
      abase = sh.A;
      bexp = sh.B;
      up_offset = sh.up_offset;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int r = (lane >> 3) + 4 * q;
      const int ar = __shfl_sync(0xffffffffu, arow, r);
      a_ok[q] = ar >= 0;
      a_src[q] = abase + (ar >= 0 ? int64_t(ar) * K : 0) + ch * 8;
      const int grow = kSwiglu ? (r < 8 ? 8 * g + r : up_offset + 8 * g + (r - 8)) : kRows * g + r;
      b_src[q] = bexp + int64_t(grow) * K + ch * 8;
    }
  };
  const uint64_t b_policy = l2_policy(p.l2_hint >= 1);  // weights: read once a step
  auto issue_b = [&](int slot, int kt) {
    bf16* b_dst = sB + slot * kTileElems;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      cp_async16(b_dst + swz((lane >> 3) + 4 * q, ch), b_src[q] + kt * kBK, true, b_policy);
  };
  auto issue_a = [&](int slot, int kt) {
    bf16* a_dst = sA + slot * kTileElems;
#pragma unroll
    for (int q = 0; q < 4; ++q)
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
  int c_item = w0, c_kt = 0, c_g = 0;
  int c_orow[2] = {-1, -1};  // output rows of tile rows (lane >> 2) and (lane >> 2) + 8
  float acc[2][4];
  // Shared-expert items: the split being accumulated, its end (K steps), the folded partials.
  bool c_shared = false;
  int c_split = 0, c_split_end = KT;
  float tot[2][4];

  producer_item(w0);
  // Steps issued so far. Invariant: at the top of iteration `step`, issued <= step + kStages - 1 and the
  // group holding step `step` (if not already waited for) has exactly kStages - 2 groups committed after
  // it, so that cp.async.wait_group kStages - 2 covers it: the prologue commits kStages - 1 groups in
  // all, empty ones past the warp's last step (a warp of fewer steps, or a first item of K < kStages - 1
  // steps, would otherwise read a stage still in flight).
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
  }
  for (int s = issued; s < kStages - 1; ++s) {  // (kEarly: the rest of the prologue; its groups all landed)
    if (issued < steps) {
      issue(issued);
      ++issued;
    }
    cp_async_commit();
  }
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
      c_shared = t >= nt;
      if (!c_shared) {
        const int2 tile = p.tiles[t];
        const int c_j0 = p.offsets[tile.x] + tile.y;
        const int c_n = min(kRows, p.offsets[tile.x + 1] - c_j0);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = (lane >> 2) + 8 * h;
          c_orow[h] = r < c_n ? (kSwiglu ? c_j0 + r : p.pairs[c_j0 + r]) : -1;
        }
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = kRows * (t - nt) + (lane >> 2) + 8 * h;
          c_orow[h] = r < s_live ? r : -1;
        }
        c_split = 0;
        c_split_end = KT / sh.splits;
      }
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[f][q] = 0.0f;
    }
    const bf16* a_s = sA + (step % kStages) * kTileElems;
    const bf16* b_s = sB + (step % kStages) * kTileElems;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[4], t[4];
      ldmatrix_x4(af, a_s + swz(lane & 15, ks * 2 + (lane >> 4)));
      ldmatrix_x4(t, b_s + swz((lane >> 4) * 8 + (lane & 7), ks * 2 + ((lane >> 3) & 1)));
      mma_bf16_16816(acc[0], af, t[0], t[1]);
      mma_bf16_16816(acc[1], af, t[2], t[3]);
    }
    if (c_shared && c_kt + 1 == c_split_end) {  // the end of one of the invariant GEMM's K splits
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          tot[f][q] = c_split == 0 ? acc[f][q] : tot[f][q] + acc[f][q];
          acc[f][q] = 0.0f;
        }
      ++c_split;
      c_split_end = int((int64_t(c_split + 1) * KT) / sh.splits);
    }
    if (++c_kt == KT) {  // epilogue of the item
      const int lc = (lane & 3) * 2;
      auto* C = static_cast<bf16*>(c_shared ? static_cast<void*>(sh.C) : p.C);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int orow = c_orow[h];
        if (orow < 0) continue;
        if (c_shared) {  // the dense chain: the invariant GEMM's bf16 outputs (then swiglu_kernel's formula)
          if constexpr (kSwiglu) {
            const float g0 = __bfloat162float(__float2bfloat16_rn(tot[0][2 * h]));
            const float g1 = __bfloat162float(__float2bfloat16_rn(tot[0][2 * h + 1]));
            const float u0 = __bfloat162float(__float2bfloat16_rn(tot[1][2 * h]));
            const float u1 = __bfloat162float(__float2bfloat16_rn(tot[1][2 * h + 1]));
            *reinterpret_cast<__nv_bfloat162*>(C + int64_t(orow) * p.ldc + 8 * c_g + lc) =
                __floats2bfloat162_rn(detail::siluf_(g0) * u0, detail::siluf_(g1) * u1);
          } else {
#pragma unroll
            for (int f = 0; f < 2; ++f)
              *reinterpret_cast<__nv_bfloat162*>(C + int64_t(orow) * p.ldc + kRows * c_g + 8 * f + lc) =
                  __floats2bfloat162_rn(tot[f][2 * h], tot[f][2 * h + 1]);
          }
          continue;
        }
        if constexpr (kSwiglu) {
          const int col = 8 * c_g + lc;
          const float v0 = silu_f32(acc[0][2 * h]) * acc[1][2 * h];
          const float v1 = silu_f32(acc[0][2 * h + 1]) * acc[1][2 * h + 1];
          *reinterpret_cast<__nv_bfloat162*>(C + int64_t(orow) * p.ldc + col) = __floats2bfloat162_rn(v0, v1);
        } else {
#pragma unroll
          for (int f = 0; f < 2; ++f) {
            const int col = kRows * c_g + 8 * f + lc;
            *reinterpret_cast<__nv_bfloat162*>(C + int64_t(orow) * p.ldc + col) =
                __floats2bfloat162_rn(acc[f][2 * h], acc[f][2 * h + 1]);
          }
        }
      }
      c_kt = 0;
      c_item += nw;
    }
  }
  cp_async_wait<0>();
}

template <GemmMode MODE, bool kEarly, int kW>
void launch_cfg(const GemmParams& p, const StreamShared& sh, int groups, int max_tiles, cudaStream_t stream) {
  auto kernel = moe_stream_kernel<MODE, kEarly, kW>;
  constexpr int kThreads = kW * 32;
  constexpr size_t smem = smem_bytes<MODE, kW>();
  static const int resident = [&] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int dev = 0, sms = 0, per_sm = 0;
    MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
    MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    MOEFOLD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    return std::max(1, sms * std::max(1, per_sm));
  }();
  const int64_t shared_tiles = sh.B != nullptr ? (int64_t(sh.capacity) + kRows - 1) / kRows : 0;
  const int64_t items = (int64_t(max_tiles) + shared_tiles) * groups;
  if (items <= 0) return;
  const int grid = int(std::min<int64_t>((items + kW - 1) / kW, resident));
  GemmParams q = p;
  q.l2_hint = l2_stream_hint();
  launch_pdl(kernel, dim3(grid), dim3(kThreads), smem, stream, q, sh, groups);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

template <GemmMode MODE, bool kEarly>
void launch(const GemmParams& p, const StreamShared& sh, int groups, int max_tiles, cudaStream_t stream) {
  if (g_wide == 1 || (g_wide == -1 && sh.B != nullptr))
    launch_cfg<MODE, kEarly, 5>(p, sh, groups, max_tiles, stream);
  else
    launch_cfg<MODE, kEarly, 4>(p, sh, groups, max_tiles, stream);
}

}  // namespace

namespace {
void check_shared(const StreamShared& sh, int KT) {
  if (sh.B == nullptr) return;
  MOEFOLD_CHECK(sh.A != nullptr && sh.C != nullptr && sh.live != nullptr && sh.capacity >= 1 && sh.splits >= 1 &&
                    sh.splits <= KT,
                fmt::runtime("moe stream: bad shared-expert items (capacity={} splits={} of {} K steps)"), sh.capacity,
                sh.splits, KT);
}
}  // namespace

void launch_stream_gate_up(const GemmParams& p, int max_tiles, cudaStream_t stream, const StreamShared& shared) {
  MOEFOLD_CHECK(p.N % 8 == 0 && p.K % kBK == 0, fmt::runtime("moe stream gate_up: unsupported I={} H={}"), p.N, p.K);
  check_shared(shared, p.K / kBK);
  launch<GemmMode::kExpertGateUp, false>(p, shared, p.N / 8, max_tiles, stream);
}

void launch_stream_down(const GemmParams& p, int max_tiles, cudaStream_t stream, const StreamShared& shared) {
  MOEFOLD_CHECK(p.N % kRows == 0 && p.K % kBK == 0, fmt::runtime("moe stream down: unsupported H={} I={}"), p.N, p.K);
  check_shared(shared, p.K / kBK);
  if (g_early_down)
    launch<GemmMode::kExpertDown, true>(p, shared, p.N / kRows, max_tiles, stream);
  else
    launch<GemmMode::kExpertDown, false>(p, shared, p.N / kRows, max_tiles, stream);
}

void set_stream_early_down(bool on) { g_early_down = on; }
void set_stream_wide(bool on) { g_wide = on ? 1 : 0; }
void reset_stream_wide() { g_wide = wide_mode_from_env(); }
bool stream_wide() { return g_wide == 1; }
bool stream_early_down() { return g_early_down; }

}  // namespace moefold::cuda::moe_detail
