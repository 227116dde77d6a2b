// Plan B decode GEMM on wgmma (decode_gemm_wgmma.h): the decode GEMM's grid and split structure with
// swapped operands, so that every element's chain is the one prefill_gemm_wgmma_kernel computes.
//
// Grid: (column tiles of 64 weight rows: the decode GEMM's reference tile) x (S K-splits). A block is
// one warpgroup (128 threads): it streams its split's chunks through a STAGES-deep cp.async ring
// (16-byte copies into the 128-byte swizzle layout wgmma reads: row r at r * 128 bytes, 16-byte chunk
// c at (c ^ (r & 7)); zero-filled past K, past N and for activation rows >= live, which are never
// read), and per chunk issues 4 wgmma m64nRk16 steps: A = the 64 weight rows, B = the R activation
// rows (R = 16, 64 or 256 by max_rows), D[n][r] in registers. Element (r, n) is one fp32 chain from
// zero over the split in ascending k. S > 1: each block stores its partial (fragment order, float4
// per thread) to the workspace, fences and bumps the tile's counter; the last block adds the S
// partials in split order 0..S-1, then the bias, rounds once and stores, and resets the counter: the
// decode GEMM's combine (decode_gemm.cu), on a layout of its own inside the same workspace size.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/decode_gemm_wgmma.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/wgmma_ss.cuh"

namespace moefold::cuda {
namespace {

using namespace ptx;

constexpr int kBK = 64, kTileN = 64, kThreads = 128;
// The decode GEMM's counter region (decode_gemm.cu: one counter per column tile of a split weight,
// which has fewer than 256 tiles of 64; 1 KiB), then the partials.
constexpr size_t kCounterBytes = 1024;

template <int R_>
struct BCfg {
  static constexpr int R = R_;  // activation rows per block (the wgmma N)
  static constexpr int STAGES = R == 256 ? 4 : 6;
  static constexpr uint32_t W_BYTES = kTileN * kBK * 2, X_BYTES = R * kBK * 2;
  static constexpr uint32_t STAGE_BYTES = W_BYTES + X_BYTES;  // a multiple of 1024
  static constexpr size_t SMEM = size_t(STAGES) * STAGE_BYTES + 1024;
  static constexpr int ACC = R / 2;
  static constexpr size_t PARTIAL_FLOATS = size_t(kTileN) * R;
};

struct BParams {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  const void* bias;
  void* y;
  unsigned* counters;
  float* partials;
  const int32_t* live_rows;
  int64_t x_stride, y_stride;
  int max_rows, K, N, S, KC;
};

template <class OutT>
__device__ __forceinline__ void store_one(const BParams& p, int r, int n, float v) {
  if (p.bias) {
    if constexpr (sizeof(OutT) == 4) v += static_cast<const float*>(p.bias)[n];
    else v += __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[n]);
  }
  OutT* out = static_cast<OutT*>(p.y) + int64_t(r) * p.y_stride + n;
  if constexpr (sizeof(OutT) == 4) *out = v;
  else *out = __float2bfloat16_rn(v);
}

template <int R, class OutT>
__global__ void __launch_bounds__(kThreads, 1) decode_gemm_wgmma_kernel(const BParams p) {
  pdl_begin();
  using C = BCfg<R>;
  constexpr int STAGES = C::STAGES, ACC = C::ACC;
  const int live = int(detail::live_count(p.live_rows, p.max_rows));
  if (live <= 0) return;  // every block returns: counters untouched

  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int tile = blockIdx.x, split = blockIdx.y, n0 = tile * kTileN;
  const int c_begin = int((int64_t(split) * p.KC) / p.S);
  const int c_end = int((int64_t(split + 1) * p.KC) / p.S);
  const int nchunks = c_end - c_begin;

  auto load_stage = [&](int stage, int chunk) {
    unsigned char* wd = base + size_t(stage) * C::STAGE_BYTES;
    unsigned char* xd = wd + C::W_BYTES;
    const int k0 = chunk * kBK;
    for (int i = tid; i < (kTileN + R) * 8; i += kThreads) {
      const int r = i >> 3, ch = i & 7, k = k0 + ch * 8;
      if (r < kTileN) {
        const int n = n0 + r;
        const bool ok = n < p.N && k < p.K;
        cp_async16(wd + r * 128 + ((ch ^ (r & 7)) << 4), ok ? p.w + int64_t(n) * p.K + k : p.w, ok);
      } else {
        const int xr = r - kTileN;
        const bool ok = xr < live && k < p.K;
        cp_async16(xd + xr * 128 + ((ch ^ (xr & 7)) << 4), ok ? p.x + int64_t(xr) * p.x_stride + k : p.x, ok);
      }
    }
  };

  float acc[ACC];
#pragma unroll
  for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nchunks) load_stage(s, c_begin + s);
    cp_async_commit();
  }
#pragma unroll 1
  for (int it = 0; it < nchunks; ++it) {
    cp_async_wait<STAGES - 2>();  // chunk `it` has landed (this thread's copies) ...
    wg::fence_proxy_async();      // ... visible to the tensor cores ...
    __syncthreads();              // ... everyone's; stage (it - 1) % STAGES is free (drained below)
    {
      const int nk = it + STAGES - 1;
      if (nk < nchunks) load_stage(nk % STAGES, c_begin + nk);
      cp_async_commit();
    }
    const uint32_t wa = smem_u32(base + size_t(it % STAGES) * C::STAGE_BYTES);
    const uint64_t da = wg::desc_sw128(wa), db = wg::desc_sw128(wa + C::W_BYTES);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) wgss::mma(acc, da + uint64_t(ks * 2), db + uint64_t(ks * 2));
    wg::commit();
    wg::wait<0>();
    wg::fence_regs(acc);
  }
  cp_async_wait_all();

  // Fragment (j, h, e) = acc[4j + 2h + e]: weight row n0 + warp * 16 + g + 8h, activation row 8j + 2 tig + e.
  if (p.S == 1) {
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int n = n0 + warp * 16 + g + 8 * (q >> 1), r = 8 * j + 2 * tig + (q & 1);
        if (r < live && n < p.N) store_one<OutT>(p, r, n, acc[4 * j + q]);
      }
    return;
  }

  auto slot = [&](int s) {
    return reinterpret_cast<float4*>(p.partials + (int64_t(tile) * p.S + s) * int64_t(C::PARTIAL_FLOATS));
  };
  {
    float4* dst = slot(split);
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
      __stcg(dst + j * kThreads + tid, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(p.counters + tile, 1u) == unsigned(p.S - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
#pragma unroll
  for (int j = 0; j < R / 8; ++j) {
    float sum[4];
    for (int s = 0; s < p.S; ++s) {
      float v[4];
      if (s == split) {
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = acc[4 * j + q];
      } else {
        const float4 t = __ldcg(slot(s) + j * kThreads + tid);
        v[0] = t.x;
        v[1] = t.y;
        v[2] = t.z;
        v[3] = t.w;
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) sum[q] = s == 0 ? v[q] : sum[q] + v[q];
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int n = n0 + warp * 16 + g + 8 * (q >> 1), r = 8 * j + 2 * tig + (q & 1);
      if (r < live && n < p.N) store_one<OutT>(p, r, n, sum[q]);
    }
  }
  if (tid == 0) p.counters[tile] = 0u;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
int rows_for(int64_t max_rows) { return max_rows <= 16 ? 16 : max_rows <= 64 ? 64 : 256; }

const prof::Kernel kBf16{"decode_gemm_wgmma_kernel", prof::Category::DenseGemm};
const prof::Kernel kF32{"decode_gemm_wgmma_kernel:f32out", prof::Category::DenseGemm};

template <int R, class OutT>
void launch(const BParams& p, cudaStream_t stream) {
  using C = BCfg<R>;
  auto* k = decode_gemm_wgmma_kernel<R, OutT>;
  static const bool attr_set = [&] {
    MOEFOLD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::SMEM)));
    return true;
  }();
  (void)attr_set;
  launch_pdl(k, dim3(unsigned(ceil_div(p.N, kTileN)), unsigned(p.S)), dim3(kThreads), C::SMEM, stream, p);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

template <class OutT>
void run(const char* name, const __nv_bfloat16* x, const __nv_bfloat16* w, const void* bias, OutT* y,
         int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace, cudaStream_t stream,
         int64_t x_stride, int64_t y_stride) {
  const int64_t xs = x_stride ? x_stride : K, ys = y_stride ? y_stride : N;
  auto shape = [&] {
    return std::string(name) + "(max_rows=" + std::to_string(max_rows) + ", K=" + std::to_string(K) +
           ", N=" + std::to_string(N) + ", x_stride=" + std::to_string(xs) + ", y_stride=" + std::to_string(ys) + ")";
  };
  if (max_rows < 0 || max_rows > kDecodeGemmMaxRows)
    throw Error(shape() + ": max_rows must be in [0, " + std::to_string(kDecodeGemmMaxRows) + "]");
  if (N < 1 || N > (int64_t(1) << 30)) throw Error(shape() + ": N must be in [1, 2^30]");
  if (K < 8 || K % 8 != 0 || K > (int64_t(1) << 30)) throw Error(shape() + ": K must be a positive multiple of 8");
  if (xs < K || ys < N) throw Error(shape() + ": row strides must be >= the row lengths");
  if (xs % 8 != 0) throw Error(shape() + ": x_stride must keep rows of x 16-byte aligned (x_stride % 8)");
  if (max_rows == 0) return;
  if (!x || !w || !y) throw Error(shape() + ": null x, w or y");
  if (!aligned16(x) || !aligned16(w)) throw Error(shape() + ": x and w must be 16-byte aligned");
  BParams p{};
  p.x = x;
  p.w = w;
  p.bias = bias;
  p.y = y;
  p.live_rows = live_rows;
  p.x_stride = xs;
  p.y_stride = ys;
  p.max_rows = int(max_rows);
  p.K = int(K);
  p.N = int(N);
  p.S = decode_gemm_splits(N, K);
  p.KC = int(ceil_div(K, kBK));
  const int R = rows_for(max_rows);
  if (p.S > 1) {
    // The decode GEMM's workspace for these sizes holds this layout too (its partial tiles are at
    // least 64 x R floats per 64 columns); checked rather than assumed.
    const size_t need = kCounterBytes + size_t(ceil_div(N, kTileN)) * size_t(p.S) * size_t(kTileN) * size_t(R) * 4;
    const size_t have = decode_gemm_workspace_bytes(max_rows, N, K);
    if (!workspace || !aligned16(workspace) || need > have)
      throw Error(shape() + ": needs a 16-byte aligned workspace of decode_gemm_workspace_bytes() = " +
                  std::to_string(have) + " bytes (this layout: " + std::to_string(need) + ")");
    p.counters = static_cast<unsigned*>(workspace);
    p.partials = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + kCounterBytes);
  }
  LaunchScope scope(std::is_same_v<OutT, float> ? kF32 : kBf16, stream, [&] {
    const double rows = double(work_rows(max_rows, live_rows));
    return prof::Work{double(N) * K * 2 + rows * (double(K) * 2 + double(N) * sizeof(OutT)),
                      2.0 * rows * double(N) * double(K)};
  });
  if (R == 16) launch<16, OutT>(p, stream);
  else if (R == 64) launch<64, OutT>(p, stream);
  else launch<256, OutT>(p, stream);
}

}  // namespace

void decode_gemm_wgmma_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                            __nv_bfloat16* y, int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows,
                            void* workspace, cudaStream_t stream, int64_t x_stride, int64_t y_stride) {
  run<__nv_bfloat16>("decode_gemm_wgmma_bf16", x, w, bias, y, max_rows, K, N, live_rows, workspace, stream, x_stride,
                     y_stride);
}

void decode_gemm_wgmma_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y,
                                   int64_t max_rows, int64_t K, int64_t N, const int32_t* live_rows, void* workspace,
                                   cudaStream_t stream, int64_t x_stride, int64_t y_stride) {
  run<float>("decode_gemm_wgmma_bf16_f32out", x, w, bias, y, max_rows, K, N, live_rows, workspace, stream, x_stride,
             y_stride);
}

}  // namespace moefold::cuda
