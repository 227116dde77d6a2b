// The `moefold profile` subcommand: runs workloads (runtime/profile_workload.h) on a model and prints,
// per workload, the kernel table (runtime/kernel_table.h) with the device's ceilings measured at the
// start of the same run. Several --workload flags share one model load.
#pragma once
#include "parallel/shard_plan.h"
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "runtime/profile_workload.h"

namespace moefold {

struct ProfileCommand {
  CLI::App* app = nullptr;
  std::string model_dir, load_format = "auto", device = "cpu", json_out;
  std::vector<std::string> workloads;
  ProfileOptions options;
  uint64_t seed = 0;         ///< dummy-weight seed
  std::string quantization;  ///< --quantization (models/load_model.h)
  bool fp8_lm_head = false;  ///< --fp8-lm-head
  std::string kv_cache_dtype = "auto";  ///< --kv-cache-dtype (runtime/kv_cache.h)
  int32_t block_size = 16;   ///< tokens per KV page
  int gemm_size = 0;         ///< roofline GEMM size (0: 8192 on the GPU, 1024 on the CPU)
  std::string command_line;  ///< the invocation, printed in the header (set by main)
  ParallelConfig parallel;   ///< -tp / --enable-expert-parallel (cpu threads or cuda ranks)

  /// Loads the model, measures the roofline and profiles each workload in order; prints the tables
  /// (and writes JSON with --json). Returns the exit code. Throws moefold::Error.
  int run();
};

/// Adds `profile` to `app`. The returned object must live until parsing and run() are done.
std::unique_ptr<ProfileCommand> add_profile_command(CLI::App& app);

}  // namespace moefold
