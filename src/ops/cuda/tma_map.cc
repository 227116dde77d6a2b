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

/// One 2-D map: `elem_bytes`-byte elements, boxes of box_rows x 128 bytes, 128-byte swizzle.
CUtensorMap map_2d(CUtensorMapDataType type, int elem_bytes, const void* ptr, int64_t rows, int64_t cols,
                   int64_t stride, int box_rows, const char* who) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(stride) * cuuint64_t(elem_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(128 / elem_bytes), cuuint32_t(box_rows)}, elem[2] = {1, 1};
  const CUresult r = encode_fn()(&m, type, 2, const_cast<void*>(ptr), dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MOEFOLD_CHECK(r == CUDA_SUCCESS, "{}: cuTensorMapEncodeTiled failed ({})", who, int(r));
  return m;
}

}  // namespace

CUtensorMap tma_map_2d_bf16(const __nv_bfloat16* ptr, int64_t rows, int64_t cols, int64_t stride, int box_rows,
                            const char* who) {
  return map_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ptr, rows, cols, stride, box_rows, who);
}

CUtensorMap tma_map_2d_u8(const uint8_t* ptr, int64_t rows, int64_t cols, int64_t stride, int box_rows,
                          const char* who) {
  return map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, ptr, rows, cols, stride, box_rows, who);
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
