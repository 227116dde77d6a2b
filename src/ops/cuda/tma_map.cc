// Tensor-map encoding for the TMA kernels (tma_map.h).
#include "ops/cuda/tma_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace moefold::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MOEFOLD_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    MOEFOLD_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr, "tma_map_2d_bf16: cuTensorMapEncodeTiled unavailable");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap tma_map_2d_bf16(const __nv_bfloat16* ptr, int64_t rows, int64_t cols, int64_t stride, int box_rows,
                            const char* who) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(stride) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, elem[2] = {1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(ptr), dims,
                                 strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MOEFOLD_CHECK(r == CUDA_SUCCESS, "{}: cuTensorMapEncodeTiled failed ({})", who, int(r));
  return m;
}

int device_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
    MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

}  // namespace moefold::cuda
