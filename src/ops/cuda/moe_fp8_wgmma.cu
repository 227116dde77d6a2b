// Routed experts at prefill sizes with FP8 weights AND FP8 activations (W8A8) on Hopper's FP8 warpgroup
// tensor cores (moe_fp8.h, moe_fp8_prefill_forward): the activations quantised per token and 128
// columns (fp8_act_quant.h), the weights as stored (128 x 128 block scales), the plan's 128-row tiles.
//
// Per output element (row t of expert e, column n): for every 128-column block kb of K in ascending
// order, a fresh fp32 partial p_kb = sum over the block of e4m3(a) * e4m3(w) (4 wgmma k32 steps), then
// acc = fma(p_kb, sa[t, kb] * sb[n, kb], acc) (fp32, the "promotion" of DeepSeek-V3's FP8 GEMMs); gate_up
// forms silu(g) * u from the fp32 sums and rounds once to bf16 (act), down rounds y once to bf16. The
// order depends on K only, never on the other rows: a row's bits are the same alone or in any batch.
//
// Block: 384 threads, one 128 x 128 item at a time, persistent over the (plan tile, column tile) items
// of the live tiles (*num_tiles, read on the device), kGroupM plan tiles sweeping the column tiles
// together (an expert's rows share its weights in L2). gate_up's 128 B rows are 64 gate rows n0.. and
// the matching 64 up rows I + n0.. (64 act columns an item); down's are 128 y columns.
//  - warpgroup 0, the producer (registers given up with setmaxnreg), fills a ring of kStages stages,
//    each the 128 x 128-byte A tile and the 128 x 128-byte B tile of one K block. B by bulk tensor
//    copies (TMA, 128-byte swizzle) of the expert's rows. gate_up gathers its A rows xq[pairs[pos] / k]
//    with cp.async in the same swizzle (rows past the tile's live rows zero-filled without a read),
//    each thread's copies arriving on the stage's full barrier as they land
//    (cp.async.mbarrier.arrive.noinc), the consumers fencing them for the async proxy; down's A rows,
//    actq[pos0 ..], are contiguous and come by TMA too.
//  - warpgroups 1 and 2, the consumers: 64 rows each; per K block 4 wgmma into a partial, wait, free
//    the stage, promote into the accumulators. The epilogue rounds and stores from registers, live
//    rows only.
//
// Weight scales: one per 64-row group (gate_up: each half of an item; down: 128 rows lie in one block
// as H % 128 == 0). That holds for every weight of core/fp8_block.h's format whose matrices start at
// multiples of 64 rows (per-expert gate / up / down, fused [E, 2I, H], their 64-row-aligned shards):
// the kernel reads the scale of each group's first row.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <initializer_list>

#include "core/error.h"
#include "ops/cuda/fp8_act_quant.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe_fp8.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/tma_map.h"
#include "ops/cuda/tma_pipeline.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/wgmma_fp8.cuh"

namespace moefold::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 128, kBK = 128, kThreads = 384, kGroupM = 16;
constexpr int kProducerThreads = 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 * 40 + 256 * 232 <= 65536
constexpr uint32_t kABytes = kBM * kBK;
constexpr int kAChunks = kBM * 8 / kProducerThreads;  // 16-byte A chunks per producer thread
static_assert(kAChunks == 8, "producer layout");

/// A stage of a tile of bn B rows: the 128 x 128-byte A tile and the bn x 128-byte B tile.
constexpr uint32_t stage_bytes(int bn) { return kABytes + uint32_t(bn) * kBK; }
/// Shared memory of a ring: the stages, then the full and empty barriers (+ alignment slack).
constexpr size_t smem_bytes(int stages, int bn) {
  return size_t(stages) * stage_bytes(bn) + 2 * size_t(stages) * 8 + 1024;
}
/// Ring depth by tile width: 6 stages of 32 KB, 4 of 48 KB.
constexpr int ring_stages(int bn) { return bn == 256 ? 4 : 6; }
static_assert(smem_bytes(ring_stages(128), 128) <= 227 * 1024 && smem_bytes(ring_stages(256), 256) <= 227 * 1024,
              "shared memory");

/// Arrival on mbarrier `bar` once every cp.async this thread issued before has landed, without
/// incrementing its pending count (the barrier's expected count includes it). PTX: cp.async.mbarrier.arrive.
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

struct Fp8GemmParams {
  const uint8_t* A = nullptr;      // [rows, K] e4m3 (gate_up: xq by token; down: actq by plan position)
  const float* a_scale = nullptr;  // [rows, K / 128]
  const float* b_scale = nullptr;  // [E * b_rows, K / 128] (per row, core/fp8_block.h)
  bf16* C = nullptr;               // gate_up: act [P, N]; down: y [P, N] at the pair's id
  const int32_t* pairs = nullptr;
  const int2* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  const int32_t* offsets = nullptr;
  int K = 0, N = 0, topk = 1, b_rows = 0, b_up_offset = 0;
};

/// kTmaA (down only): A's 128 rows from the plan position by one bulk tensor copy (tma) instead of
/// the producer threads' cp.async; rows past the tile's live ones are loaded too (other experts'
/// rows or stale bytes: their products are discarded, a row's products never touch another row's).
/// kBN: B rows of an item, 128 or 256. At 256 a consumer warpgroup multiplies its 64 rows by the two
/// 128-row halves of B in turn, each through the one 64-register partial (acc: 128 registers).
template <bool kSwiglu, int kStages, bool kTmaA, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    moe_fp8_wgmma_kernel(const __grid_constant__ CUtensorMap tmb, const __grid_constant__ CUtensorMap tma_a,
                         const Fp8GemmParams p, int max_tiles) {
  static_assert(!(kSwiglu && kTmaA), "gate_up gathers its A rows");
  static_assert(kBN == 128 || kBN == 256, "tile width");
  pdl_begin();
  constexpr int kCols = kSwiglu ? kBN / 2 : kBN;  // output columns of one item
  constexpr int kHalves = kBN / 128;              // 128-row B halves, one partial each
  constexpr uint32_t kBBytes = uint32_t(kBN) * kBK, kStageBytes = stage_bytes(kBN);
  constexpr uint32_t kBarOff = kStages * kStageBytes;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (ptx::smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t sbase = ptx::smem_u32(base);
  auto stage_a = [&](int st) { return sbase + uint32_t(st) * kStageBytes; };
  auto stage_b = [&](int st) { return sbase + uint32_t(st) * kStageBytes + kABytes; };
  auto full = [&](int st) { return sbase + kBarOff + uint32_t(st) * 8u; };
  auto empty = [&](int st) { return sbase + kBarOff + uint32_t(kStages + st) * 8u; };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wgi = warp >> 2;
  const int num_tiles = min(*p.num_tiles, max_tiles);
  const int col_tiles = p.N / kCols;
  const int total = num_tiles > 0 ? num_tiles * col_tiles : 0;
  const int KC = p.K / kBK;

  if (tid == 0) {
#pragma unroll 1
    for (int st = 0; st < kStages; ++st) {
      // cp.async A: every producer thread's copies (arriving as they land) + thread 0's B bytes.
      ptx::mbar_init(full(st), kTmaA ? 1 : kProducerThreads + 1);
      ptx::mbar_init(empty(st), 8);  // one arrival per consumer warp
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();

  if (wgi == 0) {  // ---- producer ----
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (kTmaA && tid != 0) return;
    const int ch = tid & 7, r0 = tid >> 3;  // this thread's 16-byte column chunk; rows r0 + 16 i
    const uint32_t a_off = uint32_t(r0 * 128 + ((ch ^ (r0 & 7)) << 4));  // (r0 + 16 i) & 7 == r0 & 7
    int st = 0;
    uint32_t ph = 0;
#pragma unroll 1
    for (int t = int(blockIdx.x); t < total; t += int(gridDim.x)) {
      int mt, nt;
      tma::raster<kGroupM>(t, num_tiles, col_tiles, mt, nt);
      const int2 tile = p.tiles[mt];
      const int start = p.offsets[tile.x], cnt = p.offsets[tile.x + 1] - start;
      const int pos0 = start + tile.y, nrows = min(kBM, cnt - tile.y);
      int arow[kAChunks];  // A row of tile row r0 + 16 i (-1: past the tile's rows)
#pragma unroll
      for (int i = 0; i < kAChunks; ++i) {
        const int r = r0 + 16 * i;
        arow[i] = (kTmaA || r >= nrows) ? -1 : (kSwiglu ? p.pairs[pos0 + r] / p.topk : pos0 + r);
      }
      const int brow = tile.x * p.b_rows + nt * kCols;  // first B row (SwiGLU: the gate rows)
#pragma unroll 1
      for (int c = 0; c < KC; ++c) {
        ptx::mbar_wait(empty(st), ph ^ 1);
        const int k0 = c * kBK;
        if (tid == 0) {
          ptx::mbar_arrive_expect_tx(full(st), kTmaA ? kBBytes + kABytes : kBBytes);
          if constexpr (kSwiglu) {
            tma::tma_2d(stage_b(st), &tmb, full(st), k0, brow);
            tma::tma_2d(stage_b(st) + kBBytes / 2, &tmb, full(st), k0, brow + p.b_up_offset);
          } else {
            tma::tma_2d(stage_b(st), &tmb, full(st), k0, brow);
          }
          if constexpr (kTmaA) tma::tma_2d(stage_a(st), &tma_a, full(st), k0, pos0);
        }
        if constexpr (!kTmaA) {  // the stage's full barrier counts this thread's copies as they land
          const uint32_t dst = stage_a(st) + a_off;
          const uint8_t* src = p.A + k0 + ch * 16;
#pragma unroll
          for (int i = 0; i < kAChunks; ++i)
            tma::cp_async16_zfill(dst + uint32_t(i * 16 * 128), arow[i] >= 0 ? src + int64_t(arow[i]) * p.K : p.A,
                                  arow[i] >= 0);
          cp_async_arrive_noinc(full(st));
        }
        if (++st == kStages) st = 0, ph ^= 1;
      }
    }
    ptx::cp_async_commit();  // wait for this thread's last copies (their arrivals are on the barriers)
    ptx::cp_async_wait<0>();
    return;
  }

  // ---- consumers: warpgroup cw owns rows cw * 64 .. + 63 of the tile ----
  // Per K block: the 4 wgmma into the partial, wait, free the stage, promote into the accumulators.
  // (Measured slower, docs/fp8.md: two partials in turn, promoting one under the next block's products.)
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wgi - 1, w4 = warp & 3, g = lane >> 2, tig = lane & 3;
  float acc[kBN / 2], part[64];
  int st = 0;
  uint32_t ph = 0;
#pragma unroll 1
  for (int t = int(blockIdx.x); t < total; t += int(gridDim.x)) {
    int mt, nt;
    tma::raster<kGroupM>(t, num_tiles, col_tiles, mt, nt);
    const int2 tile = p.tiles[mt];
    const int start = p.offsets[tile.x], cnt = p.offsets[tile.x + 1] - start;
    const int pos0 = start + tile.y, nrows = min(kBM, cnt - tile.y);
    // This thread's two rows (h = 0, 1) and their activation scales; the weight groups' scale rows.
    const float* sa[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = cw * 64 + w4 * 16 + g + 8 * h;
      const int ar = r < nrows ? (kSwiglu ? p.pairs[pos0 + r] / p.topk : pos0 + r) : -1;
      sa[h] = ar >= 0 ? p.a_scale + int64_t(ar) * KC : nullptr;
    }
    // The B rows' scale groups, one scale each: gate_up's gate rows and up rows (b_up_offset on); down's
    // 128-row halves (kBN 256), or its one 128-row block for both (kBN 128).
    const int brow = tile.x * p.b_rows + nt * kCols;
    const float* sb0 = p.b_scale + int64_t(brow) * KC;
    const float* sb1 = p.b_scale + int64_t(brow + (kSwiglu ? p.b_up_offset : kBN - 128)) * KC;
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;
#pragma unroll 1
    for (int c = 0; c < KC; ++c) {
      const float a0 = sa[0] ? sa[0][c] : 0.0f, a1 = sa[1] ? sa[1][c] : 0.0f, b0 = sb0[c], b1 = sb1[c];
      ptx::mbar_wait(full(st), ph);
      if constexpr (!kTmaA) wg::fence_proxy_async();  // the cp.async (generic proxy) A rows, for wgmma
      const uint64_t da = wg::desc_sw128(stage_a(st) + uint32_t(cw * 64 * 128));
#pragma unroll
      for (int hb = 0; hb < kHalves; ++hb) {
        wg::fence();
        const uint64_t db = wg::desc_sw128(stage_b(st) + uint32_t(hb * 128 * 128));
#pragma unroll
        for (int ks = 0; ks < kBK / 32; ++ks) wgf8::mma_n128(part, da + uint64_t(ks * 2), db + uint64_t(ks * 2), ks);
        wg::commit();
        wg::wait<0>();
        wg::fence_regs(part);
        if (hb == kHalves - 1) tma::mbar_arrive_lane0(empty(st), lane);
        // Fragment (j, h) of the partial: row g + 8 h of the warp's 16, columns 8 j + 2 tig (+ 1) of
        // this half. kBN 128: j < 8 is the first scale group, j >= 8 the second; kBN 256: half hb is
        // group hb. Its accumulators: acc[64 hb + 4 j + ..].
        const float s00 = a0 * b0, s01 = a0 * b1, s10 = a1 * b0, s11 = a1 * b1;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const bool second = kHalves == 1 ? j >= 8 : hb == 1;
          const float sh0 = second ? s01 : s00, sh1 = second ? s11 : s10;
          float* a = acc + 64 * hb + 4 * j;
          a[0] = fmaf(part[4 * j + 0], sh0, a[0]);
          a[1] = fmaf(part[4 * j + 1], sh0, a[1]);
          a[2] = fmaf(part[4 * j + 2], sh1, a[2]);
          a[3] = fmaf(part[4 * j + 3], sh1, a[3]);
        }
      }
      if (++st == kStages) st = 0, ph ^= 1;
    }
    // Epilogue: fragment (j, h) of warp w4 holds tile row w4 * 16 + g + 8h, columns 8j + 2 tig, + 1.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = cw * 64 + w4 * 16 + g + 8 * h;
      if (r >= nrows) continue;
      if constexpr (kSwiglu) {  // gate column j pairs with up column j + kBN / 2 (fragment j + kBN / 16)
        bf16* out = p.C + int64_t(pos0 + r) * p.N + nt * kCols + 2 * tig;
#pragma unroll
        for (int j = 0; j < kBN / 16; ++j) {
          const float v0 = moe_detail::silu_f32(acc[4 * j + 2 * h]) * acc[4 * (j + kBN / 16) + 2 * h];
          const float v1 = moe_detail::silu_f32(acc[4 * j + 2 * h + 1]) * acc[4 * (j + kBN / 16) + 2 * h + 1];
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = __floats2bfloat162_rn(v0, v1);
        }
      } else {
        bf16* out = p.C + int64_t(p.pairs[pos0 + r]) * p.N + nt * kCols + 2 * tig;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) =
              __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    }
  }
}

const prof::Kernel kFp8Wgmma[2] = {{"moe_fp8_wgmma_kernel:gate_up", prof::Category::RoutedExpertGemm},
                                   {"moe_fp8_wgmma_kernel:down", prof::Category::RoutedExpertGemm}};

/// Work bound from the live rows: every touched expert's weights and scales, the A rows and scales
/// read, the outputs written; 2 FLOPs per multiply-add of every pair.
prof::Work work(bool gate_up, const MoeShape& s) {
  const prof::StepFacts* f = prof::step_facts();
  const double pairs = double(f ? std::min<int64_t>(f->rows, s.capacity) : s.capacity) * s.k;
  const double touched = std::min<double>(s.E, pairs), H = s.H, I = s.I;
  if (gate_up)
    return prof::Work{touched * 2 * I * H * (1 + 4.0 / 128) + pairs * H * (1 + 4.0 / 128) + pairs * I * 2,
                      2.0 * pairs * H * 2 * I};
  return prof::Work{touched * H * I * (1 + 4.0 / 128) + pairs * I * (1 + 4.0 / 128) + pairs * H * 2,
                    2.0 * pairs * I * H};
}

/// The index in `allowed` of environment variable `name`'s value (unset or empty: 0, the default);
/// another value throws moefold::Error. Its callers read it once: MOEFOLD_MOE_FP8_PREFILL (wgmma |
/// dequant), and for A/B timing down's A loads (MOEFOLD_MOE_FP8_DOWN_A = tma | cpasync) and the tile width
/// (MOEFOLD_MOE_FP8_TILE_N = 128 | 256); docs/fp8.md has the measurements.
int env_choice(const char* name, std::initializer_list<const char*> allowed) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  int i = 0;
  for (const char* a : allowed) {
    if (std::strcmp(v, a) == 0) return i;
    ++i;
  }
  throw Error(std::string(name) + "='" + v + "': not one of the allowed values");
}
bool down_a_by_tma() {
  static const bool t = env_choice("MOEFOLD_MOE_FP8_DOWN_A", {"tma", "cpasync"}) == 0;
  return t;
}
// 256-row items by default: on the H200 they ran the 16k-token chain ~10% faster than 128 (gate_up 20-25%,
// down 9-14%; docs/benchmarks.md, session 11), a quarter fewer L2 bytes per FLOP.
int env_tile_n() {
  static const int n = env_choice("MOEFOLD_MOE_FP8_TILE_N", {"256", "128"}) == 1 ? 128 : 256;
  return n;
}

template <bool kSwiglu, bool kTmaA, int kBN>
void launch_kernel(const Fp8GemmParams& p, const CUtensorMap& mb, const CUtensorMap& ma, int blocks, int max_tiles,
                   cudaStream_t stream) {
  constexpr int kStages = ring_stages(kBN);
  constexpr size_t kSmem = smem_bytes(kStages, kBN);
  auto* k = moe_fp8_wgmma_kernel<kSwiglu, kStages, kTmaA, kBN>;
  static std::once_flag once;
  std::call_once(once, [k] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  });
  launch_pdl(k, dim3(unsigned(blocks)), dim3(kThreads), kSmem, stream, mb, ma, p, max_tiles);
}

template <bool kSwiglu, int kBN>
void launch_tile(const Fp8GemmParams& p, const uint8_t* B, int E, int a_rows, int max_tiles, cudaStream_t stream,
                 const char* who) {
  constexpr int kCols = kSwiglu ? kBN / 2 : kBN;
  const CUtensorMap mb = tma_map_2d_u8(B, int64_t(E) * p.b_rows, p.K, p.K, kCols, who);
  const bool tma_a = !kSwiglu && down_a_by_tma();
  const CUtensorMap ma = tma_a ? tma_map_2d_u8(p.A, a_rows, p.K, p.K, kBM, who) : mb;
  const int64_t items = int64_t(max_tiles) * (p.N / kCols);
  const int blocks = int(std::min<int64_t>(items, device_sm_count()));
  if constexpr (kSwiglu) launch_kernel<true, false, kBN>(p, mb, ma, blocks, max_tiles, stream);
  else if (tma_a) launch_kernel<false, true, kBN>(p, mb, ma, blocks, max_tiles, stream);
  else launch_kernel<false, false, kBN>(p, mb, ma, blocks, max_tiles, stream);
}

template <bool kSwiglu>
void launch(const Fp8GemmParams& p, const uint8_t* B, int E, int a_rows, int max_tiles, const MoeShape& s,
            cudaStream_t stream) {
  if (max_tiles <= 0) return;
  const char* who = kSwiglu ? "moe_fp8_wgmma:gate_up" : "moe_fp8_wgmma:down";
  LaunchScope scope(kFp8Wgmma[kSwiglu ? 0 : 1], stream, [&] { return work(kSwiglu, s); });
  // 256 B rows where whole tiles cover N (gate_up: 128 act columns; down: 256 y columns), else 128.
  if (env_tile_n() == 256 && p.N % (kSwiglu ? 128 : 256) == 0)
    launch_tile<kSwiglu, 256>(p, B, E, a_rows, max_tiles, stream, who);
  else
    launch_tile<kSwiglu, 128>(p, B, E, a_rows, max_tiles, stream, who);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

bool moe_fp8_prefill_supported(const MoeShape& s) { return s.H % 128 == 0 && s.I % 128 == 0 && s.H >= 128; }

bool moe_fp8_prefill_runs(const MoeShape& step) {
  static const bool on = env_choice("MOEFOLD_MOE_FP8_PREFILL", {"wgmma", "dequant"}) == 0;
  return on && step.capacity > kMoeFp8MaxRows && moe_fp8_prefill_supported(step);
}

size_t moe_fp8_prefill_scratch_bytes(const MoeShape& s) {
  const size_t T = size_t(s.capacity), P = T * size_t(s.k);
  return align256(T * s.H) + align256(T * (s.H / 128) * 4) + align256(P * s.I) + align256(P * (s.I / 128) * 4);
}

MoeFp8PrefillScratch moe_fp8_prefill_scratch_bind(void* base, size_t bytes, const MoeShape& s) {
  MOEFOLD_CHECK(moe_fp8_prefill_supported(s), "moe_fp8_prefill_scratch_bind: H {} and I {} must be multiples of 128",
                s.H, s.I);
  MOEFOLD_CHECK(base && bytes >= moe_fp8_prefill_scratch_bytes(s),
                "moe_fp8_prefill_scratch_bind: {} bytes, {} needed", bytes, moe_fp8_prefill_scratch_bytes(s));
  const size_t T = size_t(s.capacity), P = T * size_t(s.k);
  auto* b = static_cast<unsigned char*>(base);
  MoeFp8PrefillScratch r;
  r.capacity = s.capacity;
  r.xq = b;
  b += align256(T * s.H);
  r.xs = reinterpret_cast<float*>(b);
  b += align256(T * (s.H / 128) * 4);
  r.aq = b;
  b += align256(P * s.I);
  r.as = reinterpret_cast<float*>(b);
  return r;
}

void moe_fp8_prefill_forward(const bf16* x, const bf16* w_router, const uint8_t* gate_up, const float* gate_up_scale,
                             const uint8_t* down, const float* down_scale, const bf16* shared_out,
                             const bf16* shared_gate_w, const bf16* residual, const int32_t* num_rows,
                             const MoeShape& shape, bool renormalize, const MoeWorkspace& ws,
                             const MoeFp8PrefillScratch& scratch, bf16* out, cudaStream_t stream,
                             const int32_t* replay, const MoeNextNorm* next) {
  MoeShape s = shape;
  s.expert_tiles = 2;  // the plan's 128-row tiles
  MOEFOLD_CHECK(moe_fp8_prefill_supported(s) && s.capacity >= 1 && s.capacity <= ws.capacity &&
                    s.capacity <= scratch.capacity,
                "moe_fp8_prefill_forward: unsupported shape capacity={} (workspace {}, scratch {}) H={} I={} "
                "(H and I must be multiples of 128)",
                s.capacity, ws.capacity, scratch.capacity, s.H, s.I);
  MOEFOLD_CHECK(num_rows && x && w_router && gate_up && gate_up_scale && down && down_scale && out,
                "moe_fp8_prefill_forward: null pointer (num_rows is a device int32)");
  moe_router_logits(x, w_router, num_rows, s, ws.logits, stream);
  moe_route(ws.logits, num_rows, s, renormalize, ws, stream, replay);
  const int tiles = std::min(ws.max_tiles, moe_detail::max_row_tiles(s, kBM));
  fp8_quantize_rows(x, s.capacity, s.H, num_rows, scratch.xq, scratch.xs, stream);
  Fp8GemmParams p;
  p.pairs = ws.pairs;
  p.tiles = ws.tiles;
  p.num_tiles = ws.num_tiles;
  p.offsets = ws.offsets;
  p.topk = s.k;
  p.A = scratch.xq;
  p.a_scale = scratch.xs;
  p.b_scale = gate_up_scale;
  p.C = ws.act;
  p.K = s.H;
  p.N = s.I;
  p.b_rows = 2 * s.I;
  p.b_up_offset = s.I;
  launch<true>(p, gate_up, s.E, s.capacity, tiles, s, stream);
  // The live pairs (offsets[E]) of act, in plan order.
  fp8_quantize_rows(ws.act, int64_t(s.capacity) * s.k, s.I, ws.offsets + s.E, scratch.aq, scratch.as, stream, s.k);
  p.A = scratch.aq;
  p.a_scale = scratch.as;
  p.b_scale = down_scale;
  p.C = ws.y;
  p.K = s.I;
  p.N = s.H;
  p.b_rows = s.H;
  p.b_up_offset = 0;
  launch<false>(p, down, s.E, s.capacity * s.k, tiles, s, stream);
  moe_combine(ws.weights, ws, shared_out, shared_gate_w, x, residual, num_rows, s, out, stream, next);
}

}  // namespace moefold::cuda
