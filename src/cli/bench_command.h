// The `moefold bench` command group: `bench offline` (GPU prefill/decode at fixed shapes in one
// process, against measured rooflines) and `bench serve` (an OpenAI-compatible server under load,
// in the manner of `vllm bench serve`). `moefold bench` alone lists them.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>

#include "cli/bench_offline_command.h"
#include "cli/bench_serve_command.h"

namespace moefold {

struct BenchCommand {
  CLI::App* app = nullptr;
  std::unique_ptr<BenchOfflineCommand> offline;
  std::unique_ptr<BenchServeCommand> serve;

  /// Runs the chosen subcommand, or prints the help that lists them (exit code 0) when none was
  /// given. Returns the exit code. Throws moefold::Error.
  int run();
};

/// Adds `bench` with its subcommands to `app`. The returned object must live until parsing and
/// run() are done.
std::unique_ptr<BenchCommand> add_bench_command(CLI::App& app);

}  // namespace moefold
