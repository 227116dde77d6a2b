// The NCCL communicator (parallel/nccl_communicator.h) against the CPU one on the same random data,
// one thread per GPU, at world sizes 2, 4 and 8 (as many as the machine has; skipped below 2 GPUs).
// NCCL sums in its own (ring / tree) order, so sums agree within fp32 tolerance, copies bitwise.
// Built with -DMOEFOLD_NCCL_TESTS=ON (it links libnccl); not yet run: no multi-GPU machine so far.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "parallel/cpu_communicator.h"
#include "parallel/nccl_communicator.h"
#include "test_util.h"

namespace moefold {
namespace {

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/// Runs fn(rank) on one thread per rank (each on its own device for NCCL).
void on_ranks(int N, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < N; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

std::vector<float> to_host(const float* d, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  cudaMemcpy(h.data(), d, size_t(n) * 4, cudaMemcpyDeviceToHost);
  return h;
}
float* to_device(const std::vector<float>& h) {
  float* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(h.size(), 1) * 4);
  cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  return d;
}

TEST(NcclCommunicator, CollectivesEqualTheCpuBackend) {
  const int have = gpus();
  if (have < 2) GTEST_SKIP() << "needs 2 or more GPUs (found " << have << ")";
  for (int N : {2, 4, 8}) {
    if (N > have) break;
    std::vector<int> devices;
    for (int i = 0; i < N; ++i) devices.push_back(i);
    auto nccl = make_nccl_communicators(devices);
    CpuCommGroup cpu(N);
    for (int64_t n : {1, 7, 4096}) {
      SCOPED_TRACE("world " + std::to_string(N) + " n " + std::to_string(n));
      std::vector<std::vector<float>> in(static_cast<size_t>(N)), ref(static_cast<size_t>(N)),
          got(static_cast<size_t>(N)), gat_ref(static_cast<size_t>(N)), gat(static_cast<size_t>(N));
      for (int r = 0; r < N; ++r) in[size_t(r)] = test::randn(size_t(n), 100 + r), ref[size_t(r)] = in[size_t(r)];
      on_ranks(N, [&](int r) { cpu.comm(r).all_reduce_sum(ref[size_t(r)].data(), n); });
      on_ranks(N, [&](int r) {
        gat_ref[size_t(r)].resize(size_t(N * n));
        cpu.comm(r).all_gather(in[size_t(r)].data(), gat_ref[size_t(r)].data(), n);
      });
      on_ranks(N, [&](int r) {
        cudaSetDevice(r);
        float* d = to_device(in[size_t(r)]);
        float* g = nullptr;
        cudaMalloc(reinterpret_cast<void**>(&g), size_t(N * n) * 4);
        nccl[size_t(r)]->all_gather(d, g, n);
        nccl[size_t(r)]->all_reduce_sum(d, n);
        cudaDeviceSynchronize();
        got[size_t(r)] = to_host(d, n);
        gat[size_t(r)] = to_host(g, N * n);
        nccl[size_t(r)]->barrier();
        cudaFree(d);
        cudaFree(g);
      });
      for (int r = 0; r < N; ++r) {
        EXPECT_LE(test::rel_err(got[size_t(r)], ref[size_t(r)]), 1e-6) << "all_reduce rank " << r;
        EXPECT_EQ(gat[size_t(r)], gat_ref[size_t(r)]) << "all_gather rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace moefold
