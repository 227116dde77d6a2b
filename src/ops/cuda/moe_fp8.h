// Routed experts with block-scaled FP8 weights (core/fp8_block.h) at decode sizes over the plan of
// moe_gemv.cu (tiles of <= 8 pairs of one expert), streaming each touched expert's e4m3 weights and fp32
// per-row block scales once over all SMs (W8A16: bf16 activations, weights decoded exactly to bf16 in
// registers, fp32 accumulation). moe_fp8_expert_gate_up / _down run on the tensor cores (mma.sync,
// fp8_mma.cuh: a tile's pairs are the 8 tokens of the mma's n8 fragment); the *_simt variants are the
// CUDA-core kernels of before (fp8.cuh), kept as the benchmarks' baseline. Either's reduction order is
// fixed by the shape: bitwise batch-invariant at every capacity. Router, top-k, plan and combine are the bf16 chain's own (moe.h), so expert 0 and
// expert E-1 are routed, planned and combined like any other and padding rows are never touched.
//
// Layouts: gate_up [E, 2I, H] e4m3 (rows 0..I-1 gate, I..2I-1 up of each expert; per-expert checkpoints
// stacked so), gate_up_scale [E * 2I, ceil(H / 128)] fp32; down [E, H, I] e4m3, down_scale
// [E * H, ceil(I / 128)]. Math per pair (row t, expert e): act = bf16(silu(g) * u) with g, u the fp32
// sums; y = bf16(act . down_e). Shapes: moe.h's MoeShape (H % 128 == 0, I % 64 == 0).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/moe.h"

namespace moefold::cuda {

/// The most step rows the FP8 expert GEMV path takes (larger steps: moe_fp8_prefill_forward where
/// moe_fp8_prefill_supported, else the bf16 chain over dequantised weights).
inline constexpr int kMoeFp8MaxRows = 256;

/// ws.act[j, :] for every planned pair j (see the header). The plan must come from moe_route / moe_plan
/// with a shape whose expert_tiles is kMoeExpertGemv (8-pair tiles), e.g. moe_fp8_forward's.
/// Asynchronous; throws moefold::Error for an unsupported shape or a launch failure.
void moe_fp8_expert_gate_up(const __nv_bfloat16* x, const uint8_t* gate_up, const float* gate_up_scale,
                            const MoeShape& shape, const MoeWorkspace& ws, cudaStream_t stream);

/// ws.y[pair, :] for every planned pair. Same preconditions. Asynchronous.
void moe_fp8_expert_down(const uint8_t* down, const float* down_scale, const MoeShape& shape,
                         const MoeWorkspace& ws, cudaStream_t stream);

/// The CUDA-core versions of the two (same contract; other bits).
void moe_fp8_expert_gate_up_simt(const __nv_bfloat16* x, const uint8_t* gate_up, const float* gate_up_scale,
                                 const MoeShape& shape, const MoeWorkspace& ws, cudaStream_t stream);
void moe_fp8_expert_down_simt(const uint8_t* down, const float* down_scale, const MoeShape& shape,
                              const MoeWorkspace& ws, cudaStream_t stream);

/// A block-scaled FP8 shared expert (no bias), run inside the stream kernels.
struct MoeFp8SharedExpert {
  const uint8_t* gate_up = nullptr;     // [2 I, H] e4m3: gate rows 0..I-1, then up rows I..2I-1
  const float* gate_up_scale = nullptr;  // [2 I, ceil(H / 128)]
  const uint8_t* down = nullptr;        // [H, I] e4m3
  const float* down_scale = nullptr;    // [H, ceil(I / 128)]
  int I = 0;                            // its intermediate size
  __nv_bfloat16* act = nullptr;         // [capacity, I] scratch: swiglu of its gate / up
  __nv_bfloat16* out = nullptr;         // [capacity, H]: its output (combine's shared_out)
};

/// The same two functions for a one-token step (shape.capacity == 1), with the weights fed to shared
/// memory by the bulk copy engine (moe_fp8_stream.cu): the same bits as moe_fp8_expert_gate_up / _down.
/// With `shared` (and num_rows, the device live count) the shared expert's items too, with the bits of
/// its dense chain (fp8_gemv gate_up, swiglu, fp8_gemv down): shared->act, then shared->out.
/// Preconditions as theirs and moe_fp8_stream_supported(shape) (with `shared`: moe_fp8_shared_fusable);
/// moefold::Error otherwise. Asynchronous. moe_fp8_stream_down must be launched right after
/// moe_fp8_stream_gate_up on the same stream: it reads the plan and requests its weights before its PDL
/// wait, which is safe only because gate_up's blocks passed theirs (so the route is complete).
void moe_fp8_stream_gate_up(const __nv_bfloat16* x, const uint8_t* gate_up, const float* gate_up_scale,
                            const MoeShape& shape, const MoeWorkspace& ws, cudaStream_t stream,
                            const MoeFp8SharedExpert* shared = nullptr, const int32_t* num_rows = nullptr);
void moe_fp8_stream_down(const uint8_t* down, const float* down_scale, const MoeShape& shape, const MoeWorkspace& ws,
                         cudaStream_t stream, const MoeFp8SharedExpert* shared = nullptr,
                         const int32_t* num_rows = nullptr);
/// Whether a shared expert of intermediate size shared_I can run inside the stream kernels of `shape`
/// (enabled and supported, shared_I == shape.I, and the dense chain's K split equal to the items').
bool moe_fp8_shared_fusable(const MoeShape& shape, int shared_I);
/// Whether the stream kernels take `shape`: capacity 1, H % 128 == 0, I % 64 == 0, and a stage of
/// 16-row items fits their shared memory (H up to ~4,000 bytes a row for gate_up).
bool moe_fp8_stream_supported(const MoeShape& shape);
/// Whether moe_fp8_forward runs them where supported (default on; MOEFOLD_MOE_FP8_STREAM=0 turns them
/// off). The setter is for A/B tests; the bits do not change.
void set_moe_fp8_stream(bool on);
bool moe_fp8_stream_enabled();
/// Stream-kernel launches issued by this process (tests: proof that they ran).
int64_t moe_fp8_stream_launches();

/// The routed chain of moe_forward with FP8 experts: router logits -> moe_route (GEMV tiles) -> FP8
/// gate_up -> FP8 down (the stream kernels at capacity 1 where enabled and supported) -> moe_combine (fp32, slot order, + gated shared expert + residual).
/// shape.capacity <= kMoeFp8MaxRows. Arguments otherwise as moe_forward.
void moe_fp8_forward(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const uint8_t* gate_up,
                     const float* gate_up_scale, const uint8_t* down, const float* down_scale,
                     const __nv_bfloat16* shared_out, const __nv_bfloat16* shared_gate_w,
                     const __nv_bfloat16* residual, const int32_t* num_rows, const MoeShape& shape, bool renormalize,
                     const MoeWorkspace& ws, __nv_bfloat16* out, cudaStream_t stream,
                     const int32_t* replay = nullptr, const MoeNextNorm* next = nullptr);

/// moe_fp8_forward with the shared expert inside the two stream kernels (three launches fewer than its
/// dense chain, the same bits): moe_fp8_shared_fusable(shape with 8-pair tiles, shared.I) must hold.
/// Arguments as moe_fp8_forward, shared_out being shared.out.
void moe_fp8_forward_shared(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const uint8_t* gate_up,
                            const float* gate_up_scale, const uint8_t* down, const float* down_scale,
                            const MoeFp8SharedExpert& shared, const __nv_bfloat16* shared_gate_w,
                            const __nv_bfloat16* residual, const int32_t* num_rows, const MoeShape& shape,
                            bool renormalize, const MoeWorkspace& ws, __nv_bfloat16* out, cudaStream_t stream,
                            const int32_t* replay = nullptr, const MoeNextNorm* next = nullptr);

// ---- prefill sizes: W8A8 on the FP8 warpgroup tensor cores (moe_fp8_wgmma.cu) ----------------------

/// Whether moe_fp8_prefill_forward takes `shape`: H % 128 == 0 and I % 128 == 0 (whole activation
/// blocks in both GEMMs' K); other shapes run the bf16 chain over dequantised weights.
bool moe_fp8_prefill_supported(const MoeShape& shape);

/// Whether a step of step.capacity rows runs its FP8 experts through moe_fp8_prefill_forward: more than
/// kMoeFp8MaxRows rows, moe_fp8_prefill_supported(step), and MOEFOLD_MOE_FP8_PREFILL unset or "wgmma"
/// ("dequant": the bf16 chain over dequantised weights, for A/B timing; read once; another value throws
/// moefold::Error). The CUDA executor and `moefold probe` decide by it.
bool moe_fp8_prefill_runs(const MoeShape& step);

/// Device scratch of the prefill chain: the activations quantised per token and 128 columns
/// (fp8_act_quant.h). xq [capacity, H] e4m3, xs [capacity, H / 128] fp32; aq [capacity * k, I] e4m3,
/// as [capacity * k, I / 128] fp32 (act in plan order).
struct MoeFp8PrefillScratch {
  uint8_t* xq = nullptr;
  float* xs = nullptr;
  uint8_t* aq = nullptr;
  float* as = nullptr;
  int capacity = 0;
};
/// Bytes moe_fp8_prefill_scratch_bind needs for `shape` (scales with capacity * k, never with E).
size_t moe_fp8_prefill_scratch_bytes(const MoeShape& shape);
/// Carves `base` (>= moe_fp8_prefill_scratch_bytes, 256-byte aligned). Throws moefold::Error for an
/// unsupported shape or a short buffer.
MoeFp8PrefillScratch moe_fp8_prefill_scratch_bind(void* base, size_t bytes, const MoeShape& shape);

/// The routed chain with FP8 experts at any step size, W8A8 (the releases' dynamic activation scheme):
/// router logits -> moe_route (128-row tiles) -> x quantised 1 x 128 -> gate_up + SwiGLU (act, bf16) ->
/// act quantised 1 x 128 -> down (y, bf16) -> moe_combine (fp32, slot order, + gated shared expert +
/// residual). Per output an fp32 partial per 128-column block times its activation and weight scales,
/// accumulated in block order (moe_fp8_wgmma.cu): batch-invariant. Weight layouts as the header's;
/// moe_fp8_prefill_supported(shape) and shape.capacity <= the workspace's and the scratch's. Other
/// arguments as moe_fp8_forward. Asynchronous, capture-safe; throws moefold::Error otherwise.
void moe_fp8_prefill_forward(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const uint8_t* gate_up,
                             const float* gate_up_scale, const uint8_t* down, const float* down_scale,
                             const __nv_bfloat16* shared_out, const __nv_bfloat16* shared_gate_w,
                             const __nv_bfloat16* residual, const int32_t* num_rows, const MoeShape& shape,
                             bool renormalize, const MoeWorkspace& ws, const MoeFp8PrefillScratch& scratch,
                             __nv_bfloat16* out, cudaStream_t stream, const int32_t* replay = nullptr,
                             const MoeNextNorm* next = nullptr);

}  // namespace moefold::cuda
