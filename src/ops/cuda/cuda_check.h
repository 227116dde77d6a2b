// Error checking for the CUDA backend: every failing CUDA runtime / cuBLAS(Lt) call becomes a
// moefold::Error naming the call, the file:line and the driver's message (never an abort).
//
//   MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(...));     // any cudaError_t expression
//   my_kernel<<<g, b, 0, s>>>(...);
//   MOEFOLD_CUDA_CHECK_LAUNCH();                  // launch-config errors (cudaGetLastError)
//   MOEFOLD_CUBLAS_CHECK(cublasLtMatmul(...));    // any cublasStatus_t expression
//
// Define MOEFOLD_CUDA_SYNC_CHECK=1 (e.g. -DMOEFOLD_CUDA_SYNC_CHECK=1) to make
// MOEFOLD_CUDA_CHECK_LAUNCH also synchronise the device, so an asynchronous fault is reported
// at the launch that caused it (slow: debugging only).
//
// nvcc + C++20 + fmt 9: fmt turns its constexpr support off under __NVCC__, after which its own
// C++20 code fails to compile ("call to non-constexpr function"). Defining FMT_USE_CONSTEXPR=1
// fixes it; CMakeLists.txt defines it for the moefold_cuda target, and this header also does when it
// is the first project header of a .cu file compiled elsewhere.
#pragma once
#if defined(__CUDACC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif
#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace moefold::cuda {

/// Throws moefold::Error for a failed CUDA runtime call.
[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  // Plain string building: fmt's consteval format strings do not compile under nvcc.
  throw ::moefold::Error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                         ") in `" + expr + "` at " + file + ":" + std::to_string(line));
}

/// Throws moefold::Error for a failed cuBLAS / cuBLASLt call (status given as its integer value,
/// so this header does not need the cuBLAS headers).
[[noreturn]] inline void throw_cublas_error(int status, const char* expr, const char* file, int line) {
  const char* name = "CUBLAS_STATUS_UNKNOWN";
  switch (status) {
    case 1: name = "CUBLAS_STATUS_NOT_INITIALIZED"; break;
    case 3: name = "CUBLAS_STATUS_ALLOC_FAILED"; break;
    case 7: name = "CUBLAS_STATUS_INVALID_VALUE"; break;
    case 8: name = "CUBLAS_STATUS_ARCH_MISMATCH"; break;
    case 11: name = "CUBLAS_STATUS_MAPPING_ERROR"; break;
    case 13: name = "CUBLAS_STATUS_EXECUTION_FAILED"; break;
    case 14: name = "CUBLAS_STATUS_INTERNAL_ERROR"; break;
    case 15: name = "CUBLAS_STATUS_NOT_SUPPORTED"; break;
    case 16: name = "CUBLAS_STATUS_LICENSE_ERROR"; break;
    default: break;
  }
  throw ::moefold::Error(std::string("cuBLAS error ") + name + " (" + std::to_string(status) + ") in `" + expr +
                         "` at " + file + ":" + std::to_string(line));
}

}  // namespace moefold::cuda

#define MOEFOLD_CUDA_CHECK(expr)                                                      \
  do {                                                                                \
    cudaError_t moefold_cuda_err_ = (expr);                                           \
    if (moefold_cuda_err_ != cudaSuccess)                                             \
      ::moefold::cuda::throw_cuda_error(moefold_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define MOEFOLD_CUBLAS_CHECK(expr)                                                       \
  do {                                                                                   \
    int moefold_cublas_st_ = static_cast<int>(expr);                                     \
    if (moefold_cublas_st_ != 0)                                                         \
      ::moefold::cuda::throw_cublas_error(moefold_cublas_st_, #expr, __FILE__, __LINE__); \
  } while (0)

#if defined(MOEFOLD_CUDA_SYNC_CHECK) && MOEFOLD_CUDA_SYNC_CHECK
#define MOEFOLD_CUDA_CHECK_LAUNCH()                      \
  do {                                                   \
    MOEFOLD_CUDA_CHECK(cudaGetLastError());              \
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());         \
  } while (0)
#else
#define MOEFOLD_CUDA_CHECK_LAUNCH() MOEFOLD_CUDA_CHECK(cudaGetLastError())
#endif
