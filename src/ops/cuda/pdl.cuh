// Programmatic Dependent Launch (Hopper, sm_90): consecutive kernels on one stream may overlap the
// launch of the next with the end of the previous one. Every kernel of this backend starts with
// pdl_begin(): it waits until the previous kernel in the stream has completed and its writes are visible
// (griddepcontrol.wait, a no-op for a kernel not launched with PDL), then lets the next kernel launch
// (griddepcontrol.launch_dependents), whose blocks in turn wait at their own pdl_begin(). So no kernel
// reads anything before its predecessors are done, and the launch latency of each boundary overlaps the
// previous kernel's last wave. Inside a CUDA graph the same launches become programmatic edges.
// launch_pdl() launches with the attribute; MOEFOLD_PDL=0 in the environment turns it off (A/B runs).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

#include "ops/cuda/cuda_check.h"

namespace moefold::cuda {

/// First statement of every kernel: wait for the preceding kernel, then release the next one.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Whether launches use PDL (MOEFOLD_PDL unset or not "0"; read once).
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOEFOLD_PDL");
    return !(v && v[0] == '0' && v[1] == '\0');
  }();
  return on;
}

/// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialisation allowed (when
/// pdl_enabled()). The kernel must begin with pdl_begin(). Throws moefold::Error on a launch error.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  MOEFOLD_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace moefold::cuda
