// CUDA routed mixture-of-experts chain: router GEMM (fp32 logits), softmax + top-k, the per-expert plan
// (pairs grouped by expert with CUB), grouped SwiGLU expert GEMMs on tensor cores, and the combine
// (k expert outputs weighted in fp32, slot order, plus the gated shared expert). Math: src/ops/cpu/moe.h
// (router_topk, moe_plan, moe_experts) and Model::moe in src/models/model.cc.
//
// Live rows: every launch reads the live row count from DEVICE memory (`num_rows`, one int32 <= the
// capacity the buffers were sized for), so a CUDA graph captured at a bucket capacity can be replayed
// with fewer live rows. Padding rows (>= *num_rows) are never read as data, never routed, never run
// through an expert and never written. Nothing in the chain synchronises the host.
//
// Row-major everywhere; bf16 = __nv_bfloat16. Shapes: T = capacity (rows the buffers hold), E experts,
// k = top-k, H hidden size, I expert intermediate size, P = T * k (router pairs).
//
// Expert kernels by step capacity (moe_expert_config): without batch_invariant, capacity <=
// kMoeSmallBatchMaxRows (16) runs the small-batch split GEMV (moe_gemv.cu: CUDA-core fp32 dot products
// over the plan's tiles of <= 8 pairs of one expert); with batch_invariant (the engine's default),
// capacity <= kMoeStreamMaxRows (1) runs the tensor-core streaming kernels (moe_stream.cu: per warp one
// plan tile of <= 16 pairs x 16 weight rows at a time, a private cp.async ring over all K steps of its
// items); the other capacities run the tensor-core tiles (16 / 64 / 128 rows, moe_gemm.cuh). All
// compute the same function with fp32 accumulation, silu(g) * u from the fp32 gate and up sums rounded
// once to bf16 (act), and y rounded once to bf16; the combine is the same kernel. Where the streaming
// kernels run, moe_forward_shared also computes a dense shared expert inside them (extra work items,
// reproducing the invariant dense GEMM -> swiglu -> dense GEMM chain bit for bit).
//
// Batch invariance (bitwise): the router logits (K split by H only), top-k and combine are per row and
// independent of the capacity. The expert results of a pair depend only on its row's input, its
// expert's weights and the shape (E, k, H, I), never on the other rows, their count or the capacity,
// WITHIN one expert path: (a) tensor cores: the streaming kernels and every tile size give the same bits
// (per element the same mma.sync sequence over K from 0), so with batch_invariant a row's bits are the
// same at every capacity; (b) the GEMV at capacities 1..16 (one warp per output element, each lane sums
// its fixed 8-element chunks in K order, then a fixed xor-butterfly over the 32 lanes; no atomics, no
// split depending on the rows). Between (a) and (b) results differ in the last bits (a different
// summation order): without batch_invariant a row run at capacity 16 and at 17 may differ by bf16 rounding.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moefold::cuda {

/// Step capacities up to this many rows run the small-batch GEMV expert kernels (see above).
constexpr int kMoeSmallBatchMaxRows = 16;
/// MoeShape::expert_tiles / moe_expert_config value of the small-batch GEMV expert kernels.
constexpr int kMoeExpertGemv = 3;
/// MoeShape::expert_tiles / moe_expert_config value of the decode-size tensor-core streaming kernels
/// (moe_stream.cu: bit-identical to the tiles 0/1/2, 16-row plan tiles).
constexpr int kMoeExpertStream = 4;
/// With batch_invariant, step capacities up to this many rows run the streaming kernels (measured on the
/// H200, docs/benchmarks.md: 12% faster than the 16-row tiles at one token, slower from two on).
constexpr int kMoeStreamMaxRows = 1;

/// Static sizes of one MoE layer at one bucket capacity. Preconditions (checked, moefold::Error):
/// 1 <= k <= E <= 1024, E % 2 == 0, H % 128 == 0, I % 64 == 0, capacity >= 1, -1 <= expert_tiles <= 4.
struct MoeShape {
  int capacity = 0;  // T: rows the activation buffers hold (live rows are read from the device)
  int E = 0;         // routed experts
  int k = 0;         // experts per token
  int H = 0;         // hidden size
  int I = 0;         // expert intermediate size
  int expert_tiles = -1;  // -1: expert kernels chosen by capacity (moe_expert_config); 0/1/2 force the
                          // decode (16-row), medium (64) or prefill (128) tiles (bit-identical among
                          // themselves); 3 (kMoeExpertGemv) forces the small-batch GEMV at any capacity
                          // (tests, benchmarks; its bits differ from the tiles'); 4 (kMoeExpertStream)
                          // forces the streaming kernels (the tiles' bits)
  bool batch_invariant = false;  // with expert_tiles -1: never the GEMV (the streaming kernels or the
                                 // tiles instead), so a row's bits do not depend on the capacity
};

/// The expert kernels a step of `shape` runs: shape.expert_tiles when >= 0, else kMoeExpertGemv for
/// capacity <= kMoeSmallBatchMaxRows without batch_invariant, kMoeExpertStream for capacity <=
/// kMoeStreamMaxRows with it, else 0/1/2 (tiles of 16/64/128 rows by capacity * k / E). Two steps give
/// a row the same bits iff they run the same kind: GEMV (3) or tensor cores (0, 1, 2, 4).
int moe_expert_config(const MoeShape& shape);

/// Device scratch of the chain, carved from one allocation by moe_workspace_bind. Everything is sized by
/// P = capacity * k (never by capacity * E). Counters the tests read: offsets[E] (= live pairs, exactly
/// *num_rows * k when every id is valid), num_tiles, status.
struct MoeWorkspace {
  float* logits = nullptr;      // [T, E] fp32 router logits
  int32_t* ids = nullptr;       // [T, k] chosen experts
  float* weights = nullptr;     // [T, k] fp32 routing weights
  int32_t* counts = nullptr;    // [E] live pairs per expert
  int32_t* offsets = nullptr;   // [E + 1] exclusive scan of counts; offsets[E] = live pairs
  int32_t* pairs = nullptr;     // [P] pair ids (row * k + slot) grouped by expert, ascending within one;
                                // only [0, offsets[E]) is meaningful
  int2* tiles = nullptr;        // [max_tiles] {expert, first row within the expert} of each row tile,
                                // ascending expert (GEMV: 8-row tiles)
  int32_t* num_tiles = nullptr; // [1] row tiles the expert kernels run (sum over experts of ceil(n_e / BM))
  int32_t* status = nullptr;    // [1] number of live ids outside [0, E) seen by the plan (0 = OK)
  __nv_bfloat16* act = nullptr; // [P, I] silu(gate) * up per pair, at its position in `pairs`
  __nv_bfloat16* y = nullptr;   // [P, H] expert output per pair, at row pair id
  // internal: large-capacity plan path (CUB device radix sort)
  int32_t* sort_keys_in = nullptr;
  int32_t* sort_keys_out = nullptr;
  int32_t* sort_vals_in = nullptr;
  void* cub_temp = nullptr;
  size_t cub_temp_bytes = 0;
  int max_tiles = 0;  // row tiles the tile list holds: enough for every configuration at `capacity`
  int tile_rows = 0;  // BM of the expert GEMM configuration chosen for the bound capacity
  int capacity = 0;   // the capacity the workspace was bound for
};

/// Bytes of device scratch moe_workspace_bind needs for `shape` (256-byte aligned pieces).
size_t moe_workspace_bytes(const MoeShape& shape);

/// Carves `base` (device memory of >= moe_workspace_bytes(shape) bytes, 256-byte aligned) into a
/// MoeWorkspace. Throws moefold::Error if the shape is unsupported or the buffer too small.
///
/// Step shapes: every step function below accepts a shape whose capacity is SMALLER than the one the
/// workspace was bound for (same E, k, H, I), e.g. the step's row count: its grids and the expert-GEMM
/// tiles are then chosen for that capacity (a decode step in a workspace bound for prefill runs the
/// 16-row decode tiles; one of <= 16 rows the GEMV). Results are bit-identical whichever tiles run, and
/// among capacities <= 16 (see the header's batch invariance). A capacity above the bound one throws
/// moefold::Error.
MoeWorkspace moe_workspace_bind(void* base, size_t bytes, const MoeShape& shape);

/// Router logits: logits[t, e] = sum_h x[t, h] * w_router[e, h], bf16 inputs, fp32 accumulate and fp32
/// output (tensor cores). x: [T, H]; w_router: [E, H]; logits: [T, E]. Rows t >= *num_rows are neither
/// read nor written. Asynchronous; throws moefold::Error on a launch error.
void moe_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const int32_t* num_rows,
                       const MoeShape& shape, float* logits, cudaStream_t stream);

/// Softmax (fp32) + top-k of cpu::router_topk, bit-compatible with it on the same fp32 logits: p = e / sum
/// with e = exp(l - max) rounded to fp32 and the sum in fp64; ranking by p, NaN logits below every number,
/// ties by the lower expert index, expert 0 like any other, k distinct experts; weights divided by their
/// (fp64) sum when `renormalize`. logits: [T, E] fp32; ids: [T, k] int32; weights: [T, k] fp32. Rows
/// >= *num_rows are neither read nor written. Routing replay: when `replay` ([T, k] int32, device) is
/// given, ids = replay in its slot order and weights are the softmax probabilities of those experts
/// (renormalised the same way), bit-compatible with cpu::router_topk's replay; a replayed id outside
/// [0, E) is written as is (weight 0) and moe_plan reports it in ws.status. Asynchronous; throws
/// moefold::Error on a launch error.
void moe_router_topk(const float* logits, const int32_t* num_rows, const MoeShape& shape, bool renormalize,
                     int32_t* ids, float* weights, cudaStream_t stream, const int32_t* replay = nullptr);

/// The plan of cpu::moe_plan over the LIVE pairs only (the first *num_rows * k entries of ids [T, k]):
/// ws.counts, ws.offsets (exclusive scan), ws.pairs (grouped by expert, ascending pair id within one:
/// a stable CUB radix sort), and the row-tile list of the expert GEMMs. Ids of padding rows are never
/// read. A live id outside [0, E) is counted in ws.status and its pair dropped (never run, its y row
/// not written). Asynchronous; throws moefold::Error on a launch error.
void moe_plan(const int32_t* ids, const int32_t* num_rows, const MoeShape& shape, const MoeWorkspace& ws,
              cudaStream_t stream);

/// moe_router_topk then moe_plan (ids, weights and the plan in ws, the same bits), in ONE launch when
/// moe_route_fused(shape) (capacity <= 16, capacity * k <= 512, E <= 512: the decode steps), else the
/// two calls. Asynchronous; throws moefold::Error on a launch error.
void moe_route(const float* logits, const int32_t* num_rows, const MoeShape& shape, bool renormalize,
               const MoeWorkspace& ws, cudaStream_t stream, const int32_t* replay = nullptr);
/// Whether moe_route runs as one fused kernel for `shape`.
bool moe_route_fused(const MoeShape& shape);

/// moe_router_logits then moe_route (the same bytes in ws.logits, ids, weights and the plan), in ONE
/// launch when moe_router_cluster_fused(shape): a thread-block cluster of ceil(E / 16) CTAs computes the
/// logits, then its first CTA the top-k and the plan. Otherwise (or when the device cannot run the
/// cluster) the two calls. x, w_router as in moe_router_logits. Asynchronous; throws moefold::Error on a
/// launch error.
void moe_router_route(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const int32_t* num_rows,
                      const MoeShape& shape, bool renormalize, const MoeWorkspace& ws, cudaStream_t stream,
                      const int32_t* replay = nullptr);
/// Whether moe_router_route tries the cluster-fused kernel for `shape`: switched on
/// (MOEFOLD_MOE_ROUTER_CLUSTER=1), moe_route_fused(shape), E <= 256 (16 CTAs), the live rows' logits fit
/// the logits kernel's shared memory (capacity * E * 4 <= 12 / 24 / 48 KB at H % 128 / 256 / 512 == 0).
bool moe_router_cluster_fused(const MoeShape& shape);

/// First grouped expert GEMM with fused SwiGLU: for each planned pair at position j of ws.pairs (row t,
/// expert e): ws.act[j, :] = silu(g) * u with [g | u] = x[t, :] . gate_up[e]^T (fp32 accumulate, rounded
/// to bf16). x: [T, H]; gate_up: [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up). Experts with no rows cost
/// nothing. Needs moe_plan with the same step shape on the same workspace first (the plan's tiles
/// follow moe_expert_config(shape)). x, gate_up, down 16-byte aligned. Asynchronous.
void moe_expert_gate_up(const __nv_bfloat16* x, const __nv_bfloat16* gate_up, const MoeShape& shape,
                        const MoeWorkspace& ws, cudaStream_t stream);

/// Second grouped expert GEMM: ws.y[pair, :] = ws.act[j, :] . down[e]^T for each planned pair (fp32
/// accumulate, rounded to bf16). down: [E, H, I]. Asynchronous.
void moe_expert_down(const __nv_bfloat16* down, const MoeShape& shape, const MoeWorkspace& ws,
                     cudaStream_t stream);

/// The next layer's input RMSNorm, computed by the combine from the rows it writes (moe_combine):
/// x[t] = out[t] / sqrt(mean(out[t]^2) + eps) * (w or 1 + w), w: [H] bf16, x: [capacity, H] bf16.
struct MoeNextNorm {
  const __nv_bfloat16* w = nullptr;
  __nv_bfloat16* x = nullptr;
  float eps = 0.0f;
  bool zero_centred = false;
};

/// Combine, per live row t (fp32): acc = (residual ? residual[t] : 0) + sum over slots s in order of
/// weights[t, s] * y[t * k + s] + (shared_out ? sigmoid(shared_gate_w . x[t]) * shared_out[t] : 0)
/// (the sigmoid factor is 1 when shared_gate_w is null); out[t] = bf16(acc). weights: [T, k] fp32;
/// shared_out, residual, x, out: [T, H] bf16; shared_gate_w: [H] bf16 (x is read only when it is given).
/// residual may alias out. Rows >= *num_rows are neither read nor written. Asynchronous.
///
/// With `next` (the next layer's input norm), also next->x[t] = rms_norm(out[t]) for every live row, the
/// bits of cuda::rms_norm on out (elementwise.h): inside the combine's epilogue where its thread layout is
/// the norm's (moe_combine_norm_fused), else as a separate rms_norm launch after it. next->x may alias x.
void moe_combine(const float* weights, const MoeWorkspace& ws, const __nv_bfloat16* shared_out,
                 const __nv_bfloat16* shared_gate_w, const __nv_bfloat16* x, const __nv_bfloat16* residual,
                 const int32_t* num_rows, const MoeShape& shape, __nv_bfloat16* out, cudaStream_t stream,
                 const MoeNextNorm* next = nullptr);

/// Whether moe_combine computes `next` inside the combine kernel for this shape and these buffers (one
/// launch instead of two): the one-pass combine runs (k <= 8, capacity <= 8192, H <= 2048), H % 8 == 0
/// and out, next.x, next.w 16-byte aligned; and MOEFOLD_FUSE_COMBINE_NORM is not "0" (read once).
bool moe_combine_norm_fused(const MoeShape& shape, const __nv_bfloat16* out, const MoeNextNorm& next);

/// The whole routed chain: router logits -> top-k -> plan (moe_router_route: fused at decode sizes) ->
/// gate_up -> down -> combine, results in ws (logits, ids, weights, plan) and out: 5 launches at capacity
/// <= 16 (4 with the cluster-fused router, 6 above 16). Same arguments and preconditions as the steps above;
/// `replay` as in moe_router_topk, `next` as in moe_combine.
void moe_forward(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const __nv_bfloat16* gate_up,
                 const __nv_bfloat16* down, const __nv_bfloat16* shared_out, const __nv_bfloat16* shared_gate_w,
                 const __nv_bfloat16* residual, const int32_t* num_rows, const MoeShape& shape, bool renormalize,
                 const MoeWorkspace& ws, __nv_bfloat16* out, cudaStream_t stream, const int32_t* replay = nullptr,
                 const MoeNextNorm* next = nullptr);

/// A dense shared expert for moe_forward_shared: the weights as the dense path stores them and its
/// buffers. Rows t < *num_rows of act and out are written, no others.
struct MoeSharedExpert {
  const __nv_bfloat16* gate_up = nullptr;  // [2 I, H]: gate rows 0..I-1, then up rows I..2I-1 (no bias)
  const __nv_bfloat16* down = nullptr;     // [H, I] (no bias)
  int I = 0;                               // the shared expert's intermediate size
  __nv_bfloat16* act = nullptr;            // [capacity, I] scratch: swiglu of gate / up
  __nv_bfloat16* out = nullptr;            // [capacity, H]: the shared expert's output (combine's shared_out)
};

/// Whether the CUDA executor runs the shared expert through moe_forward_shared where it can:
/// MOEFOLD_MOE_SHARED_STREAM (read once): unset or 1 on (the default), 0 off (the shared expert as
/// decode GEMM + swiglu + decode GEMM; the same bits).
/// Throws moefold::Error naming the variable for any other value.
bool moe_shared_stream_enabled();

/// Whether moe_forward_shared can run `shape` with a shared expert of intermediate `shared_I`: the step
/// runs the streaming expert kernels (moe_expert_config == kMoeExpertStream: batch invariant, capacity
/// <= kMoeStreamMaxRows, or forced) and shared_I == shape.I. Throws moefold::Error for a bad shape.
bool moe_shared_fusable(const MoeShape& shape, int shared_I);

/// moe_forward with the shared expert computed inside the two streaming expert launches (extra work
/// items over the token rows: 5 launches a layer instead of 8): shared.out[t] = the dense chain's
/// result, bit for bit: bf16(invariant GEMM (decode_gemm_bf16's S(2I, H) splits) gate and up),
/// swiglu_kernel's act, bf16(invariant GEMM down with S(H, I) splits); then the combine with shared_out
/// = shared.out (sigmoid-gated by shared_gate_w when given), the same result as moe_forward after that
/// chain. Preconditions (moefold::Error, nothing launched): moe_shared_fusable(shape, shared.I), all
/// shared pointers non-null and 16-byte aligned, num_rows non-null; otherwise those of moe_forward.
/// Asynchronous.
void moe_forward_shared(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const __nv_bfloat16* gate_up,
                        const __nv_bfloat16* down, const MoeSharedExpert& shared, const __nv_bfloat16* shared_gate_w,
                        const __nv_bfloat16* residual, const int32_t* num_rows, const MoeShape& shape,
                        bool renormalize, const MoeWorkspace& ws, __nv_bfloat16* out, cudaStream_t stream,
                        const int32_t* replay = nullptr, const MoeNextNorm* next = nullptr);

}  // namespace moefold::cuda
