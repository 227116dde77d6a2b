// The MoE layer with its shared expert fused into the streaming expert kernels (moe.h:
// moe_forward_shared): at the capacities where moe_expert_config picks kMoeExpertStream (batch
// invariant, capacity <= kMoeStreamMaxRows), the shared expert's gate_up and down run as extra items of
// the two moe_stream_kernel launches instead of decode GEMM + swiglu_kernel + decode GEMM (three
// launches fewer a layer). The items reproduce that dense chain's bits (moe_stream.cu's header), so a
// row's output does not depend on which of the two ran (MoeSharedStream.* in tests/cuda/moe_test).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemm.cuh"
#include "ops/cuda/moe_internal.h"

namespace moefold::cuda {
namespace {

using moe_detail::GemmParams;

const prof::Kernel kStreamShared[2] = {{"moe_stream_kernel:gate_up+shared", prof::Category::RoutedExpertGemm},
                                       {"moe_stream_kernel:down+shared", prof::Category::RoutedExpertGemm}};

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// Bytes of one expert GEMM of the fused launch: the touched routed experts (at most min(E, pairs)) and
/// the shared weights once, the live activations read and the outputs written.
prof::Work fused_work(bool gate_up, const MoeShape& s, const int32_t* num_rows) {
  const double T = double(work_rows(s.capacity, num_rows)), H = s.H, I = s.I, pairs = T * s.k;
  const double experts = std::min<double>(s.E, pairs) + (T > 0 ? 1 : 0), units = pairs + T;
  if (gate_up) return prof::Work{experts * 2 * I * H * 2 + T * H * 2 + units * I * 2, 2.0 * units * H * 2 * I};
  return prof::Work{experts * H * I * 2 + units * I * 2 + units * H * 2, 2.0 * units * I * H};
}

}  // namespace

bool moe_shared_stream_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOEFOLD_MOE_SHARED_STREAM");
    const std::string s = v ? v : "";
    MOEFOLD_CHECK(s.empty() || s == "0" || s == "1",
                  fmt::runtime("MOEFOLD_MOE_SHARED_STREAM={}: expected 0 or 1"), s);
    return s != "0";
  }();
  return on;
}

bool moe_shared_fusable(const MoeShape& shape, int shared_I) {
  return shared_I == shape.I && moe_expert_config(shape) == kMoeExpertStream;
}

void moe_forward_shared(const __nv_bfloat16* x, const __nv_bfloat16* w_router, const __nv_bfloat16* gate_up,
                        const __nv_bfloat16* down, const MoeSharedExpert& shared, const __nv_bfloat16* shared_gate_w,
                        const __nv_bfloat16* residual, const int32_t* num_rows, const MoeShape& shape,
                        bool renormalize, const MoeWorkspace& ws, __nv_bfloat16* out, cudaStream_t stream,
                        const int32_t* replay, const MoeNextNorm* next) {
  MOEFOLD_CHECK(shape.capacity <= ws.capacity,
                fmt::runtime("moe_forward_shared: step capacity {} exceeds the workspace's {}"), shape.capacity,
                ws.capacity);
  MOEFOLD_CHECK(moe_shared_fusable(shape, shared.I),
                fmt::runtime("moe_forward_shared: the shared expert (intermediate {}) cannot run in the streaming "
                             "kernels of capacity {} (expert kernels {}, routed I={}); use moe_forward"),
                shared.I, shape.capacity, moe_expert_config(shape), shape.I);
  MOEFOLD_CHECK(shared.gate_up && shared.down && shared.act && shared.out && num_rows && aligned16(x) &&
                    aligned16(shared.gate_up) && aligned16(shared.down) && aligned16(shared.act) &&
                    aligned16(shared.out),
                fmt::runtime("moe_forward_shared: null or unaligned (16 bytes) shared-expert buffers or live count"));
  const int H = shape.H, I = shape.I;
  moe_router_logits(x, w_router, num_rows, shape, ws.logits, stream);
  moe_route(ws.logits, num_rows, shape, renormalize, ws, stream, replay);

  GemmParams p;
  p.pairs = ws.pairs;
  p.tiles = ws.tiles;
  p.num_tiles = ws.num_tiles;
  p.offsets = ws.offsets;
  p.topk = shape.k;
  const int tiles = std::min(ws.max_tiles, moe_detail::max_row_tiles(shape, moe_detail::expert_tile_rows(kMoeExpertStream)));

  moe_detail::StreamShared sh;
  sh.live = num_rows;
  sh.capacity = shape.capacity;
  {  // gate_up: routed act per pair, shared act per token row
    p.A = x;
    p.B = gate_up;
    p.C = ws.act;
    p.K = H;
    p.N = I;
    p.ldc = I;
    p.b_expert_stride = int64_t(2) * I * H;
    p.b_up_offset = I;
    sh.A = x;
    sh.B = shared.gate_up;
    sh.C = shared.act;
    sh.splits = decode_gemm_splits(2 * int64_t(I), H);
    sh.up_offset = I;
    LaunchScope launch(kStreamShared[0], stream, [&] { return fused_work(true, shape, num_rows); });
    moe_detail::launch_stream_gate_up(p, tiles, stream, sh);
  }
  {  // down: routed y per pair, shared_out per token row
    p.A = ws.act;
    p.B = down;
    p.C = ws.y;
    p.K = I;
    p.N = H;
    p.ldc = H;
    p.b_expert_stride = int64_t(H) * I;
    p.b_up_offset = 0;
    sh.A = shared.act;
    sh.B = shared.down;
    sh.C = shared.out;
    sh.splits = decode_gemm_splits(H, I);
    sh.up_offset = 0;
    LaunchScope launch(kStreamShared[1], stream, [&] { return fused_work(false, shape, num_rows); });
    moe_detail::launch_stream_down(p, tiles, stream, sh);
  }
  moe_combine(ws.weights, ws, shared.out, shared_gate_w, x, residual, num_rows, shape, out, stream, next);
}

}  // namespace moefold::cuda
