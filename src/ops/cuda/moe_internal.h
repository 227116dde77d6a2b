// Internal to the MoE chain's .cu files: the expert-kernel configuration chosen for a capacity (the
// plan's row tiles must use the same BM as the kernels), the CUB scratch size of the plan, and the
// launchers of the small-batch (decode) split-GEMV expert kernels of moe_gemv.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/moe.h"

namespace moefold::cuda::moe_detail {

/// Expert-kernel configuration: without batch_invariant the small-batch GEMV (kMoeExpertGemv) for
/// capacities up to kMoeSmallBatchMaxRows; with it the tensor-core streaming kernels (kMoeExpertStream,
/// bit-identical to the tiles) up to kMoeStreamMaxRows; above, by the average rows per expert at full
/// capacity (capacity * k / E): 0 = decode tiles (BM 16: weight streaming), 1 = medium (BM 64),
/// 2 = prefill (BM 128).
inline int expert_config(const MoeShape& s) {
  if (s.expert_tiles >= 0) return s.expert_tiles;
  if (s.capacity <= kMoeSmallBatchMaxRows) {
    if (!s.batch_invariant) return kMoeExpertGemv;
    if (s.capacity <= kMoeStreamMaxRows) return kMoeExpertStream;
  }
  const double avg = double(s.capacity) * s.k / s.E;
  return avg < 24.0 ? 0 : (avg < 96.0 ? 1 : 2);
}
/// Rows of one plan tile: the GEMV takes up to 8 pairs of one expert per tile (a tile per touched
/// expert unless more than 8 of the step's rows chose it), the streaming kernels 16 like the 16-row tiles.
constexpr int expert_tile_rows(int config) {
  return config == kMoeExpertGemv ? 8 : (config == 0 || config == kMoeExpertStream ? 16 : (config == 1 ? 64 : 128));
}
constexpr int kMinTileRows = 8;  // the smallest of expert_tile_rows: the most tiles a capacity can need

/// Upper bound of sum over experts of ceil(n_e / bm) with sum n_e <= P and at most min(E, P) experts.
inline int max_row_tiles(const MoeShape& s, int bm) {
  const long long P = 1LL * s.capacity * s.k;
  const long long nonempty = P < s.E ? P : s.E;
  return int((P + nonempty * (bm - 1)) / bm);
}

/// The plan as the expert kernels read it (all device pointers, written by moe_plan).
struct PlanView {
  const int32_t* pairs = nullptr;
  const int2* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  const int32_t* offsets = nullptr;
};
/// The plan a workspace holds, as the expert kernels read it.
inline PlanView plan_view(const MoeWorkspace& ws) { return PlanView{ws.pairs, ws.tiles, ws.num_tiles, ws.offsets}; }

/// Small-batch gate_up + SwiGLU (moe_gemv.cu): act[j, c] = bf16(silu(g) * u) for every planned pair j,
/// [g | u] the fp32 dot products of x[pairs[j] / k] with gate row c and up row I + c of its expert.
/// max_tiles: the grid's worst case of plan tiles (16 rows each). Asynchronous.
void launch_gemv_gate_up(const __nv_bfloat16* x, const __nv_bfloat16* gate_up, const PlanView& plan, int k, int H,
                         int I, int max_tiles, __nv_bfloat16* act, cudaStream_t stream);

/// Small-batch down (moe_gemv.cu): y[pairs[j], h] = bf16(act[j, :] . down[e][h, :]) for every planned
/// pair j of expert e. Asynchronous.
void launch_gemv_down(const __nv_bfloat16* act, const __nv_bfloat16* down, const PlanView& plan, int H, int I,
                      int max_tiles, __nv_bfloat16* y, cudaStream_t stream);

struct GemmParams;  // moe_gemm.cuh

/// The shared expert as extra items of the streaming kernels (moe_stream.cu's header): B == nullptr
/// means none. Its intermediate size must equal the routed experts' I (the items share K and groups).
struct StreamShared {
  const __nv_bfloat16* A = nullptr;  // gate_up: x [capacity, H]; down: the shared act [capacity, I]
  const __nv_bfloat16* B = nullptr;  // gate_up: [2I, H] (gate rows, then up rows); down: [H, I]
  __nv_bfloat16* C = nullptr;        // gate_up: the shared act [capacity, I]; down: shared_out [capacity, H]
  const int32_t* live = nullptr;     // device: live token rows (clamped to [0, capacity])
  int capacity = 0;                  // token rows the buffers hold
  int splits = 1;                    // S = decode_gemm_splits(N, K) of this projection (N = 2I or H)
  int up_offset = 0;                 // gate_up: the first up row (I)
};

/// Decode-size gate_up + SwiGLU on tensor cores (moe_stream.cu): the tile kernels' function and bits
/// (GemmParams of GemmMode::kExpertGateUp), work items of 16 weight rows per plan tile of <= 16 pairs.
/// max_tiles: the worst case of plan tiles at the step's capacity. With `shared` (B non-null) the
/// shared expert's gate_up items too (act = swiglu of the dense chain's bf16 gate / up). Asynchronous.
void launch_stream_gate_up(const GemmParams& p, int max_tiles, cudaStream_t stream, const StreamShared& shared = {});
/// The same for down (GemmParams of GemmMode::kExpertDown; `shared`: the shared expert's down items,
/// shared_out = bf16 of the dense chain). Asynchronous.
void launch_stream_down(const GemmParams& p, int max_tiles, cudaStream_t stream, const StreamShared& shared = {});
/// Whether the streaming down kernel issues its first weight loads before waiting for the previous
/// kernel (PDL; default on, MOEFOLD_MOE_EARLY_DOWN=0 turns it off). The setter is for A/B timing in
/// tests; the bits do not change.
void set_stream_early_down(bool on);
bool stream_early_down();
/// Whether the streaming kernels run the wide configuration (5 warps a CTA, shallower rings: moe_stream.cu;
/// default off, MOEFOLD_MOE_STREAM_WIDE=1 turns it on). The setter is for A/B timing in tests; the bits
/// do not change.
void set_stream_wide(bool on);
/// Back to MOEFOLD_MOE_STREAM_WIDE's setting (unset: 5 warps for launches with shared-expert items only).
void reset_stream_wide();
bool stream_wide();

/// Whether the router's top-k (router_topk_kernel, moe_route's fused small-step kernel) runs the fast
/// versions (moe_topk.cuh topk_row_fast, router_topk_plan_fast_kernel: the same bytes, shorter chains);
/// default on, MOEFOLD_MOE_ROUTE=old selects the previous kernels. The setter is for A/B tests.
void set_route_fast(bool on);
bool route_fast();
/// Whether the fast fused route takes the row's top-k with VPT warps (moe_topk.cuh topk_row_wide) when
/// every live row fits the CTA at once; default on, MOEFOLD_MOE_ROUTE=narrow keeps a warp a row. The
/// same bytes either way; the setter is for A/B tests.
void set_route_wide(bool on);
bool route_wide();
/// Whether moe_combine runs the one-pass kernel (every input of a row's chunk loaded before the shared
/// gate's reduction; the same bytes) where it applies (k <= 8, H <= 2048); default on,
/// MOEFOLD_MOE_COMBINE=old selects the previous kernel. The setter is for A/B tests.
void set_combine_fast(bool on);
bool combine_fast();
/// Tests: whether moe_combine may fuse the next norm into the combine (MOEFOLD_FUSE_COMBINE_NORM's switch).
void set_combine_norm_fused(bool on);
/// Capacity (rows) from which moe_router_logits runs the 128 x 128-tile kernel (router_logits_wide_kernel)
/// instead of the 16 x 16 tiles: a prefill-sized step. Both give the same bytes.
inline constexpr int kRouterWideMinRows = 2048;
/// The router logits kernel: automatic (by kRouterWideMinRows), the 16 x 16 tiles or the wide tiles
/// (MOEFOLD_MOE_ROUTER_LOGITS=tile|wide sets it at start-up). The setter is for A/B tests.
enum class RouterLogitsKind { kAuto, kTile, kWide };
void set_router_logits_kind(RouterLogitsKind kind);
/// Whether moe_router_logits takes the wide-tile kernel at this capacity.
bool router_logits_wide(int capacity);
/// Whether moe_router_route runs the cluster-fused router logits + top-k + plan kernel where it applies
/// (moe_router_cluster_fused); default off, MOEFOLD_MOE_ROUTER_CLUSTER=1 turns it on (the same bytes).
/// The setter is for A/B tests.
void set_router_cluster(bool on);
bool router_cluster();
/// Cluster-fused router kernels launched by this process (tests: proof that the fused kernel ran).
int64_t router_cluster_launches();

}  // namespace moefold::cuda::moe_detail

namespace moefold::cuda {
/// Bytes of CUB temp storage the plan's large path needs (0 when the one-CTA path is used).
size_t moe_plan_cub_temp_bytes(int capacity, int k, int E);
}  // namespace moefold::cuda
