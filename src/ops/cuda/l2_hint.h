// Which weight-streaming loads carry an L2 evict_first policy (ptx.cuh l2_policy): the decode GEMM's
// weight copies and L2 prefetch, the streaming expert kernels' weight copies, and moe_gemm_kernel's in
// steps of up to 8 rows (moe_experts.cu). A batch-1 decode step
// streams ~5 GB of weights through a 50 MB L2 once; without a hint those lines evict what the step
// reuses (activations, router logits, step metadata, the kernels' code), so the many small kernels
// between the GEMMs miss in L2. MOEFOLD_L2_STREAM_HINT: 0 none, 1 the weight copies, 2 the copies and
// the decode GEMM's L2 prefetch. ptx::ld_stream16 (the FP8 decode kernels' weight loads) always
// carries it. The hint never changes results, only what stays in L2.
//
// Prefetching weights into L2 ahead of the kernel that reads them (cp.async.bulk.prefetch.L2, evict_first):
// at batch 1 the HBM idles while the small kernels between the GEMMs run (the route, the norms, the
// DeltaNet or attention core), and the kernel after them then starts its stream cold. MOEFOLD_L2_PREFETCH
// is a set of letters (default "nsr"; "0" or "" none):
//   n  a dense projection prefetches the next weights at its end: the DeltaNet or attention
//      in-projection the output projection, the output projection the MoE router (CudaExecutor, up to
//      kPrefetchNextMaxRows rows);
//   s  the streaming expert kernels (moe_stream.cu) prefetch all of their warps' weight rows at their
//      start, and gate_up the shared expert's weights before waiting for the route;
//   r  the fused route (moe_plan.cu) prefetches the gate_up weights of the experts it picked, as soon as
//      the top-k is known (up to kRoutePrefetchBytes).
// Prefetches change only what is in L2, never a result.
#pragma once

#include <cstddef>
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

/// A byte range of device memory to prefetch into L2 (ptr 16-byte aligned; nullptr = none).
struct L2Range {
  const void* ptr = nullptr;
  size_t bytes = 0;
};

/// Which L2 prefetches are on (the letters of MOEFOLD_L2_PREFETCH, see above).
struct L2Prefetch {
  bool next = false;    // n
  bool stream = false;  // s
  bool route = false;   // r
};

/// MOEFOLD_L2_PREFETCH, read once (unset: "nsr"; "0" or empty: none). Another letter throws moefold::Error.
inline L2Prefetch l2_prefetch() {
  static const L2Prefetch mode = [] {
    const char* v = std::getenv("MOEFOLD_L2_PREFETCH");
    const std::string s = v ? v : "nsr";
    L2Prefetch m;
    if (s == "0") return m;
    for (char c : s) {
      if (c == 'n') m.next = true;
      else if (c == 's') m.stream = true;
      else if (c == 'r') m.route = true;
      else throw Error("MOEFOLD_L2_PREFETCH=" + s + ": expected letters of n, s, r (or 0 for none)");
    }
    return m;
  }();
  return mode;
}

/// The fused route prefetches routed experts' gate_up weights while the pairs' total stays within this.
inline constexpr size_t kRoutePrefetchBytes = size_t(36) << 20;

}  // namespace moefold::cuda
