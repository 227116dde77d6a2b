// A CUDA graph captured from a stream, replayed as one launch. The kernel registry counts launches on
// the host as they are issued, so a replay would count nothing: the graph remembers the launches its
// capture issued (per registry entry) and counts them again at every replay, which keeps
// `--require-kernel` and the kernel table's call counts true when steps run as graphs. The capture
// itself counts nothing.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace moefold::cuda {

/// Runs `fn` (launches on the current device) and takes the launches it issued back out of the kernel
/// registry: for work that is not a model step, such as the warm-up run before a capture.
void run_uncounted(const std::function<void()>& fn);

class CapturedGraph {
 public:
  /// Captures everything `launches` enqueues on `stream` (thread-local capture mode, so other
  /// threads' CUDA calls are unaffected) and instantiates it. Every launch inside must be
  /// capturable: no host synchronisation, no allocation, no pageable copies. Throws moefold::Error
  /// (after ending the capture) if the launches throw or the capture fails.
  static std::unique_ptr<CapturedGraph> capture(cudaStream_t stream, const std::function<void()>& launches);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  /// Launches the graph on `stream` and counts its launches in the registry. Throws on a CUDA error.
  void replay(cudaStream_t stream);
  /// Nodes of the graph (kernels, memsets, copies).
  size_t num_nodes() const { return nodes_; }
  /// Registry launches per replay: (kernel id, count).
  const std::vector<std::pair<int, int64_t>>& launches() const { return launches_; }

 private:
  CapturedGraph() = default;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
  std::vector<std::pair<int, int64_t>> launches_;
};

}  // namespace moefold::cuda
