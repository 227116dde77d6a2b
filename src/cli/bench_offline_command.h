// The `moefold bench offline` subcommand: prefill and decode speed of a model on the GPU in one
// process (no server), with the hardware ceilings (device copy bandwidth, bf16 GEMM rate) measured
// in the same run, and each result as a fraction of its roofline.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/shard_plan.h"

namespace moefold {

/// The offline benchmark and the options it fills.
struct BenchOfflineCommand {
  CLI::App* app = nullptr;
  std::string model_dir, load_format = "dummy", json_out;
  std::vector<int> prefill = {4096, 32768};
  std::vector<int> decode_batch = {1, 8, 64};
  int decode_context = 512, decode_steps = 32, repeats = 3;
  uint64_t seed = 0;
  std::string quantization;  ///< --quantization (models/load_model.h)
  bool fp8_lm_head = false;  ///< --fp8-lm-head
  std::string kv_cache_dtype = "auto";  ///< --kv-cache-dtype (runtime/kv_cache.h)
  bool enforce_eager = false;
  bool batch_invariant = true;
  bool timeline = false;  ///< --timeline: trace the timed decode steps' kernels (CUPTI) and print exposed time
  int timeline_rows = 30;  ///< --timeline-rows
  std::string timeline_csv;  ///< --timeline-csv: every kernel of the first traced steps, in order (CSV)
  bool timeline_host_calls = false;  ///< --timeline-host-calls: also the host's CUDA runtime calls
  std::vector<int32_t> cuda_graph_sizes;  ///< empty: the executor's default buckets
  ParallelConfig parallel;  ///< -tp / --enable-expert-parallel / --expert-parallel-size (cli/tp_cuda.h)
  /// Runs the benchmark and prints a table; returns the exit code. Throws moefold::Error (also
  /// when the binary has no CUDA backend).
  int run();
};

/// Adds `offline` to `bench`. The returned object must live until parsing and run() are done.
std::unique_ptr<BenchOfflineCommand> add_bench_offline_command(CLI::App& bench);

}  // namespace moefold
