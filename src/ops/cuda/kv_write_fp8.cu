// The FP8 KV cache store (attention.h, kv_cache_write_fp8): one block per row, a thread per element.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <cuda_fp8.h>

#include "core/error.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/pdl.cuh"

namespace moefold::cuda {
using namespace detail;
namespace {

const prof::Kernel kKvWriteFp8{"kv_write_fp8_kernel", prof::Category::Glue};

/// e4m3(x / scale): IEEE division (not the fast-math approximation), RNE, saturating; |q| > 448 counted.
__device__ __forceinline__ uint8_t store_e4m3(float x, float scale, unsigned& sat) {
  const float y = __fdiv_rn(x, scale);
  sat += fabsf(y) > 448.0f ? 1u : 0u;  // false for NaN
  return uint8_t(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
}

__global__ void kv_write_fp8_kernel(const bf16* __restrict__ k, int64_t ks, const bf16* __restrict__ v, int64_t vs,
                                    uint8_t* __restrict__ kc, uint8_t* __restrict__ vc,
                                    const int32_t* __restrict__ slots, int64_t max_rows, int Hkv, int D,
                                    const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                                    unsigned long long* saturated, const int32_t* live) {
  pdl_begin();
  const int64_t r = blockIdx.x;
  if (r >= live_count(live, max_rows)) return;
  const int64_t slot = slots[r];
  if (slot < 0) return;
  const int64_t kv_dim = int64_t(Hkv) * D;
  unsigned sat = 0;
  for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    const int h = int(i / D);
    kc[slot * kv_dim + i] = store_e4m3(__bfloat162float(k[r * ks + i]), k_scale[h], sat);
    vc[slot * kv_dim + i] = store_e4m3(__bfloat162float(v[r * vs + i]), v_scale[h], sat);
  }
  if (saturated && sat) atomicAdd(saturated, (unsigned long long)sat);
}

}  // namespace

void kv_cache_write_fp8(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride, uint8_t* k_cache,
                        uint8_t* v_cache, const int32_t* slot_mapping, int64_t max_rows, int num_kv_heads,
                        int head_dim, const float* k_scale, const float* v_scale, unsigned long long* saturated,
                        const int32_t* live_rows, cudaStream_t stream) {
  MOEFOLD_CHECK(max_rows >= 0 && max_rows < (int64_t(1) << 31) && num_kv_heads > 0 && head_dim > 0,
                "kv_cache_write_fp8: bad sizes");
  MOEFOLD_CHECK(k_scale && v_scale, "kv_cache_write_fp8: needs k_scale and v_scale");
  const int64_t kv_dim = int64_t(num_kv_heads) * head_dim;
  if (k_stride == 0) k_stride = kv_dim;
  if (v_stride == 0) v_stride = kv_dim;
  if (max_rows == 0) return;
  LaunchScope launch(kKvWriteFp8, stream, [&] { return prof::Work{double(work_rows(max_rows, live_rows)) * kv_dim * 6, 0}; });
  const int threads = int(std::min<int64_t>(256, (kv_dim + 31) / 32 * 32));
  launch_pdl(kv_write_fp8_kernel, dim3(unsigned(max_rows)), dim3(threads), 0, stream, k, k_stride, v, v_stride, k_cache,
             v_cache, slot_mapping, max_rows, num_kv_heads, head_dim, k_scale, v_scale, saturated, live_rows);
  MOEFOLD_CUDA_CHECK_LAUNCH();
}

}  // namespace moefold::cuda
