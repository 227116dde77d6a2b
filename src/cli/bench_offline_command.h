// The `moefold bench` subcommand: prefill and decode speed of a model on the GPU, with the hardware
// ceilings (device copy bandwidth, bf16 GEMM rate) measured in the same run, and each result as a
// fraction of its roofline.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

namespace moefold {

struct BenchCommand {
  CLI::App* app = nullptr;
  std::string model_dir, load_format = "dummy", json_out;
  std::vector<int> prefill = {4096, 32768};
  std::vector<int> decode_batch = {1, 8, 64};
  int decode_context = 512, decode_steps = 32, repeats = 3;
  uint64_t seed = 0;
  /// Runs the benchmark and prints a table; returns the exit code. Throws moefold::Error.
  int run();
};

std::unique_ptr<BenchCommand> add_bench_command(CLI::App& app);

}  // namespace moefold
