// `moefold profile` (contract: profile_command.h).
#include "cli/profile_command.h"

#include "cli/parallel_options.h"
#include "parallel/cpu_parallel_executor.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/device_option.h"
#include "cli/kv_cache_dtype_option.h"
#include "runtime/kv_cache.h"
#include "cli/quantization_option.h"
#include "core/error.h"
#include "core/kernel_registry.h"
#include "models/load_model.h"
#include "ops/cpu/roofline.h"
#include "runtime/kernel_table.h"
#ifdef MOEFOLD_HAVE_CUDA
#include "models/cuda/cuda_executor.h"
#include "models/cuda/cuda_tp_executor.h"
#include "ops/cuda/launch_scope.h"
#include "ops/cuda/roofline.h"
#endif

namespace moefold {

std::unique_ptr<ProfileCommand> add_profile_command(CLI::App& app) {
  auto p = std::make_unique<ProfileCommand>();
  CLI::App* c = app.add_subcommand("profile", "where the time goes: the kernel table of prefill, decode or mixed workloads");
  p->app = c;
  c->add_option("--model", p->model_dir, "model directory (config.json; weights unless dummy)")->required();
  c->add_option("--load-format", p->load_format, "auto | safetensors | dummy (seeded random weights)");
  device_choices(c->add_option("--device", p->device));
  c->add_option("--seed", p->seed, "seed for dummy weights");
  add_parallel_options(c, p->parallel);
  add_quantization_options(c, p->quantization, p->fp8_lm_head);
  add_kv_cache_dtype_option(c, p->kv_cache_dtype);
  c->add_option("--workload", p->workloads,
                "prefill:N | decode:BxC | mixed:BxPxD (repeatable; run in order on one model load)")
      ->required();
  c->add_option("--steps", p->options.steps, "timed decode steps of decode workloads")->capture_default_str();
  c->add_option("--warmup", p->options.warmup, "untimed prefills / decode steps before timing")->capture_default_str();
  c->add_option("--max-batched-tokens", p->options.max_batched_tokens,
                "token rows per step (decode context prefill, mixed budget)")
      ->capture_default_str();
  c->add_option("--block-size", p->block_size, "tokens per KV page")->capture_default_str();
  c->add_option("--roofline-gemm-size", p->gemm_size, "n of the roofline's n^3 GEMM (default 8192 GPU, 1024 CPU)")
      ->check(CLI::Range(64, 32768));
  c->add_option("--json", p->json_out, "also write every table as JSON to this file");
  return p;
}

namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string describe(const Workload& w, const ProfileOptions& o) {
  switch (w.kind) {
    case Workload::Kind::Prefill:
      return fmt::format("one prompt of {} tokens in one step, first token sampled; after {} warm-up run(s)", w.prompt,
                         o.warmup);
    case Workload::Kind::Decode:
      return fmt::format("{} sequences x {} context tokens; {} timed decode steps after {} warm-up step(s)", w.batch,
                         w.prompt, o.steps, o.warmup);
    case Workload::Kind::Mixed:
      return fmt::format("{} requests of {} prompt + {} output tokens through the scheduler (budget {} rows/step)",
                         w.batch, w.prompt, w.output, o.max_batched_tokens);
  }
  return w.spec;
}

}  // namespace

int ProfileCommand::run() {
  MOEFOLD_CHECK(device == "cpu" || device == "cuda", "--device {}: expected cpu or cuda", device);
  std::vector<Workload> ws;
  for (const std::string& s : workloads) ws.push_back(parse_workload(s));
  const WorkloadNeeds needs = workload_needs(ws, options, block_size);
  const LoadFormat format = parse_load_format(load_format);
  if (!std::filesystem::is_directory(model_dir))
    fail("--model {}: not a model directory (expected a folder with config.json)", model_dir);
  if (!json_out.empty()) {  // fail before a long run, not after it
    std::ofstream probe(json_out, std::ios::app);
    MOEFOLD_CHECK(probe.good(), "--json {}: cannot open for writing", json_out);
  }
  const std::string date = utc_now();

  // Ceilings first (before the model takes the memory), then the launch counts start from zero, so that
  // --require-kernel sees only the model's launches.
  Roofline roof;
  std::unique_ptr<Model> cpu_model;
  std::unique_ptr<ModelRunner> runner;
  RunnerOptions ro{needs.num_blocks, block_size, needs.max_seqs};
  ro.kv_cache_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  check_kv_cache_dtype(ModelConfig::from_dir(model_dir), ro.kv_cache_dtype, device);
  if (device == "cpu") {
    roof = measure_cpu_roofline(gemm_size > 0 ? gemm_size : 1024);
  } else {
#ifdef MOEFOLD_HAVE_CUDA
    MOEFOLD_CHECK(cuda_available(), "--device cuda: no usable CUDA device");
    roof = cuda::measure_roofline(gemm_size > 0 ? gemm_size : 8192);
#else
    fail("--device cuda: this binary was built without the CUDA backend");
#endif
  }
  prof::reset_launch_counts();
  std::printf("moefold profile  %s\ncommand: %s\ndevice: %s\nroofline: copy %.3f TB/s (%s); GEMM %.3f TFLOP/s (%s)\n",
              date.c_str(), command_line.c_str(), roof.device.c_str(), roof.copy_bytes_per_s / 1e12,
              roof.copy_method.c_str(), roof.gemm_flops_per_s / 1e12, roof.gemm_method.c_str());
  std::fflush(stdout);

  const auto t_load = std::chrono::steady_clock::now();
  if (device == "cpu" && parallel.tensor_parallel_size > 1) {  // the ranks' ops overlap on the timeline
    auto full = load_model(model_dir, format, seed, parse_quantization(quantization), fp8_lm_head);
    runner = std::make_unique<ModelRunner>(
        make_cpu_parallel_executor(*full, parallel, ro.num_blocks, ro.block_size, ro.max_seqs, ro.kv_cache_dtype), ro);
    prof::set_device_timer(nullptr);
  } else if (device == "cpu") {
    cpu_model = load_model(model_dir, format, seed, parse_quantization(quantization), fp8_lm_head);
    runner = std::make_unique<ModelRunner>(*cpu_model, ro);
    prof::set_device_timer(nullptr);
  } else {
#ifdef MOEFOLD_HAVE_CUDA
    CudaExecutorOptions co;
    co.num_blocks = needs.num_blocks;
    co.block_size = block_size;
    co.num_slots = needs.max_seqs;
    co.max_rows = needs.max_rows;
    co.max_blocks_per_seq = needs.max_blocks_per_seq;
    co.max_logits_rows = std::max(needs.max_seqs, 1);
    co.quantization = parse_quantization(quantization);
    co.fp8_lm_head = fp8_lm_head;
    co.kv_cache_dtype = ro.kv_cache_dtype;
    runner = std::make_unique<ModelRunner>(
        parallel.tensor_parallel_size > 1 ? make_cuda_tp_executor_from_dir(model_dir, format, seed, parallel, co)
                                          : make_cuda_executor(model_dir, format, seed, co),
        ro);
    prof::set_device_timer(cuda::cuda_event_timer());
#endif
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const ModelConfig& cfg = runner->config();
  std::printf("model: %s (%s, %s weights), loaded in %.1f s; executor sized for %d rows/step, %d sequences, %d KV "
              "pages of %d tokens (%s)\n",
              model_dir.c_str(), family_name(cfg.family).c_str(), format == LoadFormat::Dummy ? "dummy" : "checkpoint",
              load_s, needs.max_rows, needs.max_seqs, needs.num_blocks, block_size,
              std::string(kv_elem_name(kv_elem_for(ro.kv_cache_dtype, device != "cpu"))).c_str());

  nlohmann::json out = {{"command", command_line},
                        {"date", date},
                        {"device", device},
                        {"device_name", roof.device},
                        {"model", model_dir},
                        {"load_format", format == LoadFormat::Dummy ? "dummy" : "safetensors"},
                        {"roofline",
                         {{"copy_bytes_per_s", roof.copy_bytes_per_s},
                          {"gemm_flops_per_s", roof.gemm_flops_per_s},
                          {"copy_method", roof.copy_method},
                          {"gemm_method", roof.gemm_method}}},
                        {"options",
                         {{"warmup", options.warmup},
                          {"steps", options.steps},
                          {"max_batched_tokens", options.max_batched_tokens},
                          {"block_size", block_size}}},
                        {"workloads", nlohmann::json::array()}};
  const std::string idle_label = device == "cpu" ? "idle between ops (host)" : "GPU idle between kernels";
  for (const Workload& w : ws) {
    const WorkloadResult r = run_workload(*runner, w, options);
    const double wall = r.profile.wall_s;
    std::printf("\n== workload %s: %s ==\n", w.spec.c_str(), describe(w, options).c_str());
    std::printf("profiled wall %.3f ms over %d step(s), %.1f tokens/s; timer %s", wall * 1e3, r.steps,
                wall > 0 ? double(r.tokens) / wall : 0.0, r.profile.timer.c_str());
    if (r.profile.excluded_s > 0)
      std::printf(" (%.3f ms of the profiler's own flushes excluded)", r.profile.excluded_s * 1e3);
    if (r.unprofiled_wall_s > 0)
      std::printf("; same steps unprofiled %.3f ms (instrumentation %+.1f%%)", r.unprofiled_wall_s * 1e3,
                  100.0 * (wall / r.unprofiled_wall_s - 1.0));
    std::printf("\n\n%s", format_kernel_table(r.profile, roof, idle_label).c_str());
    std::fflush(stdout);
    nlohmann::json j = kernel_table_json(r.profile, roof);
    j["workload"] = w.spec;
    j["description"] = describe(w, options);
    j["tokens"] = r.tokens;
    j["steps"] = r.steps;
    j["tokens_per_s"] = wall > 0 ? double(r.tokens) / wall : 0.0;
    j["unprofiled_wall_s"] = r.unprofiled_wall_s > 0 ? nlohmann::json(r.unprofiled_wall_s) : nlohmann::json(nullptr);
    out["workloads"].push_back(std::move(j));
  }
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    MOEFOLD_CHECK(f.good(), "--json {}: cannot open for writing", json_out);
    f << out.dump(2) << "\n";
  }
  prof::set_device_timer(nullptr);
  return 0;
}

}  // namespace moefold
