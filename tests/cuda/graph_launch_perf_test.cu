// What a CUDA graph launch costs the host and how long the GPU waits for it, for straight-line graphs
// of short kernels like a decode step's (~450 nodes), with and without Programmatic Dependent Launch,
// whole or cut into pieces launched back to back. A benchmark, not a test: DISABLED_ (run with
// --gtest_also_run_disabled_tests); it prints one table.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "contract.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/pdl.cuh"
#include "spin_wait.cuh"

using namespace moefold;

namespace {

/// Busy-waits about `ns` nanoseconds, then bumps a counter (so the work is not dead).
__global__ void launch_perf_kernel(int64_t ns, int* out) {
  cuda::pdl_begin();
  test::spin_ns(ns);
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(out, 1);
}

struct Result {
  double launch_us = 0, wall_us = 0;
};

Result run(int nodes, int pieces, bool pdl, int64_t ns, int* out, cudaStream_t stream) {
  std::vector<cudaGraphExec_t> execs;
  const int per = (nodes + pieces - 1) / pieces;
  for (int p = 0; p < pieces; ++p) {
    cudaGraph_t g;
    MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = p * per; i < std::min(nodes, (p + 1) * per); ++i) {
      if (pdl) cuda::launch_pdl(launch_perf_kernel, dim3(16), dim3(128), 0, stream, ns, out);
      else launch_perf_kernel<<<16, 128, 0, stream>>>(ns, out);
    }
    MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t e;
    MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    MOEFOLD_CUDA_CHECK(cudaGraphUpload(e, stream));
    MOEFOLD_CUDA_CHECK(cudaGraphDestroy(g));
    execs.push_back(e);
  }
  using Clock = std::chrono::steady_clock;
  Result r;
  const int reps = 20;
  for (int rep = 0; rep < reps + 3; ++rep) {
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto t0 = Clock::now();
    for (cudaGraphExec_t e : execs) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(e, stream));
    const auto t1 = Clock::now();
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto t2 = Clock::now();
    if (rep < 3) continue;
    r.launch_us += std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
    r.wall_us += std::chrono::duration<double, std::micro>(t2 - t0).count() / reps;
  }
  for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  return r;
}

}  // namespace

TEST(GraphLaunchPerf, DISABLED_StraightLineGraphs) {
  MOEFOLD_REQUIRE_GPU();
  int* out = nullptr;
  MOEFOLD_CUDA_CHECK(cudaMalloc(&out, sizeof(int)));
  cudaStream_t stream;
  MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("%6s %6s %4s %8s %12s %12s %12s %14s\n", "nodes", "pieces", "pdl", "kern us", "launch us", "wall us",
              "kernels us", "wall - kernels");
  for (int64_t ns : {2000, 7000}) {
    for (int nodes : {64, 450}) {
      for (int pdl = 0; pdl < 2; ++pdl) {
        for (int pieces : {1, 4, 16}) {
          if (pieces > 1 && nodes < 450) continue;
          const Result r = run(nodes, pieces, pdl != 0, ns, out, stream);
          const double kern = double(nodes) * double(ns) / 1e3;
          std::printf("%6d %6d %4d %8.1f %12.1f %12.1f %12.1f %14.1f\n", nodes, pieces, pdl, double(ns) / 1e3,
                      r.launch_us, r.wall_us, kern, r.wall_us - kern);
        }
      }
    }
  }
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(stream));
  MOEFOLD_CUDA_CHECK(cudaFree(out));
}
