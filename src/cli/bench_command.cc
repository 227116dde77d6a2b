// `moefold bench` (contract: bench_command.h).
#include "cli/bench_command.h"

#include <iostream>

namespace moefold {

std::unique_ptr<BenchCommand> add_bench_command(CLI::App& app) {
  auto b = std::make_unique<BenchCommand>();
  b->app = app.add_subcommand("bench", "benchmarks: `bench offline` (GPU, fixed shapes, rooflines) and "
                                       "`bench serve` (an OpenAI-compatible server under load)");
  b->app->require_subcommand(0, 1);
  b->offline = add_bench_offline_command(*b->app);
  b->serve = add_bench_serve_command(*b->app);
  return b;
}

int BenchCommand::run() {
  if (*offline->app) return offline->run();
  if (*serve->app) return serve->run();
  std::cout << app->help("moefold");
  return 0;
}

}  // namespace moefold
