// The `moefold bench serve` subcommand: drives any OpenAI-compatible server (moefold's or another
// engine's) at a request rate or a fixed concurrency with random-token or file prompts, and
// reports throughput and TTFT / TPOT / ITL / E2EL percentiles like `vllm bench serve`; with
// `--ab URL_B` it runs the same requests against A, B, B, A and reports the ratios B / A.
// The work is done by src/bench; this file holds the options and the order of the runs.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

namespace moefold {

/// The serve benchmark and the options it fills (names and defaults of `vllm bench serve` where
/// it has them).
struct BenchServeCommand {
  CLI::App* app = nullptr;
  std::string base_url, host = "127.0.0.1", endpoint = "/v1/completions", model;
  int port = 8000;
  std::string ab_url, ab_model;
  int64_t num_prompts = 1000;
  double request_rate = std::numeric_limits<double>::infinity(), burstiness = 1.0;
  int64_t max_concurrency = 0;  ///< 0: no limit
  std::string dataset_name = "random", dataset_path, dataset_field = "prompt";
  int64_t random_input_len = 1024, random_output_len = 128;
  double random_range_ratio = 0.0;
  int64_t prefix_len = 256, suffix_len = 256, num_prefixes = 10;  ///< --dataset-name prefix_repetition
  /// --dataset-name multi_turn (--num-prompts conversations of mt_turns turns each)
  int64_t mt_turns = 5, mt_shared_prefix_len = 512, mt_prefix_len = 0, mt_user_len = 128;
  std::string random_prompt_format = "text", tokenizer;
  bool ignore_eos = false, disable_tqdm = false;
  double temperature = 0.0, request_timeout = 3600;
  std::string extra_body;
  uint64_t seed = 0;
  std::string percentile_metrics = "ttft,tpot,itl,e2el", metric_percentiles = "50,90,99";
  std::string json_out;

  /// Runs the benchmark (one run, or four with --ab), prints the reports on stdout and writes the
  /// JSON. Returns 0, or 1 when a run completed no request. Throws moefold::Error for bad options,
  /// an unreachable server or an unwritable --json file.
  int run();
};

/// Adds `serve` to `bench`. The returned object must live until parsing and run() are done.
std::unique_ptr<BenchServeCommand> add_bench_serve_command(CLI::App& bench);

}  // namespace moefold
