// Row-wise and elementwise kernels of the CUDA backend: embedding gather, RMSNorm (plain and
// zero-centred, optionally fused with the residual add), SwiGLU on fused [gate | up] rows, the
// sigmoid output gate and the residual add. bf16 storage, fp32 math, one rounding per output.
//
// Live rows. Every function takes `max_rows` (host: the buffer's capacity in rows, e.g. a CUDA-graph
// bucket; sizes the grid) and `live_rows` (device pointer to one int32, or nullptr = all max_rows
// rows live). Rows r >= *live_rows are neither read nor written, so a step captured once at the
// bucket size replays for any live count <= max_rows. Preconditions are checked on the host and
// throw moefold::Error; nothing is synchronised.
//
// Sources of the math: ops/cpu/norm.h (transformers Qwen3_5MoeRMSNorm / Qwen3RMSNorm / LlamaRMSNorm),
// ops/cpu/linear.h (swiglu), the design doc qwen3_5_moe.md section 4 (output gate, residuals).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cpu/norm.h"  // NormKind

namespace moefold::cuda {

using bf16 = __nv_bfloat16;
using cpu::NormKind;

/// Where the rows of a [tokens, heads, dim] tensor live inside a larger bf16 buffer: element
/// (t, h, i) is at base[t * token_stride + h * head_stride + i]. Zero strides mean dense
/// (head_stride = dim, token_stride = heads * head_stride). Example: the per-head query rows of
/// Qwen3.5's fused q_proj output [T, Hq, 2D] ([query D | gate D] per head) are
/// {heads = Hq, token_stride = 2*Hq*D, head_stride = 2*D} at base qg, the gates the same at qg + D.
struct HeadRows {
  int64_t heads = 1;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

/// out[t, :] = table[ids[t], :] for t < live. table [vocab, hidden], out [max_rows, hidden] dense.
/// An id outside [0, vocab) is never dereferenced: its row is written as zeros and *oob_flag is set
/// to 1 (oob_flag: device int32 the caller zeroes beforehand and checks after; may be nullptr).
void embedding_gather(const bf16* table, int64_t vocab, int64_t hidden, const int32_t* ids, bf16* out,
                      int64_t max_rows, const int32_t* live_rows, int32_t* oob_flag, cudaStream_t stream);

/// RMSNorm per row of `dim`: y = x / sqrt(mean(x^2) + eps) * (w or 1 + w), all in fp32, rounded once.
/// x and y share the layout `rows` ([tokens, heads, dim]); live_rows counts TOKENS (each carries
/// rows.heads norm rows). x and y may alias (in place). w: [dim] bf16.
void rms_norm(const bf16* x, const bf16* w, bf16* y, int64_t max_rows, int64_t dim, float eps, NormKind kind,
              const int32_t* live_rows, cudaStream_t stream, HeadRows rows = {});

/// Fused residual add + RMSNorm on dense [max_rows, dim] rows: h = bf16(h + y) (the residual stream,
/// updated in place), then x = rms_norm(h) computed from the rounded h (as transformers does: the
/// residual add happens in bf16 before the next norm reads it). x must not alias h or y.
void add_rms_norm(bf16* h, const bf16* y, const bf16* w, bf16* x, int64_t max_rows, int64_t dim, float eps,
                  NormKind kind, const int32_t* live_rows, cudaStream_t stream);

/// SwiGLU on fused rows: gate_up [max_rows, 2I] = [gate | up]; out[t, i] = silu(gate[t, i]) * up[t, i]
/// (fp32, one rounding). gate_up_stride: elements between rows of gate_up (0 = 2I).
void swiglu(const bf16* gate_up, bf16* out, int64_t max_rows, int64_t I, const int32_t* live_rows,
            cudaStream_t stream, int64_t gate_up_stride = 0);

/// Output gate: y[t, h, i] = x[t, h, i] * sigmoid(gate(t, h, i)) for x, y dense [max_rows, heads, dim]
/// (may alias), gate(t, h, i) at gate[t * gate_rows.token_stride + h * gate_rows.head_stride + i *
/// gate_elem_stride] (gate_elem_stride = 0 broadcasts one gate per (token, head), e.g. the shared
/// expert's scalar gate with heads = 1). gate_rows.heads must equal `heads`.
void sigmoid_gate_mul(const bf16* x, const bf16* gate, bf16* y, int64_t max_rows, int64_t heads, int64_t dim,
                      const int32_t* live_rows, cudaStream_t stream, HeadRows gate_rows = {},
                      int64_t gate_elem_stride = 1);

/// Residual add in place: h[t, :] = bf16(h[t, :] + y[t, :]) on dense [max_rows, dim].
void residual_add(bf16* h, const bf16* y, int64_t max_rows, int64_t dim, const int32_t* live_rows,
                  cudaStream_t stream);

}  // namespace moefold::cuda
