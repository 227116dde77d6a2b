// The CUDA executor of a tensor / expert parallel group: one CudaExecutor per rank over its shard
// (parallel/shard_plan.h, parallel/shard_weights.h; models/cuda/cuda_tp_rank.h runs the collectives),
// one host thread per rank (rank 0 on the caller's), stepping together on every ForwardBatch; what the
// runner, the scheduler and the CLI see is one Executor, as with one GPU. Rank 0 returns the logits and
// samples; the others run the same launches and collectives.
//
// Communicators (parallel/tp_backend.h chooses): NCCL, rank r on devices[r] (one thread per GPU, as
// vLLM and SGLang; CUDA graphs capture the collectives), or the single-device test communicator, every
// rank on one GPU (eager: its cross-stream events cannot be captured).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/cuda/cuda_executor.h"
#include "models/model.h"
#include "parallel/communicator.h"
#include "parallel/shard_plan.h"

namespace moefold {

/// The communicators of one group, rank order, each on its device; `owner` keeps them (and whatever
/// they need) alive, `abort` (may be empty) releases ranks blocked in a collective after a rank failed.
struct CudaTpGroup {
  std::vector<Communicator*> comms;
  std::vector<int> devices;
  std::shared_ptr<void> owner;
  std::function<void(const std::string&)> abort;
  std::function<void()> reset;
};

/// The single-device test group: `ranks` communicators on CUDA device `device`
/// (parallel/device_communicator.h). Throws Error for ranks outside [1, 16] or when CUDA fails.
CudaTpGroup single_device_tp_group(int ranks, int device);

/// Shards `model` (the whole model with host copies, as load_model returns it; it may be freed once this
/// returns) over p.tensor_parallel_size ranks and returns their executor; `opt` applies to every rank
/// (opt.device is ignored: rank r runs on group.devices[r]; the single-device group runs eagerly).
/// Expert columns that are not a multiple of 64 (the MoE kernels' tile) are padded with zero columns
/// (exact). Throws Error (parallel/shard_plan.h) when the sizes do not divide, when the group's size is
/// not p.tensor_parallel_size, for FP8 weights, or as make_cuda_rank_executor.
std::unique_ptr<Executor> make_cuda_tp_executor(const Model& model, const ParallelConfig& p, CudaTpGroup group,
                                                const CudaExecutorOptions& opt);

/// Makes the NCCL group of `devices` (rank r on devices[r]). The moefold binary registers one when it
/// links NCCL (cli/tp_cuda.h); the libraries do not depend on libnccl.
using NcclGroupFactory = CudaTpGroup (*)(const std::vector<int>& devices);
/// Registers the NCCL group factory (nullptr: none).
void set_nccl_group_factory(NcclGroupFactory f);

/// -tp N --device cuda for the model commands: the model in `dir` loaded whole on the host (host copies
/// for shard_weights, freed when this returns) and sharded over p.tensor_parallel_size (>= 2) ranks with
/// the communicator parallel/tp_backend.h picks from the visible GPUs and MOEFOLD_TP_SINGLE_DEVICE:
/// NCCL over GPUs 0..N-1 (through the registered factory), or every rank on GPU 0 over the single-device
/// test communicator, said on stderr. Throws Error when there are fewer GPUs than ranks (and the
/// variable is not 1), when NCCL is needed and no factory is registered, for FP8 options or weights, or
/// when the sizes do not divide (parallel/shard_plan.h).
std::unique_ptr<Executor> make_cuda_tp_executor_from_dir(const std::string& dir, LoadFormat format, uint64_t seed,
                                                         const ParallelConfig& p, const CudaExecutorOptions& opt);

/// Per rank: its device and backend, e.g. "cuda:0 device" (empty when `e` is not a CUDA TP executor).
std::vector<std::string> cuda_tp_ranks(const Executor& e);

}  // namespace moefold
