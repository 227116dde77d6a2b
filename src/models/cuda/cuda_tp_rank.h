// One rank's part of the CUDA tensor / expert parallel step: what the CUDA executor
// (models/cuda/cuda_executor.cc) runs instead of its one-GPU code at the block boundaries when it holds
// a shard (parallel/shard_plan.h). The rank's attention / DeltaNet heads, intermediate columns and
// experts are the executor's own (its config is the rank's local config); this class adds the
// collectives and the kernels around them, all on the executor's stream, none synchronising the host
// (capturable in a CUDA graph when the communicator is: NCCL is, the single-device one is not):
//  - embedding: each rank gathers its vocabulary rows (zeros elsewhere) in fp32, all-reduced: exact;
//  - after each row-parallel block (o_proj / out_proj, the MLP's down, the MoE): the rank's bf16
//    partial (the MoE's fp32 one) summed over the ranks in fp32, then h = bf16(h + sum): the CPU
//    sharded forward's rounding points (models/model.cc);
//  - MoE: the replicated router and top-k over every expert, then this rank's experts on their pairs
//    (expert parallel: whole experts, else every expert's share of the intermediate columns; the
//    experts' rows are already on every rank, so no all-to-all: the block's all-reduce is the combine);
//  - lm_head: the rank's vocabulary rows, all-gathered in rank order into the full logits.
// Reduction order: sums over ranks are in rank order 0, 1, ..., N-1 (the single-device communicator
// sums so; over NCCL, with ordered_all_reduce, an all-gather then cuda::rank_order_sum), so tp = N
// results are deterministic and equal to the CPU backend's rank-order sums of the same partials.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "io/model_config.h"
#include "ops/cuda/device_buffer.h"
#include "ops/cuda/moe.h"
#include "parallel/communicator.h"
#include "parallel/shard_plan.h"

namespace moefold {

/// The shard a CUDA executor holds and the communicator of its group.
struct CudaShard {
  Communicator* comm = nullptr;  ///< a device backend ("nccl" or "device"); its stream is set to the executor's
  RankShard shard;
  /// Over NCCL: all-reduce as an all-gather plus a rank-order sum (deterministic, independent of NCCL's
  /// algorithm and so of the message size), instead of ncclAllReduce (fewer bytes, bits that may
  /// change with the step's rows). The single-device communicator always sums in rank order.
  bool ordered_all_reduce = true;
};

class CudaTpRank {
 public:
  /// `local`: the rank's config (vocab_size and num_experts global, moe_intermediate_size the rank's
  /// columns, a multiple of 64). Buffers for `max_rows` rows and `max_logits_rows` logits rows. Sets the
  /// communicator's stream to `stream`. Throws Error for a CPU communicator or unsupported sizes.
  CudaTpRank(const CudaShard& s, const ModelConfig& local, int64_t max_rows, int64_t max_logits_rows,
             cudaStream_t stream);

  /// h[t] = embedding row of ids[t] for the step's T rows (rows past *num_rows untouched); *oob set when
  /// an id is outside [0, vocab). embed_local: this rank's rows [vn, H].
  void embed(const __nv_bfloat16* embed_local, const int32_t* ids, int64_t T, const int32_t* num_rows, int32_t* oob,
             __nv_bfloat16* h);
  /// h = bf16(h + sum over ranks of y) (y: this rank's bf16 partial of a row-parallel block) [T, H].
  void reduce_into_residual(const __nv_bfloat16* y, __nv_bfloat16* h, int64_t T, const int32_t* num_rows);
  /// The MoE block with its residual: h = bf16(h + sum over ranks of (this rank's routed pairs +
  /// shared_out's gated part)). router_w [E, H] (all experts); gate_up [experts, 2I, H], down
  /// [experts, H, I]: the rank's; shared_out: this rank's shared-expert partial (or null);
  /// shared_gate_w [H] (or null); replay: device ids [T, k] (or null).
  void moe(const __nv_bfloat16* x, const __nv_bfloat16* router_w, const __nv_bfloat16* gate_up,
           const __nv_bfloat16* down, const __nv_bfloat16* shared_out, const __nv_bfloat16* shared_gate_w,
           __nv_bfloat16* h, int64_t T, const int32_t* num_rows, bool renormalize, bool batch_invariant,
           const int32_t* replay);
  /// The experts the last moe() chose [T, k] (global ids, device).
  const int32_t* route_ids() const { return route_ws_.ids; }
  /// Where the lm_head writes this rank's logits: [max_logits_rows, vocab_rows()] fp32.
  float* local_logits() { return local_logits_.data(); }
  int64_t vocab_rows() const { return s_.shard.vocab.count; }
  /// logits [n, vocab] = the ranks' local_logits() blocks of n rows, in vocabulary order.
  void gather_logits(int64_t n, float* logits);

 private:
  /// buf[0 .. n) summed over the ranks in rank order (see CudaShard::ordered_all_reduce).
  void all_reduce(float* buf, int64_t n);

  CudaShard s_;
  Communicator& comm_;
  cudaStream_t stream_;
  int64_t H_ = 0, V_ = 0, k_ = 0, E_ = 0, experts_first_ = 0, experts_count_ = 0, E_local_ = 0, I_local_ = 0;
  bool gather_reduce_ = false;
  cuda::DeviceBuffer<float> red_, gathered_, local_logits_, padded_logits_, all_logits_;
  cuda::MoeShape route_shape_, local_shape_;
  cuda::DeviceBuffer<uint8_t> route_mem_, local_mem_;
  cuda::MoeWorkspace route_ws_, local_ws_;
};

}  // namespace moefold
