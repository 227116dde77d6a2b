// The CUDA executor: the decoder forward of every family on one GPU in bf16 (fp32 accumulation and
// DeltaNet state), over device-resident weights, paged KV cache and state pool. Computes the same
// function as the CPU reference Model::forward (src/models/model.cc), layer for layer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/load_model.h"
#include "runtime/executor.h"
#include "runtime/kv_cache.h"

namespace moefold {

struct CudaExecutorOptions {
  int device = 0;
  int32_t num_blocks = 256;   ///< KV pages; <= 0: as many as fit in gpu_memory_utilization of the GPU
  double gpu_memory_utilization = 0.9;  ///< share of total GPU memory the process may use (auto sizing)
  int32_t block_size = 16;    ///< tokens per page
  int32_t num_slots = 8;      ///< DeltaNet state slots = most sequences per step
  int32_t num_snapshot_slots = 0;  ///< more state slots (after those) for prefix-cache snapshots
  int32_t max_rows = 8192;    ///< most token rows per step (activation buffers are sized for it)
  int32_t max_blocks_per_seq = 0;  ///< 0 = num_blocks
  int32_t max_logits_rows = 256;   ///< logits computed per lm_head pass (larger requests loop)
  bool dummy_on_device = true;     ///< --load-format dummy: generate large tensors on the GPU (same values)
  /// Decode steps of up to these many sequences run as CUDA graphs captured at load (vLLM's
  /// --cuda-graph-sizes); a step runs the smallest bucket that holds it, with its live rows and
  /// sequences read from device memory. Sizes above num_slots, max_rows or max_logits_rows are dropped.
  std::vector<int32_t> cuda_graph_sizes = default_cuda_graph_sizes();
  bool enforce_eager = false;  ///< no CUDA graphs (vLLM's --enforce-eager)
  /// Every kernel computes a row with a reduction order independent of the other rows and of the row
  /// count, so a sequence's logits are bitwise the same alone or in any batch (decode GEMM for dense
  /// projections up to 256 rows, MoE expert tiles); false takes the fastest kernels per step size
  /// (GEMV up to 16 rows, the MoE GEMV), whose bits depend on the step's row count.
  bool batch_invariant = true;
  /// A mixed step (some sequences prefilling, others decoding one token after cached context) runs
  /// its decode sequences through the decode kernels (paged attention decode, the recurrent DeltaNet
  /// step, the conv1d decode) and its prefill sequences through the prefill ones, every row-wise op
  /// (GEMMs, norms, MoE) over all rows: a decoding sequence's bits then do not depend on whether
  /// another request prefills beside it. false runs every row of a mixed step through the prefill
  /// kernels (the former behaviour; kept for A/B tests).
  bool split_mixed_steps = true;
  bool log_graphs = false;     ///< print the graph captures (time, memory) to stderr
  /// --quantization fp8: weights quantised at load into block-scaled FP8 (an FP8 checkpoint is FP8
  /// without it); FP8 weights stay FP8 on the GPU (docs/fp8.md).
  Quantization quantization = Quantization::None;
  /// --fp8-lm-head: the lm_head quantised at load into 128 x 128 block-scaled FP8 and run by the FP8
  /// decode GEMM (fp8_gemv_f32out) up to 256 logits rows (larger passes: a bf16 copy and the bf16 GEMM).
  bool fp8_lm_head = false;
  /// --kv-cache-dtype (runtime/kv_cache.h): auto / bfloat16 = bf16 pages; fp8 = e4m3 pages with the
  /// checkpoint's k_scale / v_scale per (layer, KV head), else 1 (kv_cache_write_fp8, attention_*_fp8).
  /// num_blocks <= 0 then sizes twice the pages from the same memory.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;
  static std::vector<int32_t> default_cuda_graph_sizes() { return {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256}; }
};

/// Loads the model in `dir` straight onto the GPU (each layer uploaded as bf16 as soon as it is read;
/// the host copy is dropped) and returns its executor. Throws Error if there is no usable GPU, the
/// model does not fit, or a kernel does not support the model's shapes.
std::unique_ptr<Executor> make_cuda_executor(const std::string& dir, LoadFormat format, uint64_t seed,
                                             const CudaExecutorOptions& opt);

struct CudaShard;  // models/cuda/cuda_tp_rank.h

/// One rank of a CUDA tensor / expert parallel group (models/cuda/cuda_tp_executor.h builds the group):
/// the executor of `local` (the rank's config: parallel/shard_plan.h local_config, expert columns a
/// multiple of 64) over `weights` (the rank's shard with host copies, parallel/shard_weights.h; uploaded
/// as bf16 here), running the collectives of `shard` on its stream (models/cuda/cuda_tp_rank.h). Ranks
/// other than 0 download no logits in forward() and sample nothing in forward_sample(); they run the
/// same launches and collectives. Throws Error as make_cuda_executor does, and for FP8 weights.
std::unique_ptr<Executor> make_cuda_rank_executor(const ModelConfig& local, ModelWeights weights,
                                                  const CudaShard& shard, const CudaExecutorOptions& opt);

/// True when a CUDA device is present and usable.
bool cuda_available();

}  // namespace moefold
