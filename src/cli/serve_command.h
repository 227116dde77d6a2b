// The `moefold serve` subcommand: its options (CLI11) and the call into src/server.
#pragma once
#include <CLI/CLI.hpp>

#include "server/serve.h"

namespace moefold {

/// The serve subcommand and the options it fills.
struct ServeCommand {
  CLI::App* app = nullptr;
  server::ServeOptions options;
  std::string kv_cache_memory;  ///< as typed (bytes, or with a K/M/G suffix)
  std::string prefix_snapshot_memory;  ///< as typed

  /// Runs the server with the parsed options; returns the exit code. Throws moefold::Error.
  int run();
};

/// Adds `serve` to `app`. The returned object must live until parsing and run() are done.
std::unique_ptr<ServeCommand> add_serve_command(CLI::App& app);

}  // namespace moefold
