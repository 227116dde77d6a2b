// Host side of the TMA kernels (prefill_gemm_wgmma.cu, moe_gemm_wgmma.cu): 2-D tensor maps over
// row-major bf16 (and e4m3 byte) matrices in the 128-byte swizzle layout the wgmma descriptors read (wgmma.cuh,
// wg::desc_sw128), and the device's multiprocessor count for persistent grids.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace moefold::cuda {

/// 2-D map over a row-major bf16 matrix [rows, cols] with row stride `stride` elements (a multiple of
/// 8, base 16-byte aligned); boxes of box_rows (<= 256) x 64 elements, 128-byte swizzle, reads past
/// cols or rows zero-filled. `who` names the caller in the error. Throws moefold::Error if the driver
/// entry point is missing or the encoding fails.
CUtensorMap tma_map_2d_bf16(const __nv_bfloat16* ptr, int64_t rows, int64_t cols, int64_t stride, int box_rows,
                            const char* who);

/// 2-D map over a row-major byte matrix [rows, cols] (e4m3 weights) with row stride `stride` bytes (a
/// multiple of 16, base 16-byte aligned); boxes of box_rows (<= 256) x 128 bytes, 128-byte swizzle,
/// reads past cols or rows zero-filled. Errors as tma_map_2d_bf16.
CUtensorMap tma_map_2d_u8(const uint8_t* ptr, int64_t rows, int64_t cols, int64_t stride, int box_rows,
                          const char* who);

/// Multiprocessors of the current device (read once per process).
int device_sm_count();

}  // namespace moefold::cuda
