#include "ops/cuda/cuda_graph.h"

#include "core/kernel_registry.h"
#include "ops/cuda/cuda_check.h"

namespace moefold::cuda {

namespace {
std::vector<int64_t> launch_counts() {
  std::vector<int64_t> n;
  for (const prof::KernelInfo& k : prof::registered_kernels()) {
    if (size_t(k.id) >= n.size()) n.resize(size_t(k.id) + 1, 0);
    n[size_t(k.id)] = k.launches;
  }
  return n;
}
/// Takes the launches counted since `before` back out of the registry; returns them (id, count).
std::vector<std::pair<int, int64_t>> uncount_since(const std::vector<int64_t>& before) {
  std::vector<std::pair<int, int64_t>> taken;
  const std::vector<int64_t> after = launch_counts();
  for (size_t id = 0; id < after.size(); ++id) {
    const int64_t n = after[id] - (id < before.size() ? before[id] : 0);
    if (n <= 0) continue;
    taken.emplace_back(int(id), n);
    prof::detail::g_launch_counts[id].fetch_sub(n, std::memory_order_relaxed);
  }
  return taken;
}
}  // namespace

void run_uncounted(const std::function<void()>& fn) {
  const std::vector<int64_t> before = launch_counts();
  try {
    fn();
  } catch (...) {
    uncount_since(before);
    throw;
  }
  uncount_since(before);
}

std::unique_ptr<CapturedGraph> CapturedGraph::capture(cudaStream_t stream, const std::function<void()>& launches) {
  std::unique_ptr<CapturedGraph> g(new CapturedGraph);
  const std::vector<int64_t> before = launch_counts();
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    launches();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // the capture's invalidation error, if any
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (end != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    fail("CUDA graph capture failed: {} (a launch inside is not capturable)", cudaGetErrorString(end));
  }
  MOEFOLD_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &g->nodes_));
  const cudaError_t inst = cudaGraphInstantiate(&g->exec_, graph, 0);
  cudaGraphDestroy(graph);
  MOEFOLD_CUDA_CHECK(inst);
  // The capture's launches were counted as they were issued; they count at each replay instead.
  g->launches_ = uncount_since(before);
  return g;
}

CapturedGraph::~CapturedGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

void CapturedGraph::replay(cudaStream_t stream) {
  MOEFOLD_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
  for (const auto& [id, n] : launches_) prof::detail::g_launch_counts[id].fetch_add(n, std::memory_order_relaxed);
}

}  // namespace moefold::cuda
