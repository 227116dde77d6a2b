// Batch-invariant prefill GEMM on Hopper's warpgroup tensor-core path (invariant_gemm.h,
// prefill_gemm_wgmma_bf16): y[r, n] = x[r, :] . w[n, :] (+ bias[n]) for any row count, with the decode
// GEMM's per-element reduction order (decode_gemm.cu):
//   - K in 64-wide chunks (k >= K zero-filled, 4 k16 steps per chunk, the last chunk included);
//   - the chunks in S = decode_gemm_splits(N, K) contiguous splits, split s = chunks
//     [s * KC / S, (s + 1) * KC / S);
//   - inside a split ONE fp32 chain from 0 of m64nNk16 wgmma steps in ascending k;
//   - the split partials folded in order: total = p_0, total = total + p_1, ..., then total + bias,
//     then one rounding (__float2bfloat16_rn; fp32 out: stored as is).
// This equals the decode GEMM's bits exactly when a wgmma k16 step rounds like an mma.sync m16n8k16
// step for the same accumulator and operands: tests/cuda/wgmma_probe_test.cu checks that on the
// device, and invariant_gemm_test's WgmmaMatchesDecode compares whole rows.
//
// Block: 384 threads, a 128 x BN output tile (BN = 128 or 192), persistent over the tiles of the live
// rows (grouped raster: kGroupM row tiles sweep the column tiles together, for L2 reuse of W).
//  - warpgroup 0, the producer (registers given up with setmaxnreg): one warp fills a ring of STAGES
//    stages, each the 128 x 64 x-tile and the BN x 64 w-tile of one K chunk, by bulk tensor copies
//    (TMA, 128-byte swizzle, zero fill past K and past N) completing on the stage's full mbarrier.
//    A row tile that holds the live-row boundary is copied by the warp's lanes instead, by cp.async
//    with zero fill for rows >= live (never read) and k >= K, STAGES - 2 chunks in flight per lane;
//    a lane arrives on a chunk's full barrier once its copies have landed and are fenced for the
//    async proxy.
//  - warpgroups 1 and 2, the consumers: 64 rows each, all BN columns; per chunk 4 wgmma (both
//    operands from shared memory), one commit group; the previous chunk's stage is released once
//    its group completes (wait_group 1). At a split's end the group is drained (wait_group 0) and
//    the split's accumulator folded into the running total in registers (acc and total: BN floats
//    per thread), then zeroed for the next split. The epilogue adds the bias, rounds and stores
//    from registers, rows < live and columns < N only.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <algorithm>
#include <mutex>
#include <string>

#include "core/error.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/gemm_epilogue.cuh"
#include "ops/cuda/invariant_gemm.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/tma_map.h"
#include "ops/cuda/tma_pipeline.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/wgmma_ss.cuh"

namespace moefold::cuda {
namespace {

using namespace ptx;

constexpr int kBM = 128, kBK = 64, kThreads = 384, kGroupM = 16;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 * 40 + 256 * 232 <= 65536
constexpr int kProducerThreads = 128;                    // warpgroup 0

template <int BN_>
struct WCfg {
  static constexpr int BN = BN_;
  static constexpr int STAGES = BN == 128 ? 6 : 5;
  static constexpr uint32_t A_BYTES = kBM * kBK * 2, B_BYTES = BN * kBK * 2;
  static constexpr uint32_t STAGE_BYTES = A_BYTES + B_BYTES;  // a multiple of 1024 (swizzle atoms)
  static constexpr uint32_t BAR_OFF = STAGES * STAGE_BYTES;
  static constexpr size_t SMEM = size_t(BAR_OFF) + 2 * STAGES * 8 + 1024;  // + alignment slack
  static constexpr int ACC = BN / 2;                                       // fp32 accumulators per thread
  static_assert(SMEM <= 227 * 1024, "shared memory");
};

struct WParams {
  const __nv_bfloat16* x;
  const void* bias;  // bf16 (bf16 out) or fp32 (fp32 out), may be null
  void* y;
  const int32_t* live_rows;
  int64_t x_stride, y_stride, max_rows;
  bool pair_stores;
  int K, N, S, KC, col_tiles;
};

using gemm_epilogue::store_pair;

template <int BN, class OutT>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw,
                              const WParams p) {
  pdl_begin();
  using C = WCfg<BN>;
  constexpr int STAGES = C::STAGES, ACC = C::ACC;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t sbase = smem_u32(base);
  auto stage_a = [&](int st) { return sbase + uint32_t(st) * C::STAGE_BYTES; };
  auto stage_b = [&](int st) { return sbase + uint32_t(st) * C::STAGE_BYTES + C::A_BYTES; };
  auto full = [&](int st) { return sbase + C::BAR_OFF + uint32_t(st) * 8u; };
  auto empty = [&](int st) { return sbase + C::BAR_OFF + uint32_t(STAGES + st) * 8u; };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wgi = warp >> 2;
  const int64_t live = detail::live_count(p.live_rows, p.max_rows);
  const int row_tiles = int((live + kBM - 1) / kBM);
  const int total = row_tiles * p.col_tiles;

  if (tid == 0) {
#pragma unroll 1
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(full(st), kProducerThreads + 1);  // the producer threads + thread 0's byte count
      mbar_init(empty(st), 8);  // one arrival per consumer warp
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wgi == 0) {  // ---- producer ----
    setmaxnreg_dec<kProducerRegs>();
    // A boundary tile's x chunks go by cp.async (zero fill, no read, for rows >= live and k >= K), 8 a
    // thread, kLag chunks in flight per thread: once a thread's copies of chunk c - kLag have landed it
    // fences them for the async proxy and arrives on that chunk's full barrier (128 thread arrivals +
    // thread 0's byte count; a TMA chunk gets the same 128 arrivals at once).
    constexpr int kLag = STAGES - 2;
    int st = 0, lag_st = 0, pending = 0;
    uint32_t ph = 0;
    auto land = [&](auto wait) {  // chunk lag_st's copies have landed (wait): hand it to the consumers
      wait();
      wg::fence_proxy_async();
      mbar_arrive(full(lag_st));
      if (++lag_st == STAGES) lag_st = 0;
    };
#pragma unroll 1
    for (int t = int(blockIdx.x); t < total; t += int(gridDim.x)) {
      int mt, nt;
      tma::raster<kGroupM>(t, row_tiles, p.col_tiles, mt, nt);
      const int64_t m0 = int64_t(mt) * kBM;
      const int n0 = nt * BN;
      const int rows_here = int(live - m0 < kBM ? live - m0 : int64_t(kBM));
      const bool tma_x = rows_here == kBM;
#pragma unroll 1
      for (int c = 0; c < p.KC; ++c) {
        mbar_wait(empty(st), ph ^ 1);
        const int k0 = c * kBK;
        if (tid == 0) {
          mbar_arrive_expect_tx(full(st), C::B_BYTES + (tma_x ? C::A_BYTES : 0u));
          if (tma_x) tma::tma_2d(stage_a(st), &tmx, full(st), k0, int(m0));
          tma::tma_2d(stage_b(st), &tmw, full(st), k0, n0);
        }
        if (tma_x) {
          mbar_arrive(full(st));
        } else {  // the boundary row tile
          const uint32_t dst = stage_a(st);
#pragma unroll
          for (int idx = tid; idx < kBM * 8; idx += kProducerThreads) {
            const int r = idx >> 3, ch = idx & 7, k = k0 + ch * 8;
            const bool valid = r < rows_here && k < p.K;
            tma::cp_async16_zfill(dst + uint32_t(r * 128 + ((ch ^ (r & 7)) << 4)),
                                  valid ? p.x + (m0 + r) * p.x_stride + k : p.x, valid);
          }
          cp_async_commit();
          if (pending == 0) lag_st = st;
          if (pending == kLag) land([] { cp_async_wait<kLag>(); });
          else ++pending;
        }
        if (++st == STAGES) st = 0, ph ^= 1;
      }
      // The tile's chunks still in flight, before a tile of the other kind (or the end).
      if (!tma_x)
        for (; pending > 0; --pending) land([] { cp_async_wait<0>(); });
    }
    return;
  }

  // ---- consumers: warpgroup cw owns rows cw * 64 .. + 63 of the tile ----
  setmaxnreg_inc<kConsumerRegs>();
  const int cw = wgi - 1, w4 = warp & 3, g = lane >> 2, tig = lane & 3;
  float acc[ACC], sum[ACC];
#pragma unroll
  for (int i = 0; i < ACC; ++i) acc[i] = sum[i] = 0.0f;
  int st = 0;
  uint32_t ph = 0;
#pragma unroll 1
  for (int t = int(blockIdx.x); t < total; t += int(gridDim.x)) {
    int mt, nt;
    tma::raster<kGroupM>(t, row_tiles, p.col_tiles, mt, nt);
    const int64_t m0 = int64_t(mt) * kBM;
    const int n0 = nt * BN;
    // Split s covers chunks [s * KC / S, (s + 1) * KC / S): its chain starts from zero, and once its
    // last group has completed the partial is folded (sum = p_0, then sum + p_s) as the decode GEMM's
    // combine adds them. (Straight-line folds outside the chunk loop: accumulator registers are
    // touched only while no wgmma is in flight, so ptxas needs no extra waits.)
    int c = 0;
#pragma unroll 1
    for (int s = 0; s < p.S; ++s) {
      const int c_end = int((int64_t(s + 1) * p.KC) / p.S);
#pragma unroll
      for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
      int prev = -1;  // the stage whose wgmma group may still be reading
#pragma unroll 1
      for (; c < c_end; ++c) {
        mbar_wait(full(st), ph);
        wg::fence();
        const uint64_t da = wg::desc_sw128(stage_a(st) + uint32_t(cw * 64 * 128));
        const uint64_t db = wg::desc_sw128(stage_b(st));
#pragma unroll
        for (int ks = 0; ks < kBK / 16; ++ks) wgss::mma(acc, da + uint64_t(ks * 2), db + uint64_t(ks * 2));
        wg::commit();
        wg::wait<1>();  // the previous chunk's group is done: its stage is free
        if (prev >= 0) tma::mbar_arrive_lane0(empty(prev), lane);
        prev = st;
        if (++st == STAGES) st = 0, ph ^= 1;
      }
      wg::wait<0>();
      wg::fence_regs(acc);
      if (prev >= 0) tma::mbar_arrive_lane0(empty(prev), lane);
#pragma unroll
      for (int i = 0; i < ACC; ++i) sum[i] = s == 0 ? acc[i] : sum[i] + acc[i];
    }
    // Epilogue: fragment (j, h) of warp w4 holds row w4 * 16 + g + 8h, columns 8j + 2 tig, + 1.
    wg::fence_regs(sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = m0 + cw * 64 + w4 * 16 + g + 8 * h;
      if (row >= live) continue;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
        store_pair<OutT>(p, row, n0 + 8 * j + 2 * tig, sum[4 * j + 2 * h], sum[4 * j + 2 * h + 1]);
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

/// Column-tile width for N: 192 (fewer shared-memory bytes per flop) unless its last tile would
/// waste more than 5% of the columns, else 128.
int auto_tile_n(int64_t N) { return ceil_div(N, 192) * 192 * 100 <= N * 105 ? 192 : 128; }

const prof::Kernel kWgmmaBf16{"prefill_gemm_wgmma_kernel", prof::Category::DenseGemm};
const prof::Kernel kWgmmaF32{"prefill_gemm_wgmma_kernel:f32out", prof::Category::DenseGemm};

template <int BN, class OutT>
void launch(const CUtensorMap& mx, const CUtensorMap& mw, const WParams& p, int64_t blocks, cudaStream_t stream) {
  using C = WCfg<BN>;
  auto* k = prefill_gemm_wgmma_kernel<BN, OutT>;
  static std::once_flag once;
  std::call_once(once, [k] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::SMEM)));
  });
  launch_pdl(k, dim3(unsigned(blocks)), dim3(kThreads), C::SMEM, stream, mx, mw, p);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

template <class OutT>
void run(const char* name, const __nv_bfloat16* x, const __nv_bfloat16* w, const void* bias, OutT* y,
         int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream, int64_t x_stride,
         int64_t y_stride, int tile_n) {
  const int64_t xs = x_stride ? x_stride : K, ys = y_stride ? y_stride : N;
  auto shape = [&] {
    return std::string(name) + "(max_rows=" + std::to_string(max_rows) + ", K=" + std::to_string(K) +
           ", N=" + std::to_string(N) + ", x_stride=" + std::to_string(xs) + ", y_stride=" + std::to_string(ys) + ")";
  };
  if (max_rows < 0 || max_rows > (int64_t(1) << 31) - kBM) throw Error(shape() + ": max_rows must be in [0, 2^31 - 128]");
  if (N < 1 || N > (int64_t(1) << 30)) throw Error(shape() + ": N must be in [1, 2^30]");
  if (K < 8 || K % 8 != 0 || K > (int64_t(1) << 30)) throw Error(shape() + ": K must be a positive multiple of 8");
  if (xs < K || ys < N) throw Error(shape() + ": row strides must be >= the row lengths");
  if (xs % 8 != 0) throw Error(shape() + ": x_stride must keep rows of x 16-byte aligned (x_stride % 8)");
  if (tile_n != 0 && tile_n != 128 && tile_n != 192) throw Error(shape() + ": tile_n must be 0, 128 or 192");
  if (max_rows == 0) return;
  if (!x || !w || !y) throw Error(shape() + ": null x, w or y");
  if (!aligned16(x) || !aligned16(w)) throw Error(shape() + ": x and w must be 16-byte aligned");
  const int bn = tile_n ? tile_n : auto_tile_n(N);
  WParams p{};
  p.x = x;
  p.bias = bias;
  p.y = y;
  p.live_rows = live_rows;
  p.x_stride = xs;
  p.y_stride = ys;
  p.max_rows = max_rows;
  p.pair_stores = ys % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (2 * sizeof(OutT)) == 0;
  p.K = int(K);
  p.N = int(N);
  p.S = decode_gemm_splits(N, K);
  p.KC = int(ceil_div(K, kBK));
  p.col_tiles = int(ceil_div(N, bn));
  const int64_t tiles = ceil_div(max_rows, kBM) * p.col_tiles;
  if (tiles >= (int64_t(1) << 31)) throw Error(shape() + ": too many tiles");
  const int64_t blocks = std::min<int64_t>(tiles, device_sm_count());
  const CUtensorMap mx = tma_map_2d_bf16(x, max_rows, K, xs, kBM, name);
  const CUtensorMap mw = tma_map_2d_bf16(w, N, K, K, bn, name);
  LaunchScope scope(std::is_same_v<OutT, float> ? kWgmmaF32 : kWgmmaBf16, stream, [&] {
    const double rows = double(work_rows(max_rows, live_rows));
    return prof::Work{double(N) * K * 2 + rows * (double(K) * 2 + double(N) * sizeof(OutT)),
                      2.0 * rows * double(N) * double(K)};
  });
  if (bn == 192) launch<192, OutT>(mx, mw, p, blocks, stream);
  else launch<128, OutT>(mx, mw, p, blocks, stream);
}

}  // namespace

void prefill_gemm_wgmma_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                             __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                             cudaStream_t stream, int64_t x_stride, int64_t y_stride, int tile_n) {
  run<__nv_bfloat16>("prefill_gemm_wgmma_bf16", x, w, bias, y, max_rows, K, N, live_rows, stream, x_stride,
                     y_stride, tile_n);
}

void prefill_gemm_wgmma_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                                    int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                                    cudaStream_t stream, int64_t x_stride, int64_t y_stride, int tile_n) {
  run<float>("prefill_gemm_wgmma_bf16_f32out", x, w, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride,
             tile_n);
}

}  // namespace moefold::cuda
