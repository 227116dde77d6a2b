// Internal to the MoE chain's .cu files: the expert-GEMM tile configuration chosen for a capacity (the
// plan's row tiles must use the same BM as the GEMMs) and the CUB scratch size of the plan.
#pragma once
#include <cstddef>

#include "ops/cuda/moe.h"

namespace moefold::cuda::moe_detail {

/// Expert-GEMM configuration by the average rows per expert at full capacity (capacity * k / E):
/// 0 = decode (BM 16: weight streaming), 1 = medium (BM 64), 2 = prefill (BM 128).
inline int expert_config(const MoeShape& s) {
  if (s.expert_tiles >= 0) return s.expert_tiles;
  const double avg = double(s.capacity) * s.k / s.E;
  return avg < 24.0 ? 0 : (avg < 96.0 ? 1 : 2);
}
inline int expert_tile_rows(int config) { return config == 0 ? 16 : (config == 1 ? 64 : 128); }

/// Upper bound of sum over experts of ceil(n_e / bm) with sum n_e <= P and at most min(E, P) experts.
inline int max_row_tiles(const MoeShape& s, int bm) {
  const long long P = 1LL * s.capacity * s.k;
  const long long nonempty = P < s.E ? P : s.E;
  return int((P + nonempty * (bm - 1)) / bm);
}

}  // namespace moefold::cuda::moe_detail

namespace moefold::cuda {
/// Bytes of CUB temp storage the plan's large path needs (0 when the one-CTA path is used).
size_t moe_plan_cub_temp_bytes(int capacity, int k, int E);
}  // namespace moefold::cuda
