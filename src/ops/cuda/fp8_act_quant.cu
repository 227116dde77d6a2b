// fp8_quantize_rows (fp8_act_quant.h): one warp per (row, 128-column block), 4 columns a lane.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include "ops/cuda/fp8_act_quant.h"

#include <cuda_fp8.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
namespace {

using bf16 = __nv_bfloat16;
const prof::Kernel kQuant{"fp8_quantize_rows_kernel", prof::Category::Glue};

__global__ void fp8_quantize_rows_kernel(const bf16* __restrict__ x, int64_t max_rows, int64_t K,
                                         const int32_t* live, uint8_t* __restrict__ q, float* __restrict__ s) {
  pdl_begin();
  const int64_t KB = (K + 127) / 128;
  const int64_t items = detail::live_count(live, max_rows) * KB;
  const int lane = int(threadIdx.x & 31);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < items; w += warps) {
    const int64_t r = w / KB, b = w % KB, c0 = b * 128 + lane * 4;
    const bool in = c0 < K;  // K % 8 == 0: a lane's 4 columns are all in or all out
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (in) detail::load_bf16<4>(x + r * K + c0, v);
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    if (in) {
      uint32_t packed = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        packed |= uint32_t(__nv_cvt_float_to_fp8(__fdiv_rn(v[i], sc), __NV_SATFINITE, __NV_E4M3)) << (8 * i);
      *reinterpret_cast<uint32_t*>(q + r * K + c0) = packed;
    }
    if (lane == 0) s[r * KB + b] = sc;
  }
}

}  // namespace

void fp8_quantize_rows(const bf16* x, int64_t max_rows, int64_t K, const int32_t* live_rows, uint8_t* q, float* s,
                       cudaStream_t stream, int rows_per_token) {
  MOEFOLD_CHECK(max_rows >= 0 && K >= 8 && K % 8 == 0, "fp8_quantize_rows: bad sizes rows={} K={} (K % 8 == 0)",
                max_rows, K);
  if (max_rows == 0) return;
  MOEFOLD_CHECK(x && q && s, "fp8_quantize_rows: null pointer");
  const int64_t KB = (K + 127) / 128;
  LaunchScope launch(kQuant, stream, [&] {
    const prof::StepFacts* f = prof::step_facts();
    const double rows = double(f ? std::min<int64_t>(f->rows * rows_per_token, max_rows) : max_rows);
    return prof::Work{rows * double(K) * 3 + rows * double(KB) * 4, 0.0};
  });
  constexpr int kThreads = 256;
  const int64_t warps = max_rows * KB;
  const int blocks = int(std::min<int64_t>((warps + 7) / 8, 132 * 16));
  launch_pdl(fp8_quantize_rows_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, x, max_rows, K, live_rows, q,
             s);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
