// Block-scaled FP8 dense GEMV for decode steps and the FP8 -> bf16 dequantisation (see fp8_gemv.h).
// A block of 8 warps owns 16 output columns (2 weight rows a warp: 2 x U 16-byte loads in flight per
// lane); blocks walk the column groups grid-stride, the grid being the resident block count. Rows are
// taken 8 at a time (NP = 1, 2, 4 or 8 per pass, by the live count), each pass one warp_dots_fp8.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cuda_fp8.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/fp8_mma.cuh"
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

const prof::Kernel kFp8Gemv{"fp8_gemv_simt_kernel", prof::Category::DenseGemm};
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

// ---- tensor-core kernel (fp8_mma.cuh) -------------------------------------------------------------
// A block of 8 warps = WK (along K) x WN (along N) owns WN * 16 output columns; each warp one 16-row
// weight fragment over its K blocks and every token (token groups of 8 NT, one pass each).

const prof::Kernel kFp8Mma{"fp8_gemv_mma_kernel", prof::Category::DenseGemm};
const prof::Kernel kFp8MmaF32{"fp8_gemv_mma_kernel:f32out", prof::Category::DenseGemm};

struct MArgs {
  const bf16* x;
  const uint8_t* w;
  const float* scale;
  const void* bias;  // bf16 (bf16 out) or fp32 (fp32 out)
  void* y;
  int64_t K, N, x_stride, y_stride;
  const int32_t* live;
  int max_rows, wk;
};

template <class OutT>
__device__ __forceinline__ void store_out(const MArgs& a, int64_t row, int64_t col, float v) {
  if constexpr (sizeof(OutT) == 4) {
    if (a.bias) v += static_cast<const float*>(a.bias)[col];
    static_cast<float*>(a.y)[row * a.y_stride + col] = v;
  } else {
    if (a.bias) v += __bfloat162float(static_cast<const bf16*>(a.bias)[col]);
    static_cast<bf16*>(a.y)[row * a.y_stride + col] = __float2bfloat16_rn(v);
  }
}

template <int NT, class OutT>
__global__ void __launch_bounds__(kThreads) fp8_mma_kernel(const MArgs a) {
  pdl_begin();
  extern __shared__ float red[];
  const int live = int(live_count(a.live, a.max_rows));
  if (live <= 0) return;
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int WK = a.wk, WN = kWarps / WK, wk = warp % WK, wn = warp / WK;
  const int K = int(a.K), KB = (K + fp8mma::kBlockK - 1) / fp8mma::kBlockK;
  const int64_t groups = (a.N + WN * 16 - 1) / (WN * 16);
  for (int64_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
    const int64_t r0 = (grp * WN + wn) * 16;
    const uint8_t* row[1][2];
    const float* sc[1][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = r0 + g + 8 * h;
      row[0][h] = n < a.N ? a.w + n * a.K : nullptr;
      sc[0][h] = n < a.N ? a.scale + n * KB : nullptr;
    }
    for (int tok0 = 0; tok0 < live; tok0 += NT * 8) {
      const int nt_live = min(NT, (live - tok0 + 7) / 8);
      auto tok = [&](int nt) -> const bf16* {
        const int p = tok0 + nt * 8 + g;
        return p < live ? a.x + int64_t(p) * a.x_stride : nullptr;
      };
      float acc[1][NT][4];
      fp8mma::warp_mma_fp8<1, NT>(row, sc, tok, nt_live, K, wk, WK, acc);
      fp8mma::block_reduce<1, NT>(acc, red, WK, WN);
      if (wk == 0) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int64_t n = r0 + g + 8 * h;
              const int p = tok0 + nt * 8 + 2 * t + c;
              if (nt < nt_live && n < a.N && p < live) store_out<OutT>(a, p, n, acc[0][nt][2 * h + c]);
            }
      }
    }
  }
}

template <int NT, class OutT>
void launch_mma(const MArgs& a, cudaStream_t stream) {
  auto* kern = fp8_mma_kernel<NT, OutT>;
  const int WN = kWarps / a.wk;
  const size_t smem = size_t(a.wk - 1) * WN * 32 * NT * 4 * sizeof(float);
  static const int per_sm = [&] {
    int dev = 0, sms = 0, b = 0;
    MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
    MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // The largest reduction buffer of this instantiation (WK 8, WN 1) bounds the occupancy.
    MOEFOLD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kern, kThreads, 7 * 32 * NT * 4 * 4));
    return std::max(1, sms * std::max(1, b));
  }();
  const int64_t groups = (a.N + WN * 16 - 1) / (WN * 16);
  launch_pdl(kern, dim3(unsigned(std::min<int64_t>(groups, per_sm))), dim3(kThreads), smem, stream, a);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

template <class OutT>
void run_mma(const char* name, const bf16* x, const uint8_t* w, const float* scale, const void* bias, OutT* y,
             int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream, int64_t x_stride,
             int64_t y_stride) {
  MOEFOLD_CHECK(max_rows >= 0 && max_rows <= kFp8GemvMaxRows && N >= 1 && N < (int64_t(1) << 31) && K >= 1 &&
                    K < (int64_t(1) << 30),
                "{}: unsupported sizes max_rows={} K={} N={}", name, max_rows, K, N);
  if (max_rows == 0) return;
  MOEFOLD_CHECK(x && w && scale && y, "{}: null pointer", name);
  MOEFOLD_CHECK(fp8_gemv_supported(K, x, x_stride, w),
                "{}: needs K % 16 == 0 (K={}), 16-byte aligned x and w and x_stride % 8 == 0", name, K);
  MArgs a{x, w, scale, bias, y, K, N, x_stride ? x_stride : K, y_stride ? y_stride : N, live_rows, int(max_rows),
          fp8mma::warps_along_k(K)};
  MOEFOLD_CHECK(a.y_stride >= N && a.x_stride >= K, "{}: strides below the row sizes", name);
  LaunchScope launch(sizeof(OutT) == 4 ? kFp8MmaF32 : kFp8Mma, stream, [&] {
    const double rows = double(work_rows(max_rows, live_rows)), kb = double((K + 127) / 128);
    return prof::Work{double(N) * double(K) + double(N) * kb * 4 + rows * double(K) * 2 +
                          rows * double(N) * sizeof(OutT),
                      2.0 * rows * double(K) * double(N)};
  });
  // Token fragments per pass by the bucket (none changes a value: the order is fixed by K).
  if (max_rows <= 8) launch_mma<1, OutT>(a, stream);
  else if (max_rows <= 16) launch_mma<2, OutT>(a, stream);
  else if (max_rows <= 32) launch_mma<4, OutT>(a, stream);
  else launch_mma<8, OutT>(a, stream);
}

// One block per 128 x 128 block of one matrix: the max |v| (a max is order-free: the host's value),
// scale = amax / 448 (1 for an all-zero block), q = e4m3(v / scale) round-to-nearest-even, saturating.
__global__ void fp8_quantize_dummy_kernel(const DummyRecipe r, int64_t rows, int64_t cols, uint8_t* __restrict__ q,
                                          float* __restrict__ scale) {
  pdl_begin();
  __shared__ float s_max[kWarps];
  const int64_t m = blockIdx.z, r0 = int64_t(blockIdx.y) * 128, c0 = int64_t(blockIdx.x) * 128;
  const int nr = int(rows - r0 < 128 ? rows - r0 : 128), nc = int(cols - c0 < 128 ? cols - c0 : 128);
  const int64_t base = m * rows * cols;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < nr * nc; i += kThreads) {
    const int64_t idx = base + (r0 + i / nc) * cols + c0 + i % nc;
    amax = fmaxf(amax, fabsf(dummy_value(r, idx)));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = s_max[0];
  for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, s_max[w]);
  const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  const int64_t KB = (cols + 127) / 128;
  for (int i = threadIdx.x; i < nr; i += kThreads) scale[(m * rows + r0 + i) * KB + blockIdx.x] = s;
  for (int i = threadIdx.x; i < nr * nc; i += kThreads) {
    const int64_t idx = base + (r0 + i / nc) * cols + c0 + i % nc;
    q[idx] = __nv_cvt_float_to_fp8(__fdiv_rn(dummy_value(r, idx), s), __NV_SATFINITE, __NV_E4M3);
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

void fp8_gemv_simt(const bf16* x, const uint8_t* w, const float* scale, const bf16* bias, bf16* y, int64_t max_rows,
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

void fp8_gemv(const bf16* x, const uint8_t* w, const float* scale, const bf16* bias, bf16* y, int64_t max_rows,
              int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream, int64_t x_stride,
              int64_t y_stride) {
  run_mma<bf16>("fp8_gemv", x, w, scale, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride);
}

void fp8_gemv_f32out(const bf16* x, const uint8_t* w, const float* scale, const float* bias, float* y,
                     int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, cudaStream_t stream,
                     int64_t x_stride, int64_t y_stride) {
  run_mma<float>("fp8_gemv_f32out", x, w, scale, bias, y, max_rows, K, N, live_rows, stream, x_stride, y_stride);
}

void fp8_quantize_dummy(const DummyRecipe& recipe, int64_t mats, int64_t rows, int64_t cols, uint8_t* q, float* scale,
                        cudaStream_t stream) {
  MOEFOLD_CHECK(mats >= 1 && mats < 65536 && rows >= 1 && cols >= 1 && (rows + 127) / 128 < 65536,
                "fp8_quantize_dummy: bad sizes mats={} rows={} cols={}", mats, rows, cols);
  MOEFOLD_CHECK(q && scale, "fp8_quantize_dummy: null pointer");
  const dim3 grid(unsigned((cols + 127) / 128), unsigned((rows + 127) / 128), unsigned(mats));
  launch_pdl(fp8_quantize_dummy_kernel, grid, dim3(kThreads), 0, stream, recipe, rows, cols, q, scale);
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
