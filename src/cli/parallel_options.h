// The tensor / expert parallel options of the model commands, with vLLM's names:
// --tensor-parallel-size (-tp), --enable-expert-parallel, --expert-parallel-size
// (parallel/shard_plan.h). CLI11 takes one-character short names only, so `-tp N` / `-tp=N` are
// rewritten to the long name before parsing (expand_parallel_short_flags).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "parallel/shard_plan.h"

namespace moefold {

/// Adds the three options to `c`, writing into `p`.
inline void add_parallel_options(CLI::App* c, ParallelConfig& p) {
  c->add_option("--tensor-parallel-size", p.tensor_parallel_size,
                "ranks the model is split over (-tp; each with its share of the heads, intermediate columns and "
                "vocabulary; --device cpu: one thread per rank; --device cuda: one GPU per rank over NCCL, or all on "
                "GPU 0 with MOEFOLD_TP_SINGLE_DEVICE=1 for tests)")
      ->check(CLI::Range(1, 1024));
  c->add_flag("--enable-expert-parallel", p.enable_expert_parallel,
              "shard the routed experts over the tensor-parallel ranks instead of splitting each expert");
  c->add_option("--expert-parallel-size", p.expert_parallel_size,
                "with --enable-expert-parallel: ranks the experts are spread over (a divisor of "
                "--tensor-parallel-size; 0: all of them)")
      ->check(CLI::Range(0, 1024));
}

/// argv with `-tp` / `-tp=N` spelled `--tensor-parallel-size` (what add_parallel_options declares).
inline std::vector<std::string> expand_parallel_short_flags(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-tp") a = "--tensor-parallel-size";
    else if (a.rfind("-tp=", 0) == 0) a = "--tensor-parallel-size=" + a.substr(4);
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace moefold
