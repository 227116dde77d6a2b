// Every kernel the GPU runs, eager or as a node of a replayed CUDA graph, with its true start and end,
// through CUPTI's activity API (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), with the GPU's copies and memsets
// and, optionally, the host's CUDA runtime calls. The CUDA event timer of
// launch_scope.h cannot see inside a graph and times a PDL kernel from its early start; these records
// feed core/kernel_timeline.h's exposed-time table (`moefold bench offline --timeline`).
//
// libcupti is opened at run time (dlopen), so nothing links it and a machine without it only loses this
// tool. Where it is looked for, in order: $MOEFOLD_CUPTI_LIBRARY, the loader's path (libcupti.so.13,
// libcupti.so), the CUDA toolkit moefold was built with, /usr/local/cuda's lib64, lib and
// extras/CUPTI/lib64.
//
// CUPTI on Hopper timestamps kernels by instrumenting their launch: a traced decode step of ~450 graph
// nodes runs ~10% slower than an untraced one, which is why bench offline prints the traced step time
// beside the table. Tracing the host's runtime calls costs far more: a graph launch then takes the host
// ~1.3 us a node (2-4 us for 450 nodes untraced), so host-call times of graph launches are CUPTI's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/kernel_timeline.h"

namespace moefold::cuda {

/// A recording session. At most one exists at a time.
class KernelTrace {
 public:
  /// Opens libcupti and starts recording kernels. Start it before the CUDA graphs to be traced are
  /// captured and instantiated: CUPTI may not see the kernels of a graph instantiated before tracing
  /// began. Throws moefold::Error when libcupti cannot be loaded (naming the paths tried), when a
  /// KernelTrace already exists, or when CUPTI refuses (its message).
  /// Also records every CUDA runtime call of the host (CUPTI_ACTIVITY_KIND_RUNTIME) when host_calls.
  static std::unique_ptr<KernelTrace> start(bool host_calls = false);
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  /// Now on the records' clock (CUPTI's timestamp, ns): brackets steps for summarize_timeline.
  int64_t now() const;

  /// What take() returns: the GPU's kernels, copies and memsets (copies named "[memcpy HtoD]" and the
  /// like), and the host's CUDA runtime calls.
  struct Records {
    std::vector<prof::KernelRecord> gpu;
    std::vector<prof::HostCall> host;
  };

  /// Synchronises the device, flushes CUPTI's buffers and returns everything recorded since start()
  /// or the last take(), kernel names demangled and shortened. Records CUPTI dropped (full buffers) make
  /// it throw, since a timeline with holes would misattribute time.
  Records take();

  /// The library that was loaded.
  const std::string& library() const { return library_; }

 private:
  KernelTrace() = default;
  std::string library_;
};

}  // namespace moefold::cuda
