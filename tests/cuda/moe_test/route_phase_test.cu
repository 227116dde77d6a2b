// moe_test: MoeRoutePhases.DISABLED_OneToken: where one token's route (softmax + top-k, E = 256, k = 8)
// spends its time inside a kernel, as SM cycles from clock64 around the top-k functions of moe_topk.cuh (no
// launch cost in the numbers), beside the route kernel's time a launch in a graph.
#include "cuda/moe_test/moe_test_util.h"
#include "ops/cuda/moe_topk.cuh"

namespace moefold::cuda::moe_test {
namespace {

constexpr int kVpt = 8;  // E = 256

enum Phase { kLoad, kExpOnly, kFast, kWide, kPhases };
const char* phase_name(int p) {
  static const char* n[kPhases] = {"logits load (__ldcg, 8 a lane) + warp max",
                                   "8 x float(exp(double)) a lane, registers only",
                                   "topk_row_fast<8> (one warp)",
                                   "topk_row_wide<8> (8 warps, 4 barriers)"};
  return n[p];
}

__global__ void route_phase_kernel(const float* logits, int E, int k, int phase, long long* cycles, int* sink) {
  __shared__ moe_detail::WideTopkSmem<8> wide;
  __shared__ int s_ids[32];
  __shared__ int32_t ids[32];
  __shared__ float w[32];
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  if (phase != kWide && warp != 0) return;
  __syncthreads();
  const long long t0 = clock64();
  int acc = 0;
  switch (phase) {
    case kLoad: {
      float m = -INFINITY;
      for (int i = 0; i < kVpt; ++i) m = fmaxf(m, __ldcg(logits + i * 32 + lane));
      m = detail::warp_max(m);
      acc = __float_as_int(m);
      break;
    }
    case kExpOnly: {
      float v[kVpt];
      for (int i = 0; i < kVpt; ++i) v[i] = -0.01f * float(i * 32 + lane + int(clock() & 1));
      double part = 0.0;
#pragma unroll
      for (int i = 0; i < kVpt; ++i) part += double(float(exp(double(v[i]))));
      acc = int(part * 1000.0);
      break;
    }
    case kFast: {
      moe_detail::topk_row_fast<kVpt>(logits, E, k, true, nullptr, ids, w, s_ids);
      __syncwarp();
      acc = ids[lane % 8];
      break;
    }
    case kWide: {
      moe_detail::topk_row_wide<8>(logits, E, k, true, warp < 8, warp % 8, wide, ids, w, s_ids);
      __syncthreads();
      acc = ids[lane % 8];
      break;
    }
    default: break;
  }
  __syncwarp();
  const long long t1 = clock64();
  if (threadIdx.x == 0) *cycles = t1 - t0;
  if (acc == 0x7fffffff) *sink = acc;  // keeps the work
}

/// An empty PDL-free kernel: the graph's per-launch floor beside the route kernel.
__global__ void empty_kernel(int* sink) {
  if (threadIdx.x == 0 && sink == nullptr) *sink = 0;
}

TEST(MoeRoutePhases, DISABLED_OneToken) {
  MOEFOLD_REQUIRE_GPU();
  const int E = 256, k = 8;
  int dev = 0, khz = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  MOEFOLD_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  DevBuf d_l(size_t(E) * 4), d_c(8), d_s(4);
  upload(d_l.p, test::randn(size_t(E), 11, 2.0f));
  std::printf("PERF route phases E=%d k=%d: SM cycles inside one CTA (median of 50; %.0f MHz nominal)\n", E, k,
              khz / 1e3);
  for (int phase = 0; phase < kPhases; ++phase) {
    std::vector<long long> cyc;
    for (int it = 0; it < 50; ++it) {
      route_phase_kernel<<<1, phase == kWide ? 288 : 32>>>(d_l.as<float>(), E, k, phase, d_c.as<long long>(),
                                                           d_s.as<int>());
      MOEFOLD_CUDA_CHECK(cudaGetLastError());
      cyc.push_back(download<long long>(d_c.p, 1)[0]);
    }
    std::sort(cyc.begin(), cyc.end());
    std::printf("PERF   %-50s %8lld cycles  %6.2f us\n", phase_name(phase), cyc[cyc.size() / 2],
                double(cyc[cyc.size() / 2]) / (khz / 1e3));
  }
  // The route kernel (moe_route at capacity 1) and an empty kernel, us a launch in graphs of 64 launches.
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const MoeShape s{1, E, k, 2048, 512};
  DevBuf wsm(moe_workspace_bytes(s)), d_rows(4);
  upload(d_rows.p, std::vector<int32_t>{1});
  MoeWorkspace ws = moe_workspace_bind(wsm.p, wsm.bytes, s);
  auto graph_of = [&](const std::function<void()>& one) {
    cudaGraph_t g;
    cudaGraphExec_t ex;
    MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 64; ++i) one();
    MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
    MOEFOLD_CUDA_CHECK(cudaGraphDestroy(g));
    return ex;
  };
  cudaGraphExec_t route = graph_of([&] { moe_route(d_l.as<float>(), d_rows.as<int32_t>(), s, true, ws, st); });
  cudaGraphExec_t empty = graph_of([&] { empty_kernel<<<1, 32, 0, st>>>(d_s.as<int>()); });
  auto us_per = [&](cudaGraphExec_t g) {
    cudaEvent_t a, b;
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < 23; ++i) {
      MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
      MOEFOLD_CUDA_CHECK(cudaGraphLaunch(g, st));
      MOEFOLD_CUDA_CHECK(cudaEventRecord(b, st));
      MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      if (i >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return double(ms[ms.size() / 2]) * 1e3 / 64;
  };
  std::printf("PERF   %-50s %6.2f us a launch\n", "moe_route (capacity 1), graph of 64", us_per(route));
  std::printf("PERF   %-50s %6.2f us a launch\n", "empty kernel, graph of 64", us_per(empty));
  cudaGraphExecDestroy(route);
  cudaGraphExecDestroy(empty);
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace moefold::cuda::moe_test
