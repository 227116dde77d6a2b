// Block-scaled FP8 dense GEMV for decode steps and the FP8 -> bf16 dequantisation (see fp8_gemv.h).
// A block of 8 warps owns 16 output columns (2 weight rows a warp: 2 x U 16-byte loads in flight per
// lane); blocks walk the column groups grid-stride, the grid being the resident block count. Rows are
// taken 8 at a time (NP = 1, 2, 4 or 8 per pass, by the live count), each pass one warp_dots_fp8.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/fp8_gemv.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
namespace {

using bf16 = __nv_bfloat16;
using detail::live_count;

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2, kCols = kWarps * kRowsPerWarp;
constexpr int kPassRows = 8;

const prof::Kernel kFp8Gemv{"fp8_gemv_kernel", prof::Category::DenseGemm};
const prof::Kernel kFp8Dequant{"fp8_dequant_bf16_kernel", prof::Category::Glue};

struct Args {
  const bf16* x;
  const uint8_t* w;
  const float* scale;
  const bf16* bias;
  bf16* y;
  int64_t K, N, x_stride, y_stride;
  const int32_t* live;
  int max_rows;
};

template <int NP, int U>
__device__ __forceinline__ void pass(const Args& a, int64_t c0, int nr, int r0, int n) {
  const int lane = threadIdx.x & 31;
  const int KB = int((a.K + fp8::kBlock - 1) / fp8::kBlock);
  float acc[kRowsPerWarp][NP];
  // A warp with one valid column reads row c0 twice (the second result is discarded).
  const int64_t rstride = nr > 1 ? a.K : 0, sstride = nr > 1 ? KB : 0;
  fp8::warp_dots_fp8<kRowsPerWarp, NP, U>(
      a.w + c0 * a.K, rstride, a.scale + c0 * KB, sstride, [&](int p) { return a.x + int64_t(r0 + p) * a.x_stride; },
      n, int(a.K), acc);
#pragma unroll
  for (int p = 0; p < NP; ++p)
    if (p < n && lane == p)
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        if (r < nr) {
          float v = acc[r][p];
          if (a.bias) v += __bfloat162float(a.bias[c0 + r]);
          a.y[int64_t(r0 + p) * a.y_stride + c0 + r] = __float2bfloat16_rn(v);
        }
}

__global__ void __launch_bounds__(kThreads, 2) fp8_gemv_kernel(const Args a) {
  pdl_begin();
  const int live = int(live_count(a.live, a.max_rows));
  if (live <= 0) return;
  const int warp = int(threadIdx.x >> 5);
  const int64_t groups = (a.N + kCols - 1) / kCols;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t c0 = g * kCols + warp * kRowsPerWarp;
    if (c0 >= a.N) continue;  // warp-uniform
    const int nr = a.N - c0 < kRowsPerWarp ? int(a.N - c0) : kRowsPerWarp;
    for (int r0 = 0; r0 < live; r0 += kPassRows) {
      const int n = live - r0 < kPassRows ? live - r0 : kPassRows;
      if (n <= 1) pass<1, 4>(a, c0, nr, r0, n);
      else if (n <= 2) pass<2, 4>(a, c0, nr, r0, n);
      else if (n <= 4) pass<4, 2>(a, c0, nr, r0, n);
      else pass<8, 2>(a, c0, nr, r0, n);
    }
  }
}

__global__ void fp8_dequant_bf16_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scale, int64_t rows,
                                        int64_t cols, bf16* __restrict__ out) {
  pdl_begin();
  const int64_t KB = (cols + fp8::kBlock - 1) / fp8::kBlock, n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const uint32_t b = w[i];
    const float2 f = fp8::e4m3x2_scaled(b, 0x1404u);  // low byte -> low half
    out[i] = __float2bfloat16_rn(f.x * (scale[r * KB + c / fp8::kBlock] * fp8::kHalfBias));
  }
}

int resident_blocks() {
  static const int n = [] {
    int dev = 0, sms = 0, per_sm = 0;
    MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
    MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    MOEFOLD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fp8_gemv_kernel, kThreads, 0));
    return std::max(1, sms * std::max(1, per_sm));
  }();
  return n;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool fp8_gemv_supported(int64_t K, const void* x, int64_t x_stride, const void* w) {
  return K >= 16 && K % 16 == 0 && aligned16(x) && aligned16(w) && (x_stride ? x_stride : K) % 8 == 0;
}

void fp8_gemv(const bf16* x, const uint8_t* w, const float* scale, const bf16* bias, bf16* y, int64_t max_rows,
              int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream, int64_t x_stride,
              int64_t y_stride) {
  MOEFOLD_CHECK(max_rows >= 0 && max_rows <= kFp8GemvMaxRows && N >= 1 && K >= 1 && K < (int64_t(1) << 30),
                "fp8_gemv: unsupported sizes max_rows={} K={} N={}", max_rows, K, N);
  if (max_rows == 0) return;
  MOEFOLD_CHECK(x && w && scale && y, "fp8_gemv: null pointer");
  MOEFOLD_CHECK(fp8_gemv_supported(K, x, x_stride, w),
                "fp8_gemv: needs K % 16 == 0 (K={}), 16-byte aligned x and w and x_stride % 8 == 0", K);
  Args a{x, w, scale, bias, y, K, N, x_stride ? x_stride : K, y_stride ? y_stride : N, live_rows, int(max_rows)};
  MOEFOLD_CHECK(a.y_stride >= N && a.x_stride >= K, "fp8_gemv: strides below the row sizes");
  const int64_t groups = (N + kCols - 1) / kCols;
  LaunchScope launch(kFp8Gemv, stream, [&] {
    const double rows = double(work_rows(max_rows, live_rows)), kb = double((K + 127) / 128);
    return prof::Work{double(N) * double(K) + double(N) * kb * 4 + rows * double(K) * 2 + rows * double(N) * 2,
                      2.0 * rows * double(K) * double(N)};
  });
  const int grid = int(std::min<int64_t>(groups, resident_blocks()));
  launch_pdl(fp8_gemv_kernel, dim3(grid), dim3(kThreads), 0, stream, a);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

void fp8_dequantize_bf16(const uint8_t* w, const float* scale, int64_t rows, int64_t cols, bf16* out,
                         cudaStream_t stream) {
  MOEFOLD_CHECK(rows >= 0 && cols >= 1, "fp8_dequantize_bf16: bad sizes rows={} cols={}", rows, cols);
  if (rows == 0) return;
  MOEFOLD_CHECK(w && scale && out, "fp8_dequantize_bf16: null pointer");
  LaunchScope launch(kFp8Dequant, stream, [&] {
    return prof::Work{double(rows) * double(cols) * 3 + double(rows) * double((cols + 127) / 128) * 4, 0};
  });
  const int64_t n = rows * cols;
  const int grid = int(std::min<int64_t>((n + 255) / 256, 132 * 16));
  launch_pdl(fp8_dequant_bf16_kernel, dim3(grid), dim3(256), 0, stream, w, scale, rows, cols, out);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
