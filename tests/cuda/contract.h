// One line per GPU contract case, in the format scripts/gpu/run_tests.sh parses (documented at the
// top of tests/cuda/README.md):
//
//   CONTRACT kernel=<name> shape=<shape> rel_err=<x> tol=<y> verdict=<PASS|FAIL>
//
// `kernel` and `shape` must not contain whitespace (any is replaced by '_'); `rel_err` is the
// measured error (||out-ref||/||ref|| for numeric kernels, a mismatch count or fraction for exact
// ones), printed "inf" / "nan" when not finite, which never passes. Usage inside a GoogleTest:
//
//   #include "cuda/contract.h"
//   TEST(Gemm, Shapes) {
//     MOEFOLD_REQUIRE_GPU();
//     ...
//     EXPECT_TRUE(moefold::test::contract("gemm_bf16", "T=17,in=64,out=96", err, 1e-2));
//   }
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define MOEFOLD_CONTRACT_HAVE_CUDART 1
#endif

namespace moefold::test {

inline std::string contract_token(std::string s) {
  if (s.empty()) return "-";
  for (char& c : s)
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') c = '_';
  return s;
}

/// Prints one CONTRACT line and returns true when rel_err is finite and <= tol.
inline bool contract(const std::string& kernel, const std::string& shape, double rel_err, double tol) {
  const bool pass = std::isfinite(rel_err) && rel_err <= tol;
  char err[32];
  if (std::isnan(rel_err))
    std::snprintf(err, sizeof err, "nan");
  else if (std::isinf(rel_err))
    std::snprintf(err, sizeof err, "inf");
  else
    std::snprintf(err, sizeof err, "%.3e", rel_err);
  std::printf("CONTRACT kernel=%s shape=%s rel_err=%s tol=%.1e verdict=%s\n", contract_token(kernel).c_str(),
              contract_token(shape).c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  return pass;
}

/// Exact-match variant: `mismatches` elements out of `total` differ; passes only when none do.
/// Prints the mismatch count as rel_err (tol=0).
inline bool contract_exact(const std::string& kernel, const std::string& shape, size_t mismatches) {
  return contract(kernel, shape, double(mismatches), 0.0);
}

/// True when at least one CUDA device is usable.
inline bool have_gpu() {
#ifdef MOEFOLD_CONTRACT_HAVE_CUDART
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

}  // namespace moefold::test

/// At the top of a GoogleTest body: skips the test when no GPU is present.
#define MOEFOLD_REQUIRE_GPU()                                        \
  do {                                                               \
    if (!::moefold::test::have_gpu()) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)
