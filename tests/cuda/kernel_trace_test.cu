// The CUPTI kernel tracer (src/ops/cuda/kernel_trace.h) on the GPU: eager launches and the nodes of a
// replayed CUDA graph (captured after the trace started) come back once each, named, with their grid,
// in order, and their exposed times add up to the step's span; a second trace is refused.
#include <gtest/gtest.h>

#include <cstdio>

#include "contract.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_trace.h"
#include "ops/cuda/pdl.cuh"
#include "spin_wait.cuh"

using namespace moefold;

namespace {

/// Busy-waits about `ns` nanoseconds on the SM's global timer, then writes its block index.
__global__ void trace_spin_kernel(int64_t ns, int* out) {
  cuda::pdl_begin();
  test::spin_ns(ns);
  if (threadIdx.x == 0) out[blockIdx.x] = int(blockIdx.x);
}

/// Starts a trace, or skips the test where libcupti is not installed.
std::unique_ptr<cuda::KernelTrace> start_or_skip(std::string& why, bool host_calls = false) {
  try {
    return cuda::KernelTrace::start(host_calls);
  } catch (const Error& e) {
    why = e.what();
    return nullptr;
  }
}

int count(const std::vector<prof::KernelRecord>& r, const std::string& prefix, bool graph) {
  int n = 0;
  for (const auto& k : r) n += k.name.rfind(prefix, 0) == 0 && k.in_graph == graph;
  return n;
}

}  // namespace

TEST(KernelTrace, EagerAndGraphKernels) {
  MOEFOLD_REQUIRE_GPU();
  std::string why;
  auto trace = start_or_skip(why, true);
  if (!trace) GTEST_SKIP() << why;
  std::printf("CUPTI: %s\n", trace->library().c_str());
  EXPECT_THROW(cuda::KernelTrace::start(), Error);  // one session at a time

  int* out = nullptr;
  MOEFOLD_CUDA_CHECK(cudaMalloc(&out, 64 * sizeof(int)));
  cudaStream_t stream;
  MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < 4; ++i) trace_spin_kernel<<<3, 32, 0, stream>>>(2000, out);
  MOEFOLD_CUDA_CHECK_LAUNCH();
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream));
  auto eager = trace->take().gpu;
  EXPECT_EQ(count(eager, "trace_spin_kernel", false), 4);
  for (const auto& k : eager) {
    if (k.name.rfind("trace_spin_kernel", 0) != 0) continue;
    EXPECT_EQ(k.grid[0], 3);
    EXPECT_EQ(k.block[0], 32);
    EXPECT_GE(k.end_ns - k.start_ns, 1500);
  }

  // A graph of a long kernel and a short one launched with PDL, captured after the trace started.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::launch_pdl(trace_spin_kernel, dim3(8), dim3(32), 0, stream, int64_t(20000), out);
  cuda::launch_pdl(trace_spin_kernel, dim3(16), dim3(32), 0, stream, int64_t(2000), out);
  MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<prof::StepWindow> windows;
  for (int i = 0; i < 5; ++i) {
    const int64_t t0 = trace->now();
    MOEFOLD_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream));
    windows.push_back({t0, trace->now()});
  }
  auto rec = trace->take();
  auto& replay = rec.gpu;
  int launches = 0;
  for (const auto& c : rec.host) launches += c.name == "cudaGraphLaunch";
  EXPECT_EQ(launches, 5);
  EXPECT_EQ(count(replay, "trace_spin_kernel", true), 10);
  const prof::TimelineSummary s = prof::summarize_timeline(replay, windows, rec.host);
  std::printf("%s", prof::format_timeline(s).c_str());
  ASSERT_EQ(s.steps, 5);
  EXPECT_DOUBLE_EQ(s.kernels, 2.0);
  EXPECT_DOUBLE_EQ(s.graph_kernels, 2.0);
  double exposed = 0;
  for (const auto& r : s.rows) exposed += r.exposed_us_per_step;
  EXPECT_NEAR(exposed + s.gap_us, s.span_us, 1e-6);
  ASSERT_EQ(s.rows.size(), 2u);
  EXPECT_EQ(s.rows[0].grid[0], 8);  // the 20 us kernel
  EXPECT_GE(s.rows[0].exposed_us_per_step, 18.0);
  EXPECT_LE(s.rows[1].exposed_us_per_step, s.rows[1].mean_duration_us + 1e-6);
  EXPECT_GE(s.wall_us, s.span_us);

  MOEFOLD_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MOEFOLD_CUDA_CHECK(cudaGraphDestroy(graph));
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(stream));
  MOEFOLD_CUDA_CHECK(cudaFree(out));
  trace.reset();
  auto again = start_or_skip(why);  // a finished session frees the slot
  EXPECT_NE(again, nullptr) << why;
}
