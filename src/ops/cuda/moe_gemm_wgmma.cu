// The 128-row routed-expert GEMMs on Hopper's warpgroup tensor cores (moe_gemm_wgmma.h): the function
// and bits of moe_gemm_kernel<CfgPrefill, MODE> (moe_gemm.cuh), C = A . B[e]^T over the plan's row
// tiles, with the machinery of the wgmma prefill GEMM (prefill_gemm_wgmma.cu: TMA + mbarrier ring,
// warp-specialised, persistent, grouped raster).
//
// Per-element order, as the mma.sync tiles: ONE fp32 chain from zero of k16 steps over K ascending (K in
// 64-wide chunks, 4 steps each, no split), then gate_up's silu(g) * u (moe_detail::silu_f32) or down's
// value, rounded once to bf16. A wgmma m64nNk16 step rounds as an mma.sync m16n8k16 step
// (tests/cuda/wgmma_probe_test.cu), so the outputs are bitwise the tiles'.
//
// Block: 384 threads, one 128 x BN tile at a time, BN = 256 B rows (4-stage ring) or 128 (6 stages)
// (gate_up: BN / 2 gate rows n0.. and the matching up rows I + n0.., so BN / 2 act columns; down: BN
// y columns), persistent over the
// (plan tile, column tile) items of the live tiles (*num_tiles, read on the device), kGroupM plan
// tiles sweeping the column tiles together (an expert's rows share its weights in L2).
//  - warpgroup 0, the producer (registers given up with setmaxnreg), fills a ring of kStages stages,
//    each the 128 x 64 A tile and the BN x 64 B tile of one K chunk. B by bulk tensor copies (TMA,
//    128-byte swizzle) of the expert's rows, completing on the stage's full mbarrier (thread 0 arrives
//    with the byte count). A row by row with cp.async, 8 16-byte chunks per thread, in the same
//    swizzle: gate_up gathers x[pairs[pos] / k], down reads act[pos]; rows past the tile's live rows
//    (the expert's count) are zero-filled without a read. Each thread keeps kLag chunks in flight:
//    once its copies of chunk q - kLag have landed (cp.async.wait_group) it fences them for the async
//    proxy and arrives on that chunk's full barrier (128 arrivals + thread 0's).
//  - warpgroups 1 and 2, the consumers: 64 rows each, all BN columns (BN / 2 fp32 accumulators per
//    thread); per chunk 4 wgmma (both operands from shared memory), one commit group; the previous
//    chunk's stage is released once its group completes (wait_group 1). The epilogue rounds and stores
//    from registers, live rows only (gate_up: act[pos]; down: y[pairs[pos]]).
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include "ops/cuda/moe_gemm_wgmma.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/error.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/tma_map.h"
#include "ops/cuda/tma_pipeline.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/wgmma_ss.cuh"

namespace moefold::cuda::moe_detail {
namespace {

constexpr int kBM = 128, kBK = 64, kThreads = 384, kGroupM = 16;
constexpr int kProducerThreads = 128;
constexpr int kProducerRegs = 72, kConsumerRegs = 216;  // 128 * 72 + 256 * 216 <= 65536 (56 spills)
constexpr uint32_t kABytes = kBM * kBK * 2;
constexpr int kAChunks = kBM * 8 / kProducerThreads;  // 16-byte A chunks per producer thread per stage
static_assert(kAChunks == 8, "producer layout");

/// Tile of BN (256 or 128) B rows: the ring's depth, bytes and accumulators.
template <int BN>
struct TileCfg {
  static constexpr int kStages = BN == 256 ? 4 : 6;
  static constexpr int kLag = kStages - 2;  // chunks a producer thread keeps in flight before arriving
  static constexpr uint32_t kBBytes = BN * kBK * 2;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;  // a multiple of 1024 (swizzle atoms)
  static constexpr uint32_t kBarOff = kStages * kStageBytes;
  static constexpr size_t kSmem = size_t(kBarOff) + 2 * kStages * 8 + 1024;  // + alignment slack
  static constexpr int kAcc = BN / 2;                                        // fp32 accumulators per thread
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

template <GemmMode MODE, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    moe_gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tmb, const GemmParams p, int max_tiles) {
  pdl_begin();
  using Cfg = TileCfg<kBN>;
  constexpr int kStages = Cfg::kStages, kLag = Cfg::kLag, kAcc = Cfg::kAcc;
  constexpr uint32_t kBBytes = Cfg::kBBytes, kStageBytes = Cfg::kStageBytes, kBarOff = Cfg::kBarOff;
  constexpr bool kSwiglu = MODE == GemmMode::kExpertGateUp;
  constexpr int kCols = kSwiglu ? kBN / 2 : kBN;  // output columns of one item
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
      ptx::mbar_init(full(st), kProducerThreads + 1);  // every producer thread's A copies + thread 0's B bytes
      ptx::mbar_init(empty(st), 8);                    // one arrival per consumer warp
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();

  if (wgi == 0) {  // ---- producer ----
    ptx::setmaxnreg_dec<kProducerRegs>();
    const int ch = tid & 7, r0 = tid >> 3;  // this thread's 16-byte column chunk; rows r0 + 16 i
    const uint32_t a_off = uint32_t(r0 * 128 + ((ch ^ (r0 & 7)) << 4));  // (r0 + 16 i) & 7 == r0 & 7
    const int b_rows = int(p.b_expert_stride / p.K);                     // B rows of one expert
    int st = 0, lag_st = 0, pending = 0;
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
        arow[i] = r < nrows ? (kSwiglu ? p.pairs[pos0 + r] / p.topk : pos0 + r) : -1;
      }
      const int brow = tile.x * b_rows + nt * kCols;  // first B row (SwiGLU: the gate rows)
#pragma unroll 1
      for (int c = 0; c < KC; ++c) {
        ptx::mbar_wait(empty(st), ph ^ 1);
        const int k0 = c * kBK;
        if (tid == 0) {
          ptx::mbar_arrive_expect_tx(full(st), kBBytes);
          tma::tma_2d(stage_b(st), &tmb, full(st), k0, brow);
          if constexpr (kSwiglu) tma::tma_2d(stage_b(st) + kBBytes / 2, &tmb, full(st), k0, brow + p.b_up_offset);
        }
        const uint32_t dst = stage_a(st) + a_off;
        const __nv_bfloat16* src = p.A + k0 + ch * 8;
#pragma unroll
        for (int i = 0; i < kAChunks; ++i)
          tma::cp_async16_zfill(dst + uint32_t(i * 16 * 128), arow[i] >= 0 ? src + int64_t(arow[i]) * p.K : p.A,
                                arow[i] >= 0);
        ptx::cp_async_commit();
        if (pending == kLag) {  // chunk q - kLag has landed: hand it to the consumers
          ptx::cp_async_wait<kLag>();
          wg::fence_proxy_async();
          ptx::mbar_arrive(full(lag_st));
          if (++lag_st == kStages) lag_st = 0;
        } else {
          ++pending;
        }
        if (++st == kStages) st = 0, ph ^= 1;
      }
    }
    ptx::cp_async_wait<0>();
    wg::fence_proxy_async();
#pragma unroll 1
    for (; pending > 0; --pending) {
      ptx::mbar_arrive(full(lag_st));
      if (++lag_st == kStages) lag_st = 0;
    }
    return;
  }

  // ---- consumers: warpgroup cw owns rows cw * 64 .. + 63 of the tile ----
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wgi - 1, w4 = warp & 3, g = lane >> 2, tig = lane & 3;
  float acc[kAcc];
  int st = 0;
  uint32_t ph = 0;
#pragma unroll 1
  for (int t = int(blockIdx.x); t < total; t += int(gridDim.x)) {
    int mt, nt;
    tma::raster<kGroupM>(t, num_tiles, col_tiles, mt, nt);
    const int2 tile = p.tiles[mt];
    const int start = p.offsets[tile.x], cnt = p.offsets[tile.x + 1] - start;
    const int pos0 = start + tile.y, nrows = min(kBM, cnt - tile.y);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    int prev = -1;  // the stage whose wgmma group may still be reading
#pragma unroll 1
    for (int c = 0; c < KC; ++c) {
      ptx::mbar_wait(full(st), ph);
      wg::fence();
      const uint64_t da = wg::desc_sw128(stage_a(st) + uint32_t(cw * 64 * 128));
      const uint64_t db = wg::desc_sw128(stage_b(st));
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) wgss::mma(acc, da + uint64_t(ks * 2), db + uint64_t(ks * 2));
      wg::commit();
      wg::wait<1>();  // the previous chunk's group is done: its stage is free
      if (prev >= 0) tma::mbar_arrive_lane0(empty(prev), lane);
      prev = st;
      if (++st == kStages) st = 0, ph ^= 1;
    }
    wg::wait<0>();
    wg::fence_regs(acc);
    if (prev >= 0) tma::mbar_arrive_lane0(empty(prev), lane);
    // Epilogue: fragment (j, h) of warp w4 holds tile row w4 * 16 + g + 8h, columns 8j + 2 tig, + 1.
    auto* C = static_cast<__nv_bfloat16*>(p.C);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = cw * 64 + w4 * 16 + g + 8 * h;
      if (r >= nrows) continue;
      if constexpr (kSwiglu) {  // gate column j pairs with up column j + kBN / 2 (fragment j + kBN / 16)
        __nv_bfloat16* out = C + int64_t(pos0 + r) * p.ldc + nt * kCols + 2 * tig;
#pragma unroll
        for (int j = 0; j < kBN / 16; ++j) {
          const float v0 = silu_f32(acc[4 * j + 2 * h]) * acc[4 * (j + kBN / 16) + 2 * h];
          const float v1 = silu_f32(acc[4 * j + 2 * h + 1]) * acc[4 * (j + kBN / 16) + 2 * h + 1];
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = __floats2bfloat162_rn(v0, v1);
        }
      } else {
        __nv_bfloat16* out = C + int64_t(p.pairs[pos0 + r]) * p.ldc + nt * kCols + 2 * tig;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) =
              __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    }
  }
}

template <GemmMode MODE, int kBN>
void launch(const GemmParams& p, int E, int max_tiles, cudaStream_t stream, const char* who) {
  using Cfg = TileCfg<kBN>;
  constexpr bool kSwiglu = MODE == GemmMode::kExpertGateUp;
  constexpr int kCols = kSwiglu ? kBN / 2 : kBN;
  MOEFOLD_CHECK(p.N % kCols == 0 && p.K % kBK == 0 && p.K >= kBK && p.b_expert_stride % p.K == 0,
                fmt::runtime("{}: unsupported shape N={} K={} (N % {} and K % 64 must be 0)"), who, p.N, p.K, kCols);
  if (max_tiles <= 0) return;
  const int64_t b_rows = p.b_expert_stride / p.K;
  const CUtensorMap mb = tma_map_2d_bf16(p.B, int64_t(E) * b_rows, p.K, p.K, kSwiglu ? kBN / 2 : kBN, who);
  auto* k = moe_gemm_wgmma_kernel<MODE, kBN>;
  static std::once_flag once;
  std::call_once(once, [k] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmem)));
  });
  const int64_t items = int64_t(max_tiles) * (p.N / kCols);
  const int blocks = int(std::min<int64_t>(items, device_sm_count()));
  launch_pdl(k, dim3(unsigned(blocks)), dim3(kThreads), Cfg::kSmem, stream, mb, p, max_tiles);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

std::atomic<int> g_override{-1};  // -1: the environment decides
std::atomic<int> g_tile_n{0};     // 0: automatic

bool env_wgmma() {
  static const bool on = [] {
    const char* v = std::getenv("MOEFOLD_MOE_GEMM");
    if (!v || !*v || std::strcmp(v, "wgmma") == 0) return true;
    if (std::strcmp(v, "mma") == 0) return false;
    throw Error(std::string("MOEFOLD_MOE_GEMM='") + v + "': expected mma or wgmma");
  }();
  return on;
}

/// The tile width for a GEMM of N output columns (gate_up: act columns): the forced one, else 256
/// when whole tiles cover N, else 128.
int tile_n_for(bool gate_up, int N) {
  const int forced = g_tile_n.load(std::memory_order_relaxed);
  if (forced != 0) return forced;
  return N % (gate_up ? 128 : 256) == 0 ? 256 : 128;
}

}  // namespace

bool expert_gemm_wgmma() {
  const int o = g_override.load(std::memory_order_relaxed);
  return o >= 0 ? o != 0 : env_wgmma();
}
void set_expert_gemm_wgmma(bool on, int tile_n) {
  MOEFOLD_CHECK(tile_n == 0 || tile_n == 128 || tile_n == 256,
                fmt::runtime("set_expert_gemm_wgmma: tile_n {} (expected 0, 128 or 256)"), tile_n);
  g_override.store(on ? 1 : 0, std::memory_order_relaxed);
  g_tile_n.store(tile_n, std::memory_order_relaxed);
}

int expert_gemm_wgmma_tile_n(const MoeShape& s, bool gate_up) { return tile_n_for(gate_up, gate_up ? s.I : s.H); }

void launch_wgmma_gate_up(const GemmParams& p, int E, int max_tiles, cudaStream_t stream) {
  if (tile_n_for(true, p.N) == 256)
    launch<GemmMode::kExpertGateUp, 256>(p, E, max_tiles, stream, "moe_gemm_wgmma:gate_up");
  else
    launch<GemmMode::kExpertGateUp, 128>(p, E, max_tiles, stream, "moe_gemm_wgmma:gate_up");
}
void launch_wgmma_down(const GemmParams& p, int E, int max_tiles, cudaStream_t stream) {
  if (tile_n_for(false, p.N) == 256)
    launch<GemmMode::kExpertDown, 256>(p, E, max_tiles, stream, "moe_gemm_wgmma:down");
  else
    launch<GemmMode::kExpertDown, 128>(p, E, max_tiles, stream, "moe_gemm_wgmma:down");
}

}  // namespace moefold::cuda::moe_detail
