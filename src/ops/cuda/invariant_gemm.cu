// Batch-invariant GEMM for any row count (invariant_gemm.h): the decode GEMM's per-element arithmetic
// (decode_gemm.cu: 64-wide K chunks, S(N, K) contiguous splits, one mma.sync m16n8k16 chain per split
// in ascending k, partials added in split order, bias, one rounding) with 128 x 128 block tiles.
//
// The element chain must match decode_gemm_kernel's step for step: the same mma instruction, the same
// k16 steps (4 per chunk, zero-filled past K the same way), the same fragment layout (ldmatrix of a
// [rows, 64] tile swizzled by (row & 7)), the same fold `sum = (s == 0) ? p_0 : sum + p_s`, then
// `v + bias` and __float2bfloat16_rn. The tile shape does not enter an element's arithmetic.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/gemm_epilogue.cuh"
#include "ops/cuda/decode_gemm_wgmma.h"
#include "ops/cuda/invariant_gemm.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"

namespace moefold::cuda {
namespace {

using namespace ptx;

constexpr int kBK = 64;        // K chunk (the decode GEMM's; split boundaries are chunk boundaries)
constexpr int kBM = 128;       // rows per block
constexpr int kBN = 128;       // columns per block
constexpr int kWarpsM = 2;     // warps along rows (each 64 rows = 4 M-tiles of 16)
constexpr int kWarpsN = 4;     // warps along columns (each 32 columns = 4 n8 fragments)
constexpr int kMTW = kBM / 16 / kWarpsM;
constexpr int kNF = kBN / 8 / kWarpsN;
constexpr int kThreads = kWarpsM * kWarpsN * 32;
constexpr int kStages = 4;
constexpr int kGroupM = 8;     // row tiles per raster group (L2 reuse of the weight tiles)
constexpr size_t kSmem = size_t(kStages) * (kBM + kBN) * kBK * sizeof(__nv_bfloat16);

struct Params {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  const void* bias;
  void* y;
  const int32_t* live_rows;
  int64_t x_stride, y_stride;
  bool pair_stores;
  int64_t max_rows;
  int K, N, S, KC;
  int row_tiles, col_tiles;
};

__device__ __forceinline__ int swz(int r, int ch) { return r * kBK + ((ch ^ (r & 7)) << 3); }

using gemm_epilogue::store_pair;

// kPipe: all fragments of a k16 step are loaded before its 16 mma, and the next step's fragments
// before this step's mma (double-buffered registers): the asm is volatile, so issue order is source
// order, and without this every mma group waits for its ldmatrix. Same arithmetic either way.
template <class OutT, bool kPipe>
__global__ void __launch_bounds__(kThreads, 1) prefill_gemm_kernel(const Params p) {
  pdl_begin();
  const int64_t live = detail::live_count(p.live_rows, p.max_rows);

  // Grouped raster: kGroupM row tiles share a sweep over the column tiles.
  const int pid = int(blockIdx.x);
  const int per_group = kGroupM * p.col_tiles;
  const int first_m = (pid / per_group) * kGroupM;
  const int gsize = min(p.row_tiles - first_m, kGroupM);
  const int mtile = first_m + (pid % per_group) % gsize;
  const int ntile = (pid % per_group) / gsize;
  const int64_t m0 = int64_t(mtile) * kBM;
  if (m0 >= live) return;
  const int n0 = ntile * kBN;
  const int rows_here = int(live - m0 < kBM ? live - m0 : int64_t(kBM));
  const int mt_live = (rows_here + 15) >> 4;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sX = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sW = sX + kStages * kBM * kBK;
  const int tid = threadIdx.x;
  const __nv_bfloat16* xb = p.x + m0 * p.x_stride;

  auto load_stage = [&](int stage, int chunk) {
    __nv_bfloat16* xd = sX + stage * kBM * kBK;
    __nv_bfloat16* wd = sW + stage * kBN * kBK;
    const int k0 = chunk * kBK;
#pragma unroll
    for (int c = tid; c < kBN * 8; c += kThreads) {
      const int r = c >> 3, ch = c & 7;
      const int n = n0 + r, k = k0 + ch * 8;
      const bool ok = n < p.N && k < p.K;
      cp_async16(wd + swz(r, ch), ok ? p.w + int64_t(n) * p.K + k : p.w, ok);
    }
#pragma unroll
    for (int c = tid; c < kBM * 8; c += kThreads) {
      const int r = c >> 3, ch = c & 7;
      const int k = k0 + ch * 8;
      const bool ok = r < rows_here && k < p.K;
      cp_async16(xd + swz(r, ch), ok ? xb + int64_t(r) * p.x_stride + k : p.x, ok);
    }
  };

  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp % kWarpsM, wn = warp / kWarpsM;

  float acc[kMTW][kNF][4], sum[kMTW][kNF][4];
#pragma unroll
  for (int i = 0; i < kMTW; ++i)
#pragma unroll
    for (int j = 0; j < kNF; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = sum[i][j][q] = 0.0f;

  // Split s covers chunks [s * KC / S, (s + 1) * KC / S); after the chunk that ends split s, its
  // partial (acc) is folded into sum and acc restarts from zero, as decode_gemm's combine adds them.
  int split = 0;
  auto split_end = [&](int s) { return int((int64_t(s + 1) * p.KC) / p.S); };
  int next_end = split_end(0);  // the chunk count that ends split `split`
  auto fold_through = [&](int chunks_done) {
    while (split < p.S && next_end == chunks_done) {
#pragma unroll
      for (int i = 0; i < kMTW; ++i)
#pragma unroll
        for (int j = 0; j < kNF; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            sum[i][j][q] = split == 0 ? acc[i][j][q] : sum[i][j][q] + acc[i][j][q];
            acc[i][j][q] = 0.0f;
          }
      ++split;
      next_end = split < p.S ? split_end(split) : -1;
    }
  };
  fold_through(0);  // empty leading splits (none with the decode GEMM's S <= KC / 2; kept for exactness)

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < p.KC) load_stage(s, s);
    cp_async_commit();
  }

  for (int it = 0; it < p.KC; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int nk = it + kStages - 1;
      if (nk < p.KC) load_stage(nk % kStages, nk);
      cp_async_commit();
    }
    const __nv_bfloat16* xs = sX + (it % kStages) * kBM * kBK;
    const __nv_bfloat16* ws = sW + (it % kStages) * kBN * kBK;
    if constexpr (kPipe) {
      uint32_t af[2][kMTW][4], bfr[2][kNF][2];
      auto load_frags = [&](int buf, int ks) {
#pragma unroll
        for (int j = 0; j < kNF; j += 2) {
          const int f = (lane >> 4) ? j + 1 : j;
          const int r = (wn * kNF + f) * 8 + (lane & 7);
          uint32_t t[4];
          ldmatrix_x4(t, ws + swz(r, ks * 2 + ((lane >> 3) & 1)));
          bfr[buf][j][0] = t[0];
          bfr[buf][j][1] = t[1];
          bfr[buf][j + 1][0] = t[2];
          bfr[buf][j + 1][1] = t[3];
        }
#pragma unroll
        for (int i = 0; i < kMTW; ++i)
          if (wm * kMTW + i < mt_live) ldmatrix_x4(af[buf][i], xs + swz((wm * kMTW + i) * 16 + (lane & 15), ks * 2 + (lane >> 4)));
      };
      load_frags(0, 0);
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        if (ks + 1 < kBK / 16) load_frags((ks + 1) & 1, ks + 1);
#pragma unroll
        for (int i = 0; i < kMTW; ++i)
          if (wm * kMTW + i < mt_live)
#pragma unroll
            for (int j = 0; j < kNF; ++j) mma_bf16_16816(acc[i][j], af[ks & 1][i], bfr[ks & 1][j][0], bfr[ks & 1][j][1]);
      }
    } else {
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t bfr[kNF][2];
#pragma unroll
      for (int j = 0; j < kNF; j += 2) {
        const int f = (lane >> 4) ? j + 1 : j;
        const int r = (wn * kNF + f) * 8 + (lane & 7);
        uint32_t t[4];
        ldmatrix_x4(t, ws + swz(r, ks * 2 + ((lane >> 3) & 1)));
        bfr[j][0] = t[0];
        bfr[j][1] = t[1];
        bfr[j + 1][0] = t[2];
        bfr[j + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < kMTW; ++i) {
        const int mt = wm * kMTW + i;
        if (mt < mt_live) {  // warp-uniform
          uint32_t af[4];
          ldmatrix_x4(af, xs + swz(mt * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
          for (int j = 0; j < kNF; ++j) mma_bf16_16816(acc[i][j], af, bfr[j][0], bfr[j][1]);
        }
      }
    }
    }
    fold_through(it + 1);
  }
  cp_async_wait_all();

  const int g = lane >> 2, lc = (lane & 3) * 2;
#pragma unroll
  for (int i = 0; i < kMTW; ++i) {
    const int mt = wm * kMTW + i;
    if (mt >= mt_live) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + g + h * 8;
      if (r >= rows_here) continue;
#pragma unroll
      for (int j = 0; j < kNF; ++j)
        store_pair<OutT>(p, m0 + r, n0 + (wn * kNF + j) * 8 + lc, sum[i][j][2 * h], sum[i][j][2 * h + 1]);
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

const prof::Kernel kPrefillGemmBf16{"prefill_gemm_kernel", prof::Category::DenseGemm};
const prof::Kernel kPrefillGemmF32{"prefill_gemm_kernel:f32out", prof::Category::DenseGemm};

template <class OutT, bool kPipe = true>
void run(const char* name, const __nv_bfloat16* x, const __nv_bfloat16* w, const void* bias, OutT* y,
         int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream, int64_t x_stride,
         int64_t y_stride) {
  const int64_t xs = x_stride ? x_stride : K, ys = y_stride ? y_stride : N;
  auto shape = [&] {
    return std::string(name) + "(max_rows=" + std::to_string(max_rows) + ", K=" + std::to_string(K) +
           ", N=" + std::to_string(N) + ", x_stride=" + std::to_string(xs) + ", y_stride=" + std::to_string(ys) + ")";
  };
  if (max_rows < 0) throw Error(shape() + ": max_rows must be >= 0");
  if (N < 1 || N > (int64_t(1) << 30)) throw Error(shape() + ": N must be in [1, 2^30]");
  if (K < 8 || K % 8 != 0 || K > (int64_t(1) << 30)) throw Error(shape() + ": K must be a positive multiple of 8");
  if (xs < K || ys < N) throw Error(shape() + ": row strides must be >= the row lengths");
  if (xs % 8 != 0) throw Error(shape() + ": x_stride must keep rows of x 16-byte aligned (x_stride % 8)");
  if (max_rows == 0) return;
  if (!x || !w || !y) throw Error(shape() + ": null x, w or y");
  if (!aligned16(x) || !aligned16(w)) throw Error(shape() + ": x and w must be 16-byte aligned");
  Params p{};
  p.x = x;
  p.w = w;
  p.bias = bias;
  p.y = y;
  p.live_rows = live_rows;
  p.x_stride = xs;
  p.y_stride = ys;
  p.pair_stores = ys % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (2 * sizeof(OutT)) == 0;
  p.max_rows = max_rows;
  p.K = int(K);
  p.N = int(N);
  p.S = decode_gemm_splits(N, K);
  p.KC = int(ceil_div(K, kBK));
  p.row_tiles = int(ceil_div(max_rows, kBM));
  p.col_tiles = int(ceil_div(N, kBN));
  const int64_t blocks = int64_t(p.row_tiles) * p.col_tiles;
  if (blocks >= (int64_t(1) << 31)) throw Error(shape() + ": too many tiles");
  auto* kern = prefill_gemm_kernel<OutT, kPipe>;
  static const bool attr_set = [&] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return true;
  }();
  (void)attr_set;
  LaunchScope scope(std::is_same_v<OutT, float> ? kPrefillGemmF32 : kPrefillGemmBf16, stream, [&] {
    const double rows = double(max_rows);
    return prof::Work{double(N) * K * 2 + rows * (double(K) * 2 + double(N) * sizeof(OutT)),
                      2.0 * rows * double(N) * double(K)};
  });
  launch_pdl(kern, dim3(unsigned(blocks)), dim3(kThreads), kSmem, stream, p);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace

void prefill_gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                       int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
                       int64_t x_stride, int64_t y_stride) {
  run<__nv_bfloat16>("prefill_gemm_bf16", x, w, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride);
}

void prefill_gemm_bf16_unpipelined(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                   __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                                   cudaStream_t stream, int64_t x_stride, int64_t y_stride) {
  run<__nv_bfloat16, false>("prefill_gemm_bf16_unpipelined", x, w, bias, y, max_rows, K, N, live_rows, stream,
                            x_stride, y_stride);
}

void prefill_gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                              int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
                              int64_t x_stride, int64_t y_stride) {
  run<float>("prefill_gemm_bf16_f32out", x, w, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride);
}

InvariantGemmPath invariant_gemm_path() {
  static const InvariantGemmPath path = [] {
    const char* v = std::getenv("MOEFOLD_INVARIANT_GEMM");
    if (!v || !*v || std::strcmp(v, "wgmma") == 0) return InvariantGemmPath::Wgmma;
    if (std::strcmp(v, "mma") == 0) return InvariantGemmPath::Mma;
    if (std::strcmp(v, "wgmma_all") == 0) return InvariantGemmPath::WgmmaAll;
    throw Error(std::string("MOEFOLD_INVARIANT_GEMM='") + v + "': expected mma, wgmma or wgmma_all");
  }();
  return path;
}

int64_t invariant_gemm_wgmma_min_rows() {
  static const int64_t rows = [] {
    const char* v = std::getenv("MOEFOLD_WGMMA_MIN_ROWS");
    if (!v || !*v) return int64_t(0);
    char* end = nullptr;
    const long long r = std::strtoll(v, &end, 10);
    if (end == v || *end != '\0' || r < 1)
      throw Error(std::string("MOEFOLD_WGMMA_MIN_ROWS='") + v + "': expected a row count >= 1");
    return int64_t(r);
  }();
  return rows;
}

namespace {
/// Whether a call of max_rows rows takes the decode-range kernel (else the prefill-range one).
bool decode_range(int64_t max_rows, InvariantGemmPath path) {
  if (max_rows > kDecodeGemmMaxRows) return false;
  if (path != InvariantGemmPath::Wgmma) return true;
  const int64_t min_rows = invariant_gemm_wgmma_min_rows();
  return max_rows < (min_rows > 0 ? min_rows : kWgmmaDefaultMinRows);
}
}  // namespace

void invariant_gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                         int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                         cudaStream_t stream, int64_t x_stride, int64_t y_stride) {
  const InvariantGemmPath path = invariant_gemm_path();
  if (decode_range(max_rows, path)) {
    if (path == InvariantGemmPath::WgmmaAll)
      decode_gemm_wgmma_bf16(x, w, bias, y, max_rows, K, N, live_rows, workspace, stream, x_stride, y_stride);
    else
      decode_gemm_bf16(x, w, bias, y, max_rows, K, N, live_rows, workspace, stream, x_stride, y_stride);
  } else if (path != InvariantGemmPath::Mma) {
    prefill_gemm_wgmma_bf16(x, w, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride);
  } else {
    prefill_gemm_bf16(x, w, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride);
  }
}

void invariant_gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                                int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                                cudaStream_t stream, int64_t x_stride, int64_t y_stride) {
  const InvariantGemmPath path = invariant_gemm_path();
  if (decode_range(max_rows, path)) {
    if (path == InvariantGemmPath::WgmmaAll)
      decode_gemm_wgmma_bf16_f32out(x, w, bias, y, max_rows, K, N, live_rows, workspace, stream, x_stride, y_stride);
    else
      decode_gemm_bf16_f32out(x, w, bias, y, max_rows, K, N, live_rows, workspace, stream, x_stride, y_stride);
  } else if (path != InvariantGemmPath::Mma) {
    prefill_gemm_wgmma_bf16_f32out(x, w, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride);
  } else {
    prefill_gemm_bf16_f32out(x, w, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride);
  }
}

}  // namespace moefold::cuda
