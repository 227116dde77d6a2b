// Which weight-streaming loads carry an L2 evict_first policy (ptx.cuh l2_policy): the decode GEMM's
// weight copies and L2 prefetch, the streaming expert kernels' weight copies, and moe_gemm_kernel's in
// steps of up to 8 rows (moe_experts.cu). A batch-1 decode step
// streams ~5 GB of weights through a 50 MB L2 once; without a hint those lines evict what the step
// reuses (activations, router logits, step metadata, the kernels' code), so the many small kernels
// between the GEMMs miss in L2. MOEFOLD_L2_STREAM_HINT: 0 none, 1 the weight copies, 2 the copies and
// the decode GEMM's L2 prefetch. ptx::ld_stream16 (the FP8 decode kernels' weight loads) always
// carries it. The hint never changes results, only what stays in L2.
#pragma once

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace moefold::cuda {

/// MOEFOLD_L2_STREAM_HINT (0, 1 or 2; default 1), read once. Another value throws moefold::Error.
inline int l2_stream_hint() {
  static const int mode = [] {
    const char* v = std::getenv("MOEFOLD_L2_STREAM_HINT");
    if (!v || !*v) return 1;
    const std::string s(v);
    if (s == "0" || s == "1" || s == "2") return s[0] - '0';
    throw Error("MOEFOLD_L2_STREAM_HINT=" + s + ": expected 0, 1 or 2");
  }();
  return mode;
}

}  // namespace moefold::cuda
