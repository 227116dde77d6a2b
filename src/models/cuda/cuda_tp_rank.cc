#include "models/cuda/cuda_tp_rank.h"

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/tp_ops.h"

namespace moefold {

using bf16 = __nv_bfloat16;
using cuda::DeviceBuffer;

namespace {
// The communicator's calls in the kernel table, category communication (the single-device backend's
// copies, NCCL's kernels): bytes this rank sends and receives.
const prof::Kernel kAllReduce{"comm::all_reduce", prof::Category::Communication};
const prof::Kernel kAllGather{"comm::all_gather", prof::Category::Communication};
}  // namespace

CudaTpRank::CudaTpRank(const CudaShard& s, const ModelConfig& c, int64_t max_rows, int64_t max_logits_rows,
                       cudaStream_t stream)
    : s_(s), comm_(*s.comm), stream_(stream) {
  MOEFOLD_CHECK(s.comm && s.comm->backend() != "cpu",
                "CUDA tensor parallel rank: needs a device communicator (nccl or device), got {}",
                s.comm ? s.comm->backend() : std::string("none"));
  MOEFOLD_CHECK(comm_.world_size() == s.shard.world && comm_.rank() == s.shard.rank,
                "CUDA tensor parallel rank: shard {} of {} given communicator rank {} of {}", s.shard.rank,
                s.shard.world, comm_.rank(), comm_.world_size());
  MOEFOLD_CHECK(s.shard.world <= cuda::kTpMaxRanks, "CUDA tensor parallel: at most {} ranks, got {}", cuda::kTpMaxRanks,
                s.shard.world);
  comm_.set_stream(stream);
  H_ = c.hidden_size;
  V_ = c.vocab_size;
  const int N = s.shard.world;
  red_ = DeviceBuffer<float>(size_t(max_rows * H_));
  red_.fill_bytes(0);
  gather_reduce_ = s.ordered_all_reduce && comm_.backend() == "nccl";
  if (gather_reduce_) gathered_ = DeviceBuffer<float>(size_t(N) * size_t(max_rows * H_));
  const int64_t vn = s.shard.vocab.count, Vs = s.shard.vocab_shard;
  local_logits_ = DeviceBuffer<float>(size_t(std::max<int64_t>(1, max_logits_rows * vn)));
  if (vn != Vs) padded_logits_ = DeviceBuffer<float>(size_t(max_logits_rows * Vs));
  all_logits_ = DeviceBuffer<float>(size_t(N) * size_t(max_logits_rows * Vs));
  k_ = c.num_experts_per_tok;
  E_ = c.num_experts;
  if (E_ > 0) {
    experts_first_ = s.shard.experts.begin;
    experts_count_ = s.shard.experts.count;
    I_local_ = c.moe_intermediate_size;
    MOEFOLD_CHECK(I_local_ % 64 == 0, "CUDA tensor parallel: the rank's expert columns ({}) must be a multiple of 64",
                  I_local_);
    // The plan's expert count: the rank's experts, at least k and even (the kernels' preconditions);
    // the ids past the rank's own never occur, so the extra experts are never read.
    E_local_ = std::max<int64_t>(experts_count_, k_);
    E_local_ += E_local_ % 2;
    route_shape_ = {int(max_rows), int(E_), int(k_), int(H_), int(I_local_)};
    local_shape_ = {int(max_rows), int(E_local_), int(k_), int(H_), int(I_local_)};
    size_t b = cuda::moe_workspace_bytes(route_shape_);
    route_mem_ = DeviceBuffer<uint8_t>(b);
    route_ws_ = cuda::moe_workspace_bind(route_mem_.data(), b, route_shape_);
    b = cuda::moe_workspace_bytes(local_shape_);
    local_mem_ = DeviceBuffer<uint8_t>(b);
    local_ws_ = cuda::moe_workspace_bind(local_mem_.data(), b, local_shape_);
  }
}

void CudaTpRank::all_reduce(float* buf, int64_t n) {
  const int N = s_.shard.world;
  if (!gather_reduce_) {
    cuda::LaunchScope launch(kAllReduce, stream_, prof::Work{8.0 * double(n) * (N - 1) / N, 0});
    return comm_.all_reduce_sum(buf, n);
  }
  {
    cuda::LaunchScope launch(kAllGather, stream_, prof::Work{4.0 * double(n) * N, 0});
    comm_.all_gather(buf, gathered_.data(), n);
  }
  cuda::RankInputs in;
  for (int r = 0; r < N; ++r) in.p[r] = gathered_.data() + int64_t(r) * n;
  cuda::rank_order_sum(in, N, buf, n, stream_);
}

void CudaTpRank::embed(const bf16* embed_local, const int32_t* ids, int64_t T, const int32_t* num_rows, int32_t* oob,
                       bf16* h) {
  cuda::tp_embedding_f32(embed_local, s_.shard.vocab.begin, s_.shard.vocab.count, V_, H_, ids, red_.data(), T, num_rows,
                         oob, stream_);
  all_reduce(red_.data(), T * H_);
  cuda::f32_rows_to_bf16(red_.data(), h, T, H_, num_rows, stream_);
}

void CudaTpRank::reduce_into_residual(const bf16* y, bf16* h, int64_t T, const int32_t* num_rows) {
  cuda::bf16_rows_to_f32(y, red_.data(), T, H_, num_rows, stream_);
  all_reduce(red_.data(), T * H_);
  cuda::residual_add_f32(h, red_.data(), T, H_, num_rows, stream_);
}

void CudaTpRank::moe(const bf16* x, const bf16* router_w, const bf16* gate_up, const bf16* down, const bf16* shared_out,
                     const bf16* shared_gate_w, bf16* h, int64_t T, const int32_t* num_rows, bool renormalize,
                     bool batch_invariant, const int32_t* replay) {
  MOEFOLD_CHECK(E_ > 0, "CUDA tensor parallel: MoE block in a model without experts");
  cuda::MoeShape rs = route_shape_, ls = local_shape_;
  rs.capacity = ls.capacity = int(T);
  rs.batch_invariant = ls.batch_invariant = batch_invariant;
  cuda::moe_router_logits(x, router_w, num_rows, rs, route_ws_.logits, stream_);
  cuda::moe_router_topk(route_ws_.logits, num_rows, rs, renormalize, route_ws_.ids, route_ws_.weights, stream_, replay);
  cuda::moe_local_ids(route_ws_.ids, experts_first_, experts_count_, local_ws_.ids, T, k_, num_rows, stream_);
  cuda::moe_plan(local_ws_.ids, num_rows, ls, local_ws_, stream_);
  cuda::moe_expert_gate_up(x, gate_up, ls, local_ws_, stream_);
  cuda::moe_expert_down(down, ls, local_ws_, stream_);
  cuda::moe_combine_local_f32(route_ws_.weights, local_ws_.ids, local_ws_.y, shared_out, shared_gate_w, x, T, k_, H_,
                              num_rows, red_.data(), stream_);
  all_reduce(red_.data(), T * H_);
  cuda::residual_add_f32(h, red_.data(), T, H_, num_rows, stream_);
}

void CudaTpRank::gather_logits(int64_t n, float* logits) {
  const int N = s_.shard.world;
  const int64_t vn = s_.shard.vocab.count, Vs = s_.shard.vocab_shard;
  const float* block = local_logits_.data();
  if (vn != Vs) {  // the last rank's shard is short: pad to the all-gather unit
    cuda::pad_columns(local_logits_.data(), n, vn, Vs, padded_logits_.data(), stream_);
    block = padded_logits_.data();
  }
  {
    cuda::LaunchScope launch(kAllGather, stream_, prof::Work{4.0 * double(n * Vs) * N, 0});
    comm_.all_gather(block, all_logits_.data(), n * Vs);
  }
  cuda::gather_vocab_shards(all_logits_.data(), N, n, Vs, V_, logits, stream_);
}

}  // namespace moefold
