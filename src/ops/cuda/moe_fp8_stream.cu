// Routed FP8 experts of a one-token decode step (capacity 1) fed by the bulk copy engine
// (moe_fp8_stream_gate_up / _down, moe_fp8.h): the function and the bits of moe_fp8_mma_gate_up_kernel /
// moe_fp8_mma_down_kernel (moe_fp8.cu), with the weights streamed into shared memory instead of registers,
// and optionally the shared expert as extra items with the bits of its dense chain (fp8_gemv gate_up,
// swiglu_kernel, fp8_gemv down).
//
// A work item is one 16-row fragment pair of one expert: gate_up 16 act columns (16 gate rows and the 16
// matching up rows, each K = H bytes), down 16 rows of H (K = I bytes). A fragment's rows are contiguous
// in the checkpoint layout, so a producer warp fetches each with ONE `cp.async.bulk` (and one for its
// scale rows): a CTA asks for all of its items at once, up to its ring of S stages, at no register cost.
//
// CTA: 8 consumer warps + 1 producer warp, one CTA an SM (grid = min(items, SMs)); items b, b + grid, ..
// of the (tile, group) list: the plan's routed tiles (its live count read from device memory: padding
// costs nothing), then one tile of the token row for the shared expert when there is a live row.
// Consumers work in Q <= 8 / WK slots of WK warps (S a multiple of Q, so that every use of a stage is
// one slot's and a stage's mbarrier parities stay in step): warp wk of a slot takes the scale blocks kb = wk,
// wk + WK, .. of the slot's items, exactly as warp wk of the register-fed kernels' block, and the WK
// partial accumulators are added in warp order 0, 1, .. (fp8mma::block_reduce's order). Each lane reads
// its 32 bytes a row and block from shared memory in the K permutation of fp8_mma.cuh, and every mma
// chain, scale fma and rounding is theirs, so each output has the same bits. (Staged rows are K bytes
// apart, so the rows of a fragment share banks: padded rows need a copy per row, which measured slower.)
// Shared-expert items: gate and up rounded to bf16 as fp8_gemv stores them, then swiglu_kernel's
// bf16(siluf_(g) * u); down rounded once. fp8_gemv splits K into WKS = warps_along_k(K) classes (kb mod
// WKS; 8 warps) where the routed items use WK = warps_along_k(K, 4): a shared item's warp accumulates
// classes wk and wk + WK as separate chains, and the WKS partials are added in class order
// (moe_fp8_shared_fusable: WKS / WK <= 2).
// Down launches with kEarly: the weights and scales of its first S items are requested before
// griddepcontrol.wait (they do not depend on gate_up; the plan was complete when gate_up passed its
// own wait, and is read through L2), the act rows after it. Both kernels fit on an SM at once (gate_up
// <= 156 KB, down <= 70 KB of shared memory, the carve-out set to all shared memory), so down's weights
// stream while gate_up runs.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/l2_hint.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe_fp8.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"

namespace moefold::cuda {
namespace {

using bf16 = __nv_bfloat16;
using moe_detail::PlanView;

constexpr int kConsumers = 8;                    // consumer warps
constexpr int kThreads = (kConsumers + 1) * 32;  // + the producer warp
constexpr int kRows = 16;                        // weight rows of a fragment
constexpr int kMmaWarps = 4;                     // the register-fed kernels' block: their WK rule
constexpr int kTilePairs = 8;                    // the plan's GEMV tiles
constexpr int kMaxStages = 8;
constexpr uint32_t kBarBytes = 256;  // 2 * kMaxStages + 1 mbarriers
constexpr uint32_t kBudgetGateUp = 156 * 1024, kBudgetDown = 70 * 1024;

std::atomic<int64_t> g_launches{0};
bool g_stream = [] {
  const char* v = std::getenv("MOEFOLD_MOE_FP8_STREAM");
  return !(v && std::string_view(v) == "0");
}();

/// Shared-memory geometry of one kernel (host-computed; see the header).
struct Geom {
  int K = 0, KB = 0, WK = 1, Q = 1, S = 0, parts = 1;
  int WKS = 1;              // the shared expert's K classes (its dense chain's warps along K; a multiple of WK)
  uint32_t w_span = 0;      // parts * 16 rows of K bytes
  uint32_t s_bytes = 0;     // parts * 16 * KB fp32 scales
  uint32_t a_bytes = 0;     // down: the pair's act row (2 K); gate_up: 0
  uint32_t tx = 0;          // bytes an item's copies complete
  uint32_t stage = 0;       // bytes a stage (multiple of 128)
  uint32_t x_off = 0, red_off = 0, stage_off = 0;
  size_t smem = 0;
};

uint32_t round128(uint32_t v) { return (v + 127u) & ~127u; }

Geom geom(bool gate_up, const MoeShape& s) {
  Geom g;
  g.K = gate_up ? s.H : s.I;
  g.KB = (g.K + fp8mma::kBlockK - 1) / fp8mma::kBlockK;
  g.WK = fp8mma::warps_along_k(g.K, kMmaWarps);
  g.WKS = fp8mma::warps_along_k(g.K);  // fp8_gemv's 8-warp rule
  g.Q = kConsumers / g.WK;
  g.parts = gate_up ? 2 : 1;
  g.w_span = uint32_t(g.parts * kRows * g.K);
  g.s_bytes = uint32_t(g.parts * kRows * g.KB) * 4u;
  g.a_bytes = gate_up ? 0u : uint32_t(g.K) * 2u;
  g.tx = g.w_span + g.s_bytes + g.a_bytes;
  g.stage = round128(g.w_span + g.s_bytes + g.a_bytes);
  const uint32_t x_bytes = gate_up ? round128(uint32_t(s.H) * 2u) : 0u;
  // Partial sums an item's reduction gathers: sized for the shared items whether or not a launch has
  // them (one geometry per shape).
  const int classes = std::max(g.WK, g.WKS);
  const uint32_t red_bytes = classes > 1 ? round128(uint32_t(g.Q * (classes - 1) * 32 * g.parts * 4) * 4u) : 0u;
  g.x_off = kBarBytes;
  g.red_off = g.x_off + x_bytes;
  g.stage_off = g.red_off + red_bytes;
  const uint32_t budget = gate_up ? kBudgetGateUp : kBudgetDown;
  const uint32_t fixed = g.stage_off + 128u;  // + alignment slack of the dynamic base
  g.S = fixed < budget ? int(std::min<uint32_t>(kMaxStages, (budget - fixed) / g.stage)) : 0;
  // Stage j % S and parity (j / S) & 1 are right only if every use of a stage belongs to one slot (a
  // slot's try_wait on a stage two phases behind would pass at once), so S is made a multiple of Q:
  // the most slots that cost at most one stage (the 35B down: 7 stages of 4 slots -> 6 of 3).
  if (g.S > 0) {
    int q = std::min(g.Q, g.S);
    while (q > 1 && g.S % q > 1) --q;
    g.Q = q;
    g.S -= g.S % q;
  }
  g.smem = size_t(fixed) + size_t(g.S) * g.stage;
  return g;
}

struct Args {
  const bf16* a;       // gate_up: x [1, H]; down: act [pairs, I] in plan order
  const uint8_t* w;    // gate_up [E, 2I, H] / down [E, H, I] e4m3
  const float* scale;  // [rows, KB] fp32
  PlanView plan;
  bf16* out;           // gate_up: act [pairs, I]; down: y [pairs, H]
  // The shared expert (sw null: none): weights [2I, H] / [H, I] e4m3 and scales, its A row (gate_up: x;
  // down: its act row) and its output row (gate_up: act; down: shared_out); live: the step's live rows.
  const uint8_t* sw = nullptr;
  const float* sscale = nullptr;
  const bf16* sa = nullptr;
  bf16* sout = nullptr;
  const int32_t* live = nullptr;
  int H, I, groups;
  bool hint;           // weights and scales with an L2 evict_first policy
  Geom g;
};

__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

__device__ __forceinline__ uint4 lds128(const unsigned char* p) { return *reinterpret_cast<const uint4*>(p); }

struct Item {
  int expert, j0, n, grp;  // expert -1: the shared expert (token row 0)
};
__device__ __forceinline__ Item item_at(const Args& a, int item, int nt) {
  Item it;
  const int t = item / a.groups;
  it.grp = item - t * a.groups;
  if (t >= nt) {
    it.expert = -1;
    it.j0 = 0;
    it.n = 1;
    return it;
  }
  const int2 tile = __ldcg(a.plan.tiles + t);
  it.expert = tile.x;
  it.j0 = __ldcg(a.plan.offsets + tile.x) + tile.y;
  it.n = min(kTilePairs, __ldcg(a.plan.offsets + tile.x + 1) - it.j0);
  return it;
}

template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) moe_fp8_stream_kernel(const __grid_constant__ Args a) {
  constexpr bool kEarly = !kGateUp;
  constexpr int P = kGateUp ? 2 : 1;
  if constexpr (!kEarly) pdl_begin();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((128 - (ptx::smem_u32(smem_raw) & 127)) & 127);
  const uint32_t sb = ptx::smem_u32(base);
  const Geom& G = a.g;
  const int S = G.S, WK = G.WK, Q = G.Q, K = G.K, KB = G.KB;
  auto full = [&](int s) { return sb + uint32_t(s) * 8u; };
  auto empty = [&](int s) { return sb + uint32_t(kMaxStages + s) * 8u; };
  const uint32_t x_full = sb + uint32_t(2 * kMaxStages) * 8u;
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(full(s), 1);
      ptx::mbar_init(empty(s), uint32_t(WK));
    }
    ptx::mbar_init(x_full, 1);
    ptx::fence_mbar_init();
  }
  __syncthreads();
  // Routed plan tiles, then (with the shared expert and a live row) one tile of the token row.
  const int nt = __ldcg(a.plan.num_tiles);
  const bool shared = a.sw != nullptr && __ldcg(a.live) > 0;
  const int total = (nt + (shared ? 1 : 0)) * a.groups;
  const int b = int(blockIdx.x), nb = int(gridDim.x);
  const int mine = b < total ? (total - b + nb - 1) / nb : 0;  // this CTA's items: j -> b + j * nb
  if (mine == 0) {
    if constexpr (kEarly) pdl_begin();
    return;
  }

  if (warp == kConsumers) {  // ---- producer ----
    const uint64_t wpol = ptx::l2_policy(a.hint), apol = ptx::l2_policy(false);
    auto issue_w = [&](int j, int s) {  // weights and scales of item j into stage s
      const Item it = item_at(a, b + j * nb, nt);
      const uint32_t st = sb + G.stage_off + uint32_t(s) * G.stage;
      if (lane == 0) ptx::mbar_arrive_expect_tx(full(s), G.tx);
      __syncwarp();
      const int part = lane / kRows, r = lane % kRows;
      const int64_t e = it.expert < 0 ? 0 : it.expert;  // the shared weights are one expert's shape
      const int64_t row0 = kGateUp ? e * 2 * a.I + int64_t(part) * a.I + it.grp * kRows : e * a.H + it.grp * kRows;
      const uint8_t* w = it.expert < 0 ? a.sw : a.w;
      const float* sc = it.expert < 0 ? a.sscale : a.scale;
      if (part < P && r == 0) {  // the fragment's 16 contiguous weight rows, then their scale rows
        bulk_g2s(st + uint32_t(part * kRows * K), w + row0 * K, uint32_t(kRows * K), full(s), wpol);
        bulk_g2s(st + G.w_span + uint32_t(part * kRows * KB) * 4u, sc + row0 * KB, uint32_t(kRows * KB) * 4u, full(s),
                 wpol);
      }
      return it;
    };
    auto issue_a = [&](const Item& it, int s) {  // down: the pair's act row
      if (lane == 0) {
        const uint32_t st = sb + G.stage_off + uint32_t(s) * G.stage;
        const bf16* src = it.expert < 0 ? a.sa : a.a + int64_t(it.j0) * a.I;
        bulk_g2s(st + G.w_span + G.s_bytes, src, G.a_bytes, full(s), apol);
      }
    };
    const int pre = min(mine, S);
    if constexpr (kEarly) {
      Item first[kMaxStages];
#pragma unroll 1
      for (int j = 0; j < pre; ++j) first[j] = issue_w(j, j);
      pdl_begin();
#pragma unroll 1
      for (int j = 0; j < pre; ++j) issue_a(first[j], j);
    } else {
      if (lane == 0) {  // the token's x row (capacity 1: row 0)
        ptx::mbar_arrive_expect_tx(x_full, uint32_t(a.H) * 2u);
        bulk_g2s(sb + G.x_off, a.a, uint32_t(a.H) * 2u, x_full, apol);
      }
#pragma unroll 1
      for (int j = 0; j < pre; ++j) issue_w(j, j);
    }
#pragma unroll 1
    for (int j = pre; j < mine; ++j) {
      const int s = j % S;
      ptx::mbar_wait(empty(s), uint32_t((j / S - 1) & 1));
      const Item it = issue_w(j, s);
      if constexpr (!kGateUp) issue_a(it, s);
    }
    return;
  }

  // ---- consumers ----
  const int q = warp / WK, wk = warp % WK;
  if (q >= Q) return;
  if constexpr (kGateUp) ptx::mbar_wait(x_full, 0);
  const int g = lane >> 2, t = lane & 3;
  const int CL = max(WK, G.WKS);  // class slots of red a slot owns
  float* red = reinterpret_cast<float*>(base + G.red_off) + size_t(q) * (CL - 1) * 32 * P * 4;
#pragma unroll 1
  for (int j = q; j < mine; j += Q) {
    const int s = j % S;
    const Item it = item_at(a, b + j * nb, nt);
    ptx::mbar_wait(full(s), uint32_t((j / S) & 1));
    const unsigned char* st = base + G.stage_off + size_t(s) * G.stage;
    const float* scl = reinterpret_cast<const float*>(st + G.w_span);
    const unsigned char* xs = kGateUp ? base + G.x_off : st + G.w_span + G.s_bytes;
    // K classes (kb mod WKI): the routed kernels' WK, or the shared expert's dense chain's WKS; this
    // warp accumulates classes wk, wk + WK, .. (R of them), each its own chain in ascending kb.
    const int WKI = it.expert < 0 ? G.WKS : WK, R = WKI / WK;
    float accr[2][P][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) accr[r][p][i] = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll 1
    for (int kb = wk + r * WK; r < R && kb < KB; kb += WKI) {
      float (&acc)[P][4] = accr[r];
      const int k0 = kb * fp8mma::kBlockK + t * 32;
      uint4 v[P][2][2], xa[4];
      float sc[P][2];
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = p * kRows + g + 8 * h;
#pragma unroll
          for (int c = 0; c < 2; ++c)
            v[p][h][c] = k0 + 16 * c < K ? lds128(st + size_t(row) * K + k0 + 16 * c) : make_uint4(0, 0, 0, 0);
          sc[p][h] = scl[row * KB + kb];
        }
#pragma unroll
      for (int c = 0; c < 4; ++c)
        xa[c] = g < it.n && k0 + 8 * c < K ? lds128(xs + size_t(k0 + 8 * c) * 2) : make_uint4(0, 0, 0, 0);
      float pp[P][4];
      fp8mma::block_partials<P>(v, xa, pp);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        acc[p][0] = fmaf(pp[p][0], sc[p][0], acc[p][0]);
        acc[p][1] = fmaf(pp[p][1], sc[p][0], acc[p][1]);
        acc[p][2] = fmaf(pp[p][2], sc[p][1], acc[p][2]);
        acc[p][3] = fmaf(pp[p][3], sc[p][1], acc[p][3]);
      }
    }
    }
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(empty(s));  // this warp's reads of stage s are done
    float (&acc)[P][4] = accr[0];
    if (WKI > 1) {  // the WKI class partials, added in class order 0, 1, .. (fp8mma::block_reduce's)
      ptx::named_sync(1 + q, WK * 32);  // red free: the previous item's sums are read
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int c = wk + r * WK;
        if (r < R && c > 0)
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[(size_t((c - 1) * P + p) * 4 + i) * 32 + lane] = accr[r][p][i];
      }
      ptx::named_sync(1 + q, WK * 32);
      if (wk == 0)
        for (int c = 1; c < WKI; ++c)
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[p][i] += red[(size_t((c - 1) * P + p) * 4 + i) * 32 + lane];
    }
    // Token 0 of the fragment: C elements 0 (row g) and 2 (row g + 8). At capacity 1 every pair of a tile
    // is the one token's (n > 1 only for repeated ids in a replay): the same A row, so the same bits in
    // each pair's output row, as the register-fed kernels give.
    if (wk == 0 && t == 0 && it.n > 0) {
      for (int h = 0; h < 2; ++h) {
        const int row = it.grp * kRows + g + 8 * h;
        if (it.expert < 0) {  // the dense chain: fp8_gemv's bf16 outputs, then swiglu_kernel
          if constexpr (kGateUp) {
            const float gb = __bfloat162float(__float2bfloat16_rn(acc[0][2 * h]));
            const float ub = __bfloat162float(__float2bfloat16_rn(acc[1][2 * h]));
            a.sout[row] = __float2bfloat16_rn(detail::siluf_(gb) * ub);
          } else {
            a.sout[row] = __float2bfloat16_rn(acc[0][2 * h]);
          }
        } else if constexpr (kGateUp) {
          const bf16 v = __float2bfloat16_rn(moe_detail::silu_f32(acc[0][2 * h]) * acc[1][2 * h]);
          for (int p = 0; p < it.n; ++p) a.out[int64_t(it.j0 + p) * a.I + row] = v;
        } else {
          const bf16 v = __float2bfloat16_rn(acc[0][2 * h]);
          for (int p = 0; p < it.n; ++p) a.out[int64_t(__ldcg(a.plan.pairs + it.j0 + p)) * a.H + row] = v;
        }
      }
    }
  }
}

const prof::Kernel kStreamGateUp{"moe_fp8_stream_kernel:gate_up", prof::Category::RoutedExpertGemm};
const prof::Kernel kStreamDown{"moe_fp8_stream_kernel:down", prof::Category::RoutedExpertGemm};

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
    MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return std::max(1, sms);
  }();
  return n;
}


template <bool kGateUp>
void launch(const bf16* act_in, const uint8_t* w, const float* scale, const MoeShape& s, const MoeWorkspace& ws,
            cudaStream_t stream, const MoeFp8SharedExpert* shared, const int32_t* num_rows) {
  MOEFOLD_CHECK(moe_fp8_stream_supported(s), "moe_fp8_stream: unsupported shape capacity={} E={} k={} H={} I={}",
                s.capacity, s.E, s.k, s.H, s.I);
  MOEFOLD_CHECK(act_in && w && scale, "moe_fp8_stream: null pointer");
  Args a;
  a.a = act_in;
  a.w = w;
  a.scale = scale;
  a.plan = moe_detail::plan_view(ws);
  a.out = kGateUp ? ws.act : ws.y;
  a.H = s.H;
  a.I = s.I;
  a.groups = kGateUp ? s.I / kRows : s.H / kRows;
  a.hint = l2_stream_hint() >= 1;
  a.g = geom(kGateUp, s);
  if (shared) {
    MOEFOLD_CHECK(moe_fp8_shared_fusable(s, shared->I) && num_rows && shared->gate_up && shared->gate_up_scale &&
                      shared->down && shared->down_scale && shared->act && shared->out,
                  "moe_fp8_stream: the shared expert (I={}) cannot run in the stream kernels of this shape, or a "
                  "null pointer",
                  shared->I);
    a.sw = kGateUp ? shared->gate_up : shared->down;
    a.sscale = kGateUp ? shared->gate_up_scale : shared->down_scale;
    a.sa = kGateUp ? act_in : shared->act;
    a.sout = kGateUp ? shared->act : shared->out;
    a.live = num_rows;
  }
  auto* kern = moe_fp8_stream_kernel<kGateUp>;
  static size_t allowed = 0;  // the kernel's dynamic shared-memory limit as set so far
  if (a.g.smem > allowed) {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(a.g.smem)));
    // The whole shared memory to the SM's carve-out, so that a gate_up CTA and a down CTA fit at once.
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            int(cudaSharedmemCarveoutMaxShared)));
    allowed = a.g.smem;
  }
  const int64_t items =
      int64_t(std::min(ws.max_tiles, moe_detail::max_row_tiles(s, kTilePairs)) + (shared ? 1 : 0)) * a.groups;
  if (items <= 0) return;
  LaunchScope scope(kGateUp ? kStreamGateUp : kStreamDown, stream, [&] {
    const prof::StepFacts* f = prof::step_facts();
    const double pairs = double(f ? std::min<int64_t>(f->rows, s.capacity) : s.capacity) * s.k;
    const double H = s.H, I = s.I, kb_h = double((s.H + 127) / 128), kb_i = double((s.I + 127) / 128);
    const double units = pairs + (shared && pairs > 0 ? 1 : 0);  // the shared expert: one more weight set
    if (kGateUp) return prof::Work{units * 2 * I * (H + kb_h * 4) + H * 2 + units * I * 2, 2.0 * units * H * 2 * I};
    return prof::Work{units * H * (I + kb_i * 4) + units * I * 2 + units * H * 2, 2.0 * units * I * H};
  });
  launch_pdl(kern, dim3(unsigned(std::min<int64_t>(items, sm_count()))), dim3(kThreads), a.g.smem, stream, a);
  MOEFOLD_CUDA_CHECK_LAUNCH();
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void set_moe_fp8_stream(bool on) { g_stream = on; }
bool moe_fp8_stream_enabled() { return g_stream; }
int64_t moe_fp8_stream_launches() { return g_launches.load(std::memory_order_relaxed); }

bool moe_fp8_stream_supported(const MoeShape& s) {
  if (s.capacity != 1 || s.H % 128 != 0 || s.I % 64 != 0 || s.H <= 0 || s.I <= 0) return false;
  const Geom gu = geom(true, s), dn = geom(false, s);
  return gu.S >= 1 && dn.S >= 1;
}

void moe_fp8_stream_gate_up(const bf16* x, const uint8_t* gate_up, const float* gate_up_scale, const MoeShape& shape,
                            const MoeWorkspace& ws, cudaStream_t stream, const MoeFp8SharedExpert* shared,
                            const int32_t* num_rows) {
  launch<true>(x, gate_up, gate_up_scale, shape, ws, stream, shared, num_rows);
}

void moe_fp8_stream_down(const uint8_t* down, const float* down_scale, const MoeShape& shape, const MoeWorkspace& ws,
                         cudaStream_t stream, const MoeFp8SharedExpert* shared, const int32_t* num_rows) {
  launch<false>(ws.act, down, down_scale, shape, ws, stream, shared, num_rows);
}

bool moe_fp8_shared_fusable(const MoeShape& shape, int shared_I) {
  // The dense chain's fp8_gemv splits K into warps_along_k(K) classes (8 warps), the routed items into
  // warps_along_k(K, 4): a shared item's warps take up to two classes each (R <= 2).
  const auto fits = [](int K) {
    const int wk = fp8mma::warps_along_k(K, kMmaWarps), wks = fp8mma::warps_along_k(K);
    return wks % wk == 0 && wks / wk <= 2;
  };
  return moe_fp8_stream_enabled() && moe_fp8_stream_supported(shape) && shared_I == shape.I && fits(shape.H) &&
         fits(shape.I);
}

}  // namespace moefold::cuda
