// `moefold bench offline` (contract: bench_offline_command.h).
#include "cli/bench_offline_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/kv_cache_dtype_option.h"
#include "cli/parallel_options.h"
#include "cli/quantization_option.h"
#include "core/error.h"
#include "core/kernel_registry.h"
#include "core/kernel_timeline.h"
#include "models/load_model.h"
#include "models/weight_loader.h"
#include "runtime/model_runner.h"
#include "runtime/profile_workload.h"
#ifdef MOEFOLD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "models/cuda/cuda_executor.h"
#include "models/cuda/cuda_tp_executor.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_buffer.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/kernel_trace.h"
#include "ops/cuda/roofline.h"
#endif

namespace moefold {

std::unique_ptr<BenchOfflineCommand> add_bench_offline_command(CLI::App& bench) {
  auto b = std::make_unique<BenchOfflineCommand>();
  b->app = bench.add_subcommand("offline", "prefill and decode speed on the GPU at fixed shapes, in one process, "
                                           "against the rooflines measured in the same run");
  b->app->add_option("--model", b->model_dir, "model directory (config.json; weights unless dummy)")->required();
  b->app->add_option("--load-format", b->load_format, "dummy (default) | safetensors");
  b->app->add_option("--prefill", b->prefill, "prompt lengths to prefill, one sequence each")->delimiter(',');
  b->app->add_option("--decode-batch", b->decode_batch, "decode batch sizes")->delimiter(',');
  b->app->add_option("--decode-context", b->decode_context, "tokens in each sequence before decoding");
  b->app->add_option("--decode-steps", b->decode_steps, "timed decode steps per batch size");
  b->app->add_option("--repeats", b->repeats, "timed prefills per length (median reported)");
  b->app->add_option("--seed", b->seed, "dummy-weight seed");
  add_quantization_options(b->app, b->quantization, b->fp8_lm_head);
  add_kv_cache_dtype_option(b->app, b->kv_cache_dtype);
  add_parallel_options(b->app, b->parallel);
  b->app->add_option("--json", b->json_out, "also write the results as JSON");
  b->app->add_flag("--enforce-eager", b->enforce_eager, "run decode steps eagerly (no CUDA graphs)");
  b->app->add_flag("--batch-invariant,!--no-batch-invariant", b->batch_invariant,
                   "kernels whose per-row results do not depend on the batch (default: on; off: the fastest per step size)");
  b->app->add_flag("--timeline", b->timeline,
                   "trace every kernel of the timed decode steps, inside CUDA graphs too (CUPTI, loaded at run "
                   "time), and print per kernel the time the step waited for it (docs/profiling.md)");
  b->app->add_option("--timeline-rows", b->timeline_rows, "kernels listed in each --timeline table (default 30)");
  b->app->add_option("--timeline-csv", b->timeline_csv,
                     "with --timeline: write every kernel of the first 2 traced steps of each batch size, in "
                     "order, with start, end, idle gap and exposed time (CSV; a 'batch' column first)");
  b->app->add_flag("--timeline-host-calls", b->timeline_host_calls,
                   "with --timeline: also trace the host's CUDA runtime calls (CUPTI's instrumentation of them "
                   "slows graph launches far more than kernels; docs/profiling.md)");
  b->app->add_option("--cuda-graph-sizes", b->cuda_graph_sizes, "decode batch sizes captured as CUDA graphs")
      ->delimiter(',')
      ->default_str("");
  return b;
}

#ifndef MOEFOLD_HAVE_CUDA
int BenchOfflineCommand::run() { fail("bench offline: this binary was built without the CUDA backend"); }
#else

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int BenchOfflineCommand::run() {
  MOEFOLD_CHECK(cuda_available(), "bench offline: no usable CUDA device (it measures the GPU backend)");
  const ModelConfig cfg = ModelConfig::from_dir(model_dir);
  const KvCacheDtype kv_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  check_kv_cache_dtype(cfg, kv_dtype, "cuda");
  const int64_t kv_elem = kv_elem_bytes(kv_elem_for(kv_dtype, true));
  const ParamCounts pc = count_params(cfg);
  cudaDeviceProp prop{};
  MOEFOLD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, model: %s (%s), %.2f B params, %.2f B active/token\n", prop.name, model_dir.c_str(),
              family_name(cfg.family).c_str(), double(pc.total) / 1e9, double(pc.active_per_token) / 1e9);
  const Roofline roof = cuda::measure_roofline(8192);
  prof::reset_launch_counts();  // the ceilings' own launches do not satisfy --require-kernel
  const double bw = roof.copy_bytes_per_s, peak = roof.gemm_flops_per_s;
  std::printf("measured ceilings: copy %.2f TB/s (read + write), bf16 GEMM 8192^3 %.0f TFLOP/s\n", bw / 1e12,
              peak / 1e12);

  const int max_prefill = prefill.empty() ? 0 : *std::max_element(prefill.begin(), prefill.end());
  const int max_batch = decode_batch.empty() ? 1 : *std::max_element(decode_batch.begin(), decode_batch.end());
  const int bs = 16;
  const int decode_tokens = decode_context + decode_steps + 2;
  const int blocks = std::max((max_prefill + bs - 1) / bs + 1, max_batch * ((decode_tokens + bs - 1) / bs + 1)) + 8;
  CudaExecutorOptions o;
  o.num_blocks = blocks;
  o.block_size = bs;
  o.num_slots = max_batch;
  o.max_rows = std::max({max_prefill, max_batch * decode_context, max_batch, 1});
  o.max_blocks_per_seq = std::max((max_prefill + bs - 1) / bs + 1, (decode_tokens + bs - 1) / bs + 1);
  o.max_logits_rows = max_batch;
  o.enforce_eager = enforce_eager;
  o.batch_invariant = batch_invariant;
  o.quantization = parse_quantization(quantization);
  o.fp8_lm_head = fp8_lm_head;
  o.kv_cache_dtype = kv_dtype;
  if (!cuda_graph_sizes.empty()) o.cuda_graph_sizes = cuda_graph_sizes;
  o.log_graphs = true;
  // The trace starts before the executor captures its CUDA graphs (kernel_trace.h says why).
  std::unique_ptr<cuda::KernelTrace> trace;
  if (timeline) {
    MOEFOLD_CHECK(!decode_batch.empty(), "bench offline: --timeline traces decode steps; give --decode-batch");
    MOEFOLD_CHECK(!timeline_host_calls || timeline, "bench offline: --timeline-host-calls needs --timeline");
  }
  MOEFOLD_CHECK(timeline_csv.empty() || timeline, "bench offline: --timeline-csv needs --timeline");
  if (timeline) {
    trace = cuda::KernelTrace::start(timeline_host_calls);
    std::printf("kernel trace: CUPTI from %s\n", trace->library().c_str());
  }
  auto t_load = Clock::now();
  validate(parallel);
  ModelRunner runner(parallel.tensor_parallel_size > 1
                         ? make_cuda_tp_executor_from_dir(model_dir, parse_load_format(load_format), seed, parallel, o)
                         : make_cuda_executor(model_dir, parse_load_format(load_format), seed, o),
                     RunnerOptions{blocks, bs, max_batch});
  const bool fp8 = o.quantization == Quantization::Fp8;
  std::printf("weights loaded and uploaded in %.1f s (decode: %s, %s; weights %s, lm_head %s)\n",
              seconds_since(t_load), enforce_eager ? "eager" : "CUDA graphs",
              batch_invariant ? "batch-invariant" : "not batch-invariant", fp8 ? "fp8" : "as loaded",
              fp8_lm_head ? "fp8" : "bf16");

  nlohmann::json results = {{"device", prop.name},
                            {"model", model_dir},
                            {"copy_bandwidth_bytes_per_s", bw},
                            {"cuda_graphs", !enforce_eager},
                            {"quantization", fp8 ? "fp8" : "none"},
                            {"fp8_lm_head", fp8_lm_head},
                            {"kv_cache_dtype", kv_elem_name(kv_elem_for(kv_dtype, true))},
                            {"batch_invariant", batch_invariant},
                            {"bf16_gemm_flops", peak},
                            {"prefill", nlohmann::json::array()},
                            {"decode", nlohmann::json::array()}};
  const double D = double(cfg.head_dim), Hq = double(cfg.num_heads);
  const double attn_layers = double(cfg.num_layers_of(LayerType::FullAttention));
  std::printf("\n%-28s %12s %12s %12s %10s\n", "case", "median", "spread", "tokens/s", "roofline");
  // Every timed step samples its tokens greedily inside the executor, as serving does (on the GPU with
  // --device cuda); the decode workload still feeds fixed random tokens, so the sampled ones are unused.
  SamplingParams greedy_params;
  greedy_params.temperature = 0.0f;
  greedy_params.seed = 0;
  const Sampler greedy(greedy_params);
  std::vector<SampleResult> sampled;
  for (int T : prefill) {
    if (T <= 0) continue;  // --prefill 0: decode only
    std::vector<double> times;
    for (int r = 0; r < repeats + 1; ++r) {
      int32_t s = runner.add_sequence(random_tokens(T, cfg.vocab_size, uint32_t(r)));
      auto t0 = Clock::now();
      const RowSampling row{&greedy, {}, {}};
      runner.step_sample({{s, T, false}}, {&row, 1}, {}, sampled);
      if (r > 0) times.push_back(seconds_since(t0));  // first run warms up
      runner.release(s);
    }
    // FLOPs: 2 x active params per token, plus causal attention (QK^T and PV, half the square).
    const double flops = 2.0 * double(pc.active_per_token) * T + attn_layers * 2.0 * 2.0 * Hq * D * double(T) * T / 2;
    const double med = median(times);
    const double spread = *std::max_element(times.begin(), times.end()) - *std::min_element(times.begin(), times.end());
    std::printf("%-28s %10.1f ms %10.1f ms %12.0f %9.1f%%\n", ("prefill " + std::to_string(T)).c_str(), med * 1e3,
                spread * 1e3, T / med, 100.0 * flops / med / peak);
    results["prefill"].push_back({{"tokens", T}, {"median_s", med}, {"spread_s", spread}, {"flops", flops},
                                  {"fraction_of_bf16_peak", flops / med / peak}});
  }
  std::string timeline_text;  // printed after the table
  std::string csv_text;       // --timeline-csv
  for (int B : decode_batch) {
    std::vector<int32_t> seqs;
    std::vector<ModelRunner::Work> work;
    for (int b = 0; b < B; ++b) {
      seqs.push_back(runner.add_sequence(random_tokens(decode_context, cfg.vocab_size, uint32_t(100 + b))));
      work.push_back({seqs.back(), decode_context, false});
    }
    runner.step_sample(work, std::vector<RowSampling>(work.size(), RowSampling{&greedy, {}, {}}), {},
                       sampled);  // prefill all contexts in one step
    std::vector<double> times;
    std::vector<prof::StepWindow> windows;
    if (trace) trace->take();  // drop the records of the contexts' prefill
    std::mt19937 rng(7);
    for (int step = 0; step < decode_steps + 2; ++step) {
      work.clear();
      for (int32_t s : seqs) {
        runner.append_token(s, int32_t(rng() % 1000));
        work.push_back({s, 1, false});
      }
      const std::vector<RowSampling> rows(work.size(), RowSampling{&greedy, {}, {}});
      const int64_t w0 = trace ? trace->now() : 0;
      auto t0 = Clock::now();
      runner.step_sample(work, rows, {}, sampled);
      if (step >= 2) times.push_back(seconds_since(t0));
      if (trace && step >= 2) windows.push_back({w0, trace->now()});
    }
    nlohmann::json timeline_json;
    if (trace) {
      const cuda::KernelTrace::Records records = trace->take();
      const prof::TimelineSummary tl = prof::summarize_timeline(records.gpu, windows, records.host);
      timeline_text += "\ndecode batch " + std::to_string(B) + ":\n" + prof::format_timeline(tl, timeline_rows);
      timeline_json = prof::timeline_to_json(tl);
      if (!timeline_csv.empty()) {
        const std::string csv = prof::timeline_csv(records.gpu, windows, 2);
        size_t line_start = 0;
        for (size_t p = csv.find('\n'); p != std::string::npos; line_start = p + 1, p = csv.find('\n', line_start)) {
          if (line_start == 0) {  // the header, once
            if (csv_text.empty()) csv_text = "batch," + csv.substr(0, p + 1);
            continue;
          }
          csv_text += std::to_string(B) + "," + csv.substr(line_start, p + 1 - line_start);
        }
      }
    }
    for (int32_t s : seqs) runner.release(s);
    // HBM floor of one step: every non-routed-expert weight once, the distinct routed experts a batch
    // of B tokens touches in expectation (E (1 - (1 - k/E)^B) per layer), KV and DeltaNet state traffic.
    const double E = double(std::max<int64_t>(cfg.num_experts, 1)), k = double(cfg.num_experts_per_tok);
    const double per_expert = cfg.num_experts ? double(pc.routed_expert) / E : 0;
    const double touched = cfg.num_experts ? E * (1 - std::pow(1 - k / E, B)) : 0;
    // Bytes per weight: 2 (bf16); with -q fp8 the routed experts and the dense projections take 1 (their
    // fp32 per-row block scales add 4 / 128), the rest stays bf16 (norms, router, embedding).
    const double b_q = fp8 ? 1.0 + 4.0 / 128.0 : 2.0, b_head = fp8_lm_head ? 1.0 + 4.0 / 128.0 : 2.0;
    const double head = double(cfg.vocab_size) * double(cfg.hidden_size);
    const double dense = double(pc.total - pc.embedding - pc.routed_expert) - (cfg.tie_word_embeddings ? 0 : head);
    const double weight_bytes = b_q * (dense + touched * per_expert) + b_head * head;
    const double kv_bytes = double(B) * (decode_context + decode_steps / 2.0) * double(cfg.kv_bytes_per_token(kv_elem));
    const double state_bytes = 2.0 * double(B) * double(cfg.deltanet_state_bytes_per_seq(2));
    const double floor_s = (weight_bytes + kv_bytes + state_bytes) / bw;
    const double med = median(times);
    const double spread = *std::max_element(times.begin(), times.end()) - *std::min_element(times.begin(), times.end());
    std::printf("%-28s %10.2f ms %10.2f ms %12.0f %9.1f%%\n", ("decode batch " + std::to_string(B)).c_str(),
                med * 1e3, spread * 1e3, B / med, 100.0 * floor_s / med);
    results["decode"].push_back({{"batch", B}, {"context", decode_context}, {"median_step_s", med},
                                 {"spread_s", spread}, {"tokens_per_s", B / med}, {"hbm_floor_s", floor_s},
                                 {"fraction_of_hbm_roofline", floor_s / med}});
    if (trace) results["decode"].back()["timeline"] = timeline_json;
  }
  if (trace) {
    std::printf("\nKernel timelines of the timed decode steps (CUPTI records: the step times above include its "
                "instrumentation; compare them with a run without --timeline):\n%s",
                timeline_text.c_str());
  }
  if (!json_out.empty()) std::ofstream(json_out) << results.dump(2) << "\n";
  if (!timeline_csv.empty()) {
    std::ofstream f(timeline_csv);
    MOEFOLD_CHECK(f.good(), "bench offline: cannot write --timeline-csv {}", timeline_csv);
    f << csv_text;
  }
  return 0;
}

#endif

}  // namespace moefold
