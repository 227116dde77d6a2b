// moefold command line: inspect | logits | generate | chat | serve | bench (offline, serve) | profile.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/kernel_registry.h"
#include "io/model_config.h"
#include "io/npy.h"
#include "io/deepseek_v4_config.h"
#include "models/deepseek_v4_executor.h"
#include "cli/kv_cache_dtype_option.h"
#include "cli/quantization_option.h"
#include "models/load_model.h"
#include "models/weight_loader.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/text_generation.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "cli/bench_command.h"
#include "cli/device_option.h"
#include "cli/generation_stats.h"
#include "cli/parallel_options.h"
#include "parallel/cpu_parallel_executor.h"
#include "cli/fp8_commands.h"
#include "cli/profile_command.h"
#include "cli/serve_command.h"
#include "cli/tp_cuda.h"
#include "cli/version.h"
#ifdef MOEFOLD_HAVE_CUDA
#include "models/cuda/cuda_executor.h"
#include "models/cuda/cuda_tp_executor.h"
#endif

using namespace moefold;
using json = nlohmann::json;

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    try {
      size_t used = 0;
      long v = std::stol(tok, &used);
      if (used != tok.size()) throw std::invalid_argument(tok);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("--prompt-ids: '{}' is not an integer (expected e.g. 1,2,3)", tok);
    }
    i = j + 1;
    if (j + 1 == s.size()) fail("--prompt-ids: trailing comma in '{}'", s);
  }
  if (ids.empty()) fail("--prompt-ids is empty");
  return ids;
}

/// --device cuda execution options of the model commands (vLLM's names).
struct GpuOpts {
  bool enforce_eager = false;
  bool batch_invariant = true;
};
std::string g_quantization;  ///< --quantization of the model commands
bool g_fp8_lm_head = false;  ///< --fp8-lm-head of the model commands
std::string g_kv_cache_dtype = "auto";  ///< --kv-cache-dtype of the model commands
GpuOpts g_gpu;
ParallelConfig g_parallel;  ///< --tensor-parallel-size, --enable-expert-parallel, --expert-parallel-size

/// A runner for one sequence of up to `tokens` tokens on `device` ("cpu" or "cuda").
std::unique_ptr<ModelRunner> make_runner(const std::string& dir, LoadFormat format, uint64_t seed,
                                         const std::string& device, int32_t tokens,
                                         std::unique_ptr<Model>& cpu_model) {
  const int32_t bs = 16;
  RunnerOptions opt{(tokens + bs - 1) / bs + 1, bs, 1};
  opt.kv_cache_dtype = parse_kv_cache_dtype(g_kv_cache_dtype);
  check_kv_cache_dtype(ModelConfig::from_dir(dir), opt.kv_cache_dtype, device);
  validate(g_parallel);
  const bool tp = g_parallel.tensor_parallel_size > 1;
  if (device == "cpu" && ModelConfig::from_dir(dir).family == Family::DeepseekV4) {
    MOEFOLD_CHECK(!tp, "--tensor-parallel-size {}: DeepSeek-V4 runs on its own forward, which has no sharding yet",
                  g_parallel.tensor_parallel_size);
    return std::make_unique<ModelRunner>(
        make_deepseek_v4_executor(dir, format == LoadFormat::Dummy, seed, opt.num_blocks, opt.max_seqs), opt);
  }
  if (device == "cpu" && tp) {  // the whole model is loaded, sharded over the ranks, then freed
    auto full = load_model(dir, format, seed, parse_quantization(g_quantization), g_fp8_lm_head);
    return std::make_unique<ModelRunner>(
        make_cpu_parallel_executor(*full, g_parallel, opt.num_blocks, opt.block_size, opt.max_seqs, opt.kv_cache_dtype),
        opt);
  }
  if (device == "cpu") {
    cpu_model = load_model(dir, format, seed, parse_quantization(g_quantization), g_fp8_lm_head);
    return std::make_unique<ModelRunner>(*cpu_model, opt);
  }
  if (device == "cuda") {
#ifdef MOEFOLD_HAVE_CUDA
    CudaExecutorOptions co;
    co.num_blocks = opt.num_blocks;
    co.block_size = bs;
    co.num_slots = 1;
    co.max_rows = std::max(tokens, 1);
    co.max_blocks_per_seq = opt.num_blocks;
    co.enforce_eager = g_gpu.enforce_eager;
    co.batch_invariant = g_gpu.batch_invariant;
    co.quantization = parse_quantization(g_quantization);
    co.fp8_lm_head = g_fp8_lm_head;
    co.kv_cache_dtype = opt.kv_cache_dtype;
    if (tp) return std::make_unique<ModelRunner>(make_cuda_tp_executor_from_dir(dir, format, seed, g_parallel, co), opt);
    return std::make_unique<ModelRunner>(make_cuda_executor(dir, format, seed, co), opt);
#else
    fail("--device cuda: this binary was built without the CUDA backend");
#endif
  }
  fail("--device {}: expected cpu or cuda", device);
}

/// inspect for deepseek_v4: layer kinds by compress ratio, parameters, compressed KV per token.
int inspect_deepseek_v4(const ModelConfig& c, const ParamCounts& p, bool as_json) {
  const DeepseekV4Config& d = *c.deepseek_v4;
  int64_t sw = 0, csa = 0, hca = 0;
  for (int32_t r : d.compress_ratios) (r == 0 ? sw : r == 4 ? csa : hca) += 1;
  const double kv = d.kv_bytes_per_token_bf16();
  const int64_t window_bytes = c.num_layers * d.sliding_window * d.head_dim * 2;
  if (as_json) {
    json j = {{"family", family_name(c.family)},
              {"model_type", "deepseek_v4"},
              {"num_layers", c.num_layers},
              {"sliding_window_layers", sw},
              {"compressed_sparse_attention_layers", csa},
              {"heavily_compressed_attention_layers", hca},
              {"hash_routed_layers", d.num_hash_layers},
              {"total_params", p.total},
              {"active_params_per_token", p.active_per_token},
              {"routed_expert_params", p.routed_expert},
              {"compressed_kv_bytes_per_token_bf16", kv},
              {"window_kv_bytes_per_seq_bf16", window_bytes}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("family                   %s\n", family_name(c.family).c_str());
    std::printf("layers                   %lld (%lld sliding window, %lld CSA 4:1 + indexer, %lld HCA 128:1; first %lld hash-routed)\n",
                (long long)c.num_layers, (long long)sw, (long long)csa, (long long)hca, (long long)d.num_hash_layers);
    std::printf("total parameters         %.2f B\n", double(p.total) / 1e9);
    std::printf("active per token         %.2f B\n", double(p.active_per_token) / 1e9);
    std::printf("compressed KV per token  %.1f bytes (bf16) + window %.2f MiB per sequence\n", kv,
                double(window_bytes) / 1048576.0);
  }
  return 0;
}

int cmd_inspect(const std::string& dir, bool as_json) {
  ModelConfig c = ModelConfig::from_dir(dir);
  ParamCounts p = count_params(c);
  const int64_t kv = c.kv_bytes_per_token(2), st = c.deltanet_state_bytes_per_seq(2);
  if (c.deepseek_v4) return inspect_deepseek_v4(c, p, as_json);
  if (as_json) {
    json j = {{"family", family_name(c.family)},
              {"model_type", c.model_type},
              {"num_layers", c.num_layers},
              {"full_attention_layers", c.num_layers_of(LayerType::FullAttention)},
              {"linear_attention_layers", c.num_layers_of(LayerType::LinearAttention)},
              {"total_params", p.total},
              {"active_params_per_token", p.active_per_token},
              {"routed_expert_params", p.routed_expert},
              {"kv_cache_bytes_per_token_bf16", kv},
              {"deltanet_state_bytes_per_seq", st}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("family                   %s (%s)\n", family_name(c.family).c_str(), c.model_type.c_str());
    std::printf("layers                   %lld (%lld full attention, %lld Gated DeltaNet)\n", (long long)c.num_layers,
                (long long)c.num_layers_of(LayerType::FullAttention), (long long)c.num_layers_of(LayerType::LinearAttention));
    std::printf("total parameters         %.2f B\n", double(p.total) / 1e9);
    std::printf("active per token         %.2f B\n", double(p.active_per_token) / 1e9);
    std::printf("KV cache per token       %lld bytes (bf16)\n", (long long)kv);
    std::printf("DeltaNet state per seq   %.2f MiB (conv bf16, recurrent fp32)\n", double(st) / 1048576.0);
  }
  return 0;
}

}  // namespace

/// Sampling options shared by generate and chat.
struct SamplingOpts {
  double temperature = 0, top_p = 1, min_p = 0, repetition_penalty = 1;
  bool ignore_eos = false;
  int top_k = 0, max_tokens = 256;
  int64_t seed = -1;
  std::vector<std::string> stop;
  void add(CLI::App* c) {
    c->add_option("--max-tokens", max_tokens, "tokens to generate (1 .. 1048576)")->check(CLI::Range(1, 1 << 20));
    c->add_option("--temperature", temperature, "0 = greedy");
    c->add_option("--top-p", top_p, "nucleus sampling (1 = off)");
    c->add_option("--top-k", top_k, "top-k sampling (0 = off)");
    c->add_option("--min-p", min_p, "min-p sampling (0 = off)");
    c->add_option("--repetition-penalty", repetition_penalty, "1 = off");
    c->add_option("--sampling-seed", seed, "seed for sampling (-1: random)");
    c->add_option("--stop", stop, "stop string (repeatable)")->default_str("");  // no "=[]" in --help
    c->add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-sequence tokens");
  }
  SamplingParams params() const {
    SamplingParams p;
    p.temperature = float(temperature);
    p.top_p = float(top_p);
    p.top_k = top_k;
    p.min_p = float(min_p);
    p.repetition_penalty = float(repetition_penalty);
    p.max_tokens = max_tokens;
    p.stop = stop;
    p.ignore_eos = ignore_eos;
    if (seed >= 0) p.seed = seed;
    return p;
  }
};

/// Streams one generation to stdout; returns the result.
TextGenerationResult stream_generation(ModelRunner& runner, const Tokenizer& tok, const std::vector<int32_t>& ids,
                                       const SamplingParams& params, int64_t context) {
  auto r = generate_text(runner, tok, ids, params, context, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  std::fflush(stdout);
  return r;
}

/// --stats of one text generation from a prompt of `prompt_tokens` tokens.
GenerationStats stats_of(const TextGenerationResult& r, size_t prompt_tokens) {
  return {int64_t(prompt_tokens), int64_t(r.output_ids.size()), r.prefill_seconds, r.decode_seconds};
}

/// "moefold 0.1.0 (git 1a2b3c4)": the project version and the checkout it was configured from.
std::string version_string() {
  std::string v = std::string("moefold ") + MOEFOLD_VERSION;
  if (*MOEFOLD_GIT_DESCRIBE) v += std::string(" (git ") + MOEFOLD_GIT_DESCRIBE + ")";
  return v;
}

namespace {

/// --require-kernel NAME (repeatable) of whichever command runs: checked by main() after it succeeded.
std::vector<std::string> g_required_kernels;

void add_require_kernel(CLI::App* c) {
  c->add_option("--require-kernel", g_required_kernels,
                "fail unless this kernel ran (a registry name, e.g. attn_fa_kernel; repeatable)")
      ->default_str("");  // no "=[]" in --help
}

int run_command(int argc, char** argv) {
  CLI::App app{"moefold: an inference engine for sparse mixture-of-experts LLMs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_string(), "print the version and exit");
  // --help shows every option's default (subcommands copy these defaults when they are added).
  app.option_defaults()->always_capture_default();
  std::string model_dir, load_format = "auto", device = "cpu", prompt_ids, prompt_text, out_path, output = "text";
  std::string message, system_prompt;
  bool as_json = false, enable_thinking = false, stats = false;
  int max_model_len = 4096;
  uint64_t seed = 0;
  SamplingOpts sopts;

  auto add_model_opts = [&](CLI::App* c) {
    c->add_option("--model", model_dir, "model directory (config.json + safetensors)")->required();
    c->add_option("--load-format", load_format, "auto | safetensors | dummy (seeded random weights)");
    device_choices(c->add_option("--device", device));
    c->add_option("--seed", seed, "seed for dummy weights");
    add_quantization_options(c, g_quantization, g_fp8_lm_head);
    add_kv_cache_dtype_option(c, g_kv_cache_dtype);
    c->add_flag("--enforce-eager", g_gpu.enforce_eager, "--device cuda: run decode steps eagerly (no CUDA graphs)");
    c->add_flag("--batch-invariant,!--no-batch-invariant", g_gpu.batch_invariant,
                "--device cuda: kernels whose per-row results do not depend on the rest of the batch (default: on)");
    add_parallel_options(c, g_parallel);
  };
  auto* inspect = app.add_subcommand("inspect", "model facts from config.json, without loading weights");
  inspect->add_option("--model", model_dir, "model directory")->required();
  inspect->add_flag("--json", as_json, "print JSON");
  auto* logits = app.add_subcommand("logits", "float32 logits of every prompt position to a .npy file");
  add_model_opts(logits);
  logits->add_option("--prompt-ids", prompt_ids, "comma-separated token ids")->required();
  logits->add_option("--out", out_path, "output .npy path")->required();
  auto* generate = app.add_subcommand("generate", "continue a prompt (text or token ids)");
  add_model_opts(generate);
  auto* ids_opt = generate->add_option("--prompt-ids", prompt_ids, "comma-separated token ids");
  auto* text_opt = generate->add_option("--prompt", prompt_text, "prompt text (needs tokenizer.json)");
  ids_opt->excludes(text_opt);
  generate->add_option("--output", output, "text | json (json: {\"tokens\": [...]} for --prompt-ids)")
      ->check(CLI::IsMember({"text", "json"}));
  sopts.add(generate);
  generate->add_flag("--stats", stats, "print prompt and output tokens, prefill time and decode tokens/s to stderr");
  auto* chat = app.add_subcommand("chat", "chat through the model's chat template (interactive without --message)");
  add_model_opts(chat);
  chat->add_option("--message", message, "one user message: answer it and exit");
  chat->add_option("--system", system_prompt, "system message");
  chat->add_flag("--enable-thinking", enable_thinking, "template kwarg enable_thinking (Qwen3.5/3.6)");
  auto* max_len_opt = chat->add_option("--max-model-len", max_model_len,
                                       "context length (prompt + output tokens; without it: at most the model's)");
  max_len_opt->check(CLI::Range(2, 1 << 24))->capture_default_str();
  sopts.add(chat);
  chat->add_flag("--stats", stats, "print prompt and output tokens, prefill time and decode tokens/s to stderr (each turn)");

  auto serve = add_serve_command(app);
  auto bench = add_bench_command(app);
  auto profile = add_profile_command(app);
  auto fp8 = add_fp8_commands(app);
  // serve declares --device in serve_command.cc; the choices are set here so every model command
  // lists and checks the same devices.
  device_choices(serve->app->get_option("--device"));
  for (CLI::App* c : {logits, generate, chat, serve->app, bench->offline->app, profile->app}) add_require_kernel(c);

  std::vector<std::string> args = expand_parallel_short_flags(argc, argv);  // -tp N (vLLM's short name)
  std::vector<char*> arg_ptrs;
  for (auto& a : args) arg_ptrs.push_back(a.data());
  CLI11_PARSE(app, int(arg_ptrs.size()), arg_ptrs.data());
  try {
    prof::check_kernel_names(g_required_kernels);  // a typo fails before the model loads
    if (*inspect) return cmd_inspect(model_dir, as_json);
    if (*serve->app) return serve->run();
    if (*bench->app) return bench->run();
    if (*fp8->probe || *fp8->drift || *fp8->perplexity) return fp8->run();
    if (*profile->app) {
      for (int i = 0; i < argc; ++i) profile->command_line += (i ? " " : "") + std::string(argv[i]);
      return profile->run();
    }
    const LoadFormat format = parse_load_format(load_format);
    if (!std::filesystem::is_directory(model_dir))
      fail("--model {}: not a model directory (expected a folder with config.json)", model_dir);
    std::unique_ptr<Model> cpu_model;
    if (*chat) {
      Tokenizer tok = Tokenizer::from_file(model_dir);
      ChatTemplate tmpl = ChatTemplate::from_model_dir(model_dir);
      const ModelConfig chat_cfg = ModelConfig::from_dir(model_dir);
      if (max_len_opt->count() == 0 && chat_cfg.max_position_embeddings > 0)  // the default fits every model
        max_model_len = int(std::min<int64_t>(max_model_len, chat_cfg.max_position_embeddings));
      MOEFOLD_CHECK(chat_cfg.max_position_embeddings <= 0 || max_model_len <= chat_cfg.max_position_embeddings,
                    "--max-model-len {} exceeds the model's max_position_embeddings {}", max_model_len,
                    chat_cfg.max_position_embeddings);
      auto runner = make_runner(model_dir, format, seed, device, max_model_len, cpu_model);
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", system_prompt}});
      const nlohmann::ordered_json kwargs = {{"enable_thinking", enable_thinking}};
      auto turn = [&](const std::string& user) {
        messages.push_back({{"role", "user"}, {"content", user}});
        auto ids = tok.encode(tmpl.render(messages, nullptr, true, kwargs), false);
        auto r = stream_generation(*runner, tok, ids, sopts.params(), max_model_len);
        if (stats) print_stats(stats_of(r, ids.size()));
        messages.push_back({{"role", "assistant"}, {"content", r.text}});
      };
      if (!message.empty()) {
        turn(message);
        return 0;
      }
      std::string line;
      while (std::printf("> "), std::fflush(stdout), std::getline(std::cin, line)) {
        if (line.empty()) continue;
        try {
          turn(line);
        } catch (const Error& e) {
          std::fprintf(stderr, "error: %s\n", e.what());
          messages.erase(messages.end() - 1);
        }
      }
      return 0;
    }
    if (*generate && text_opt->count() > 0) {
      MOEFOLD_CHECK(!prompt_text.empty(), "--prompt is empty");
      Tokenizer tok = Tokenizer::from_file(model_dir);
      auto ids = tok.encode(prompt_text, true);
      const int32_t total = int32_t(ids.size()) + sopts.max_tokens;
      auto runner = make_runner(model_dir, format, seed, device, total, cpu_model);
      if (output == "json") {  // one JSON object on stdout, nothing streamed before it
        auto r = generate_text(*runner, tok, ids, sopts.params(), total);
        std::cout << json{{"tokens", r.output_ids}, {"text", r.text}}.dump() << std::endl;
        if (stats) print_stats(stats_of(r, ids.size()));
        return 0;
      }
      auto r = stream_generation(*runner, tok, ids, sopts.params(), total);
      if (stats) print_stats(stats_of(r, ids.size()));
      return 0;
    }
    MOEFOLD_CHECK(!prompt_ids.empty(), "give --prompt-ids or --prompt");
    auto ids = parse_ids(prompt_ids);
    const int32_t total = int32_t(ids.size()) + (*generate ? sopts.max_tokens : 0);
    auto runner_ptr = make_runner(model_dir, format, seed, device, total, cpu_model);
    ModelRunner& runner = *runner_ptr;
    const ModelConfig& cfg = runner.config();
    if (*logits) {
      int32_t seq = runner.add_sequence(ids);
      auto out = runner.step({{seq, int32_t(ids.size()), true}});
      write_npy(out_path, {int64_t(ids.size()), cfg.vocab_size}, out[0]);
      return 0;
    }
    // Token ids in, token ids out: sampled with the same Sampler as text generation, inside the
    // executor (ModelRunner::step_sample: on the GPU with --device cuda).
    SamplingParams params = sopts.params();
    params.validate();
    Sampler sampler(params);
    std::vector<int32_t> gen;
    std::vector<SampleResult> sampled;
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    auto first_token = t0;
    int32_t seq = runner.add_sequence(ids);
    auto step = [&](int32_t n) {
      const RowSampling row{&sampler, ids, gen};
      runner.step_sample({{seq, n, false}}, {&row, 1}, {}, sampled);
      if (!sampled[0].error.empty()) fail("{}", sampled[0].error);
      return sampled[0].token;
    };
    int32_t tok = step(int32_t(ids.size()));
    const auto& eos = cfg.eos_token_ids;
    for (int i = 0; i < sopts.max_tokens; ++i) {
      gen.push_back(tok);
      if (i == 0) first_token = clock::now();
      const bool is_eos = !params.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end();
      if (is_eos || i + 1 == sopts.max_tokens) break;
      runner.append_token(seq, tok);
      tok = step(1);
    }
    const auto done = clock::now();
    if (output == "json") {
      std::cout << json{{"tokens", gen}}.dump() << "\n";
    } else {
      for (size_t i = 0; i < gen.size(); ++i) std::cout << (i ? "," : "") << gen[i];
      std::cout << "\n";
    }
    std::cout.flush();
    if (stats) {
      auto secs = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
      print_stats({int64_t(ids.size()), int64_t(gen.size()), secs(first_token - t0), secs(done - first_token)});
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "error: out of host memory: this run needs more memory than the machine has (the CPU backend "
                 "holds fp32 weights and KV pages; lower --max-model-len or the workload, or use --device cuda)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_nccl_tp_backend();  // -tp N --device cuda over NCCL, when this binary links it
  const int rc = run_command(argc, argv);
  if (rc != 0 || g_required_kernels.empty()) return rc;
  try {
    prof::require_kernels_ran(g_required_kernels);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
