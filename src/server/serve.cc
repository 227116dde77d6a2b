// `moefold serve` start-up and shutdown (contract: serve.h).
#include "server/serve.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <numeric>
#include <optional>
#include <thread>

#include "core/error.h"
#include "io/model_config.h"
#include "models/load_model.h"
#include "parallel/cpu_parallel_executor.h"
#include "runtime/kv_cache.h"
#include "server/engine.h"
#include "server/generation_config.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/reasoning_parser.h"
#include "server/tool_parsers/tool_parser.h"
#include "text/chat_template.h"
#include "runtime/grammar_constraint.h"
#include "text/tokenizer.h"
#ifdef MOEFOLD_HAVE_CUDA
#include "models/cuda/cuda_executor.h"
#include "models/cuda/cuda_tp_executor.h"
#endif

namespace moefold::server {

int64_t parse_bytes(const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    fail("'{}' is not a byte count (e.g. 1073741824, 512M, 4G)", s);
  }
  std::string suffix = s.substr(used);
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (!suffix.empty() && (suffix.back() == 'i')) suffix.pop_back();
  double mult = 1;
  if (suffix == "K" || suffix == "k") mult = 1024.0;
  else if (suffix == "M" || suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (!suffix.empty()) fail("'{}' is not a byte count (unknown suffix '{}')", s, suffix);
  if (!(v >= 0) || v * mult > 9.0e18) fail("'{}' is not a valid byte count", s);
  return int64_t(v * mult);
}

namespace {

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &b, 1);
}

/// KV pages and context length from the options and the model.
struct PoolPlan {
  int32_t num_blocks;
  int32_t max_model_len;
};

PoolPlan plan_pool(const ServeOptions& o, const ModelConfig& cfg) {
  MOEFOLD_CHECK(o.block_size >= 1, "--block-size must be at least 1");
  MOEFOLD_CHECK(o.max_num_seqs >= 1, "--max-num-seqs must be at least 1");
  MOEFOLD_CHECK(o.max_model_len >= 0, "--max-model-len must be positive");
  int64_t len = o.max_model_len > 0 ? o.max_model_len : (cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096);
  const int64_t bs = o.block_size;
  const int64_t wanted = (int64_t(o.max_num_seqs) * len + bs - 1) / bs + o.max_num_seqs;
  int64_t blocks = wanted;
  if (o.num_kv_blocks > 0) {
    blocks = o.num_kv_blocks;
  } else {
    // --kv-cache-dtype auto: fp32 pages on the CPU backend, bf16 on the GPU; fp8: 1 byte per element.
    const int64_t fit = kv_pages_for_memory(cfg, kv_elem_for(parse_kv_cache_dtype(o.kv_cache_dtype), o.device != "cpu"),
                                            o.kv_cache_memory, bs);
    if (fit >= 0) blocks = std::min(wanted, fit);
  }
  blocks = std::min<int64_t>(blocks, 1 << 30);
  MOEFOLD_CHECK(blocks >= 1, "--kv-cache-memory {} holds no KV page of {} tokens", o.kv_cache_memory, bs);
  const int64_t capacity = blocks * bs;
  if (len > capacity) {
    MOEFOLD_CHECK(o.max_model_len == 0,
                  "--max-model-len {} does not fit the KV cache ({} pages of {} tokens = {} tokens); raise "
                  "--kv-cache-memory / --num-kv-blocks or lower --max-model-len",
                  o.max_model_len, blocks, bs, capacity);
    std::fprintf(stderr, "moefold serve: max-model-len capped to the KV cache: %lld tokens\n", (long long)capacity);
    len = capacity;
  }
  return {int32_t(blocks), int32_t(len)};
}

/// The tool-call parser: --tool-call-parser, else the format the chat template shows.
ToolServing resolve_tool_serving(const ServeOptions& o, const ChatTemplate* tmpl) {
  ToolServing ts;
  ts.enable_auto_tool_choice = o.enable_auto_tool_choice;
  std::string from = "--tool-call-parser";
  if (!o.tool_call_parser.empty()) {
    const auto& names = tool_parser_names();
    if (std::find(names.begin(), names.end(), o.tool_call_parser) == names.end())
      fail("--tool-call-parser {}: expected qwen3_coder or hermes", o.tool_call_parser);
    ts.tool_parser = o.tool_call_parser;
  } else if (tmpl) {
    const std::string* src = tmpl->source("tool_use");
    if (!src) src = tmpl->source("default");
    if (src) ts.tool_parser = tool_parser_for_template(*src);
    from = "the chat template";
  }
  if (ts.enable_auto_tool_choice && ts.tool_parser.empty())
    fail("--enable-auto-tool-choice needs --tool-call-parser (qwen3_coder or hermes): the chat template shows no "
         "tool-call format");
  if (!ts.tool_parser.empty())
    std::fprintf(stderr, "moefold serve: tool calls in the %s format (%s); tool_choice \"auto\" %s\n",
                 ts.tool_parser.c_str(), from.c_str(),
                 ts.enable_auto_tool_choice ? "on" : "off (--enable-auto-tool-choice)");
  return ts;
}

}  // namespace

int run_server(const ServeOptions& o) {
  if (o.device != "cpu" && o.device != "cuda") fail("--device {}: expected cpu or cuda", o.device);
  MOEFOLD_CHECK(o.max_n >= 1, "--max-n must be at least 1");
  MOEFOLD_CHECK(o.max_queue >= 1, "--max-queue must be at least 1");
  if (o.generation_config != "auto" && o.generation_config != "vllm")
    fail("--generation-config {}: expected auto or vllm", o.generation_config);
  MOEFOLD_CHECK(o.http_receive_timeout > 0 && o.http_keep_alive_timeout > 0,
                "--http-receive-timeout and --http-keep-alive-timeout must be positive");
  HttpOptions ho;
  ho.http_threads = o.http_threads;
  ho.limits.receive_timeout = o.http_receive_timeout;
  ho.limits.keep_alive_timeout = o.http_keep_alive_timeout;
  ho.log_requests = !o.disable_log_requests;
  ho.policy.api_key = o.api_key;
  if (ho.policy.api_key.empty())
    if (const char* k = std::getenv("MOEFOLD_API_KEY")) ho.policy.api_key = k;
  ho.policy.metrics_without_key = o.disable_metrics_auth;
  ho.policy.allowed_origins = parse_list_option(o.allowed_origins, "--allowed-origins");
  ho.policy.allowed_methods = parse_list_option(o.allowed_methods, "--allowed-methods");
  ho.policy.allowed_headers = parse_list_option(o.allowed_headers, "--allowed-headers");
  ho.policy.allowed_hosts = parse_list_option(o.allowed_hosts, "--allowed-hosts");
  const std::string dir = o.model_dir;
  ModelConfig cfg = ModelConfig::from_dir(dir);
  check_kv_cache_dtype(cfg, parse_kv_cache_dtype(o.kv_cache_dtype), o.device);  // before anything loads
  const PoolPlan pool = plan_pool(o, cfg);

  Tokenizer tokenizer = Tokenizer::from_file(dir);
  std::optional<ChatTemplate> chat_template;
  try {
    chat_template = ChatTemplate::from_model_dir(dir);
  } catch (const Error& e) {
    std::fprintf(stderr, "moefold serve: no chat template (%s); /v1/chat/completions will answer 400\n", e.what());
  }
  const ToolServing tool_serving = resolve_tool_serving(o, chat_template ? &*chat_template : nullptr);
  if (!o.reasoning_parser.empty()) {
    const auto& names = reasoning_parser_names();
    if (std::find(names.begin(), names.end(), o.reasoning_parser) == names.end())
      fail("--reasoning-parser {}: expected qwen3 or deepseek_r1", o.reasoning_parser);
  }
  const SamplingDefaults sampling_defaults =
      o.generation_config == "auto" ? load_generation_config(dir) : SamplingDefaults{};
  if (!sampling_defaults.empty())
    std::fprintf(stderr, "moefold serve: default sampling parameters from generation_config.json: %s\n",
                 sampling_defaults.describe().c_str());
  const LoadFormat format = parse_load_format(o.load_format);
  std::string what = o.load_format + " weights";
  if (format != LoadFormat::Dummy) {
    size_t files = 0;
    uintmax_t bytes = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") {
        ++files;
        bytes += e.file_size(ec);
      }
    what += fmt::format(": {} safetensors file{}, {:.2f} GB", files, files == 1 ? "" : "s", double(bytes) / 1e9);
  }
  std::fprintf(stderr, "moefold serve: loading the model from %s (%s, %s)...\n", dir.c_str(), what.c_str(),
               o.device.c_str());
  const auto load_start = std::chrono::steady_clock::now();
  RunnerOptions ro{pool.num_blocks, o.block_size, o.max_num_seqs};
  ro.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  ro.enable_prefix_caching = o.enable_prefix_caching;
  ro.snapshot_interval = o.prefix_snapshot_interval;
  // Snapshot slots: the budget over one slot's bytes (bf16 conv state on the GPU, fp32 on the CPU), at
  // most one per 64 tokens the KV pool holds (more could never be used: each needs its own pages).
  const int64_t slot_bytes = deltanet_slot_bytes(cfg, o.device == "cpu" ? 4 : 2);
  MOEFOLD_CHECK(o.prefix_snapshot_memory >= 0, "--prefix-snapshot-memory must be >= 0");
  MOEFOLD_CHECK(o.prefix_snapshot_interval >= 0 && o.prefix_snapshot_interval % 64 == 0,
                "--prefix-snapshot-interval {} must be a multiple of 64", o.prefix_snapshot_interval);
  if (o.enable_prefix_caching && slot_bytes > 0)
    ro.snapshot_slots = int32_t(std::min<int64_t>(o.prefix_snapshot_memory / slot_bytes,
                                                  int64_t(pool.num_blocks) * o.block_size / 64 + 1));

  std::unique_ptr<Model> cpu_model;
  std::unique_ptr<ModelRunner> runner;
  validate(o.parallel);
  if (o.device == "cpu" && o.parallel.tensor_parallel_size > 1) {  // sharded over the ranks, then freed
    auto full = load_model(dir, format, o.seed, parse_quantization(o.quantization), o.fp8_lm_head);
    runner = std::make_unique<ModelRunner>(
        make_cpu_parallel_executor(*full, o.parallel, ro.num_blocks, ro.block_size, ro.max_seqs + ro.snapshot_slots,
                                   ro.kv_cache_dtype),
        ro);
  } else if (o.device == "cpu") {
    cpu_model = load_model(dir, format, o.seed, parse_quantization(o.quantization), o.fp8_lm_head);
    runner = std::make_unique<ModelRunner>(*cpu_model, ro);
  } else {
#ifdef MOEFOLD_HAVE_CUDA
    CudaExecutorOptions co;
    co.num_blocks = ro.num_blocks;
    co.block_size = ro.block_size;
    co.num_slots = ro.max_seqs;
    co.num_snapshot_slots = ro.snapshot_slots;
    co.max_rows = o.max_num_batched_tokens;
    co.max_blocks_per_seq = (pool.max_model_len + o.block_size - 1) / o.block_size;
    co.enforce_eager = o.enforce_eager;
    co.quantization = parse_quantization(o.quantization);
    co.fp8_lm_head = o.fp8_lm_head;
    co.kv_cache_dtype = ro.kv_cache_dtype;
    if (!o.cuda_graph_sizes.empty()) co.cuda_graph_sizes = o.cuda_graph_sizes;
    co.batch_invariant = o.batch_invariant;
    co.log_graphs = true;
    runner = std::make_unique<ModelRunner>(
        o.parallel.tensor_parallel_size > 1 ? make_cuda_tp_executor_from_dir(dir, format, o.seed, o.parallel, co)
                                            : make_cuda_executor(dir, format, o.seed, co),
        ro);
#else
    fail("--device cuda: this binary was built without the CUDA backend");
#endif
  }

  std::fprintf(stderr, "moefold serve: model loaded in %.1f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count());

  std::string name = o.served_model_name;
  if (name.empty()) {
    std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();
    name = p.filename().string();
  }
  ModelInfo info;
  info.name = name;
  info.max_model_len = pool.max_model_len;
  info.vocab_size = cfg.vocab_size;
  info.max_n = o.max_n;
  info.tokenizer = &tokenizer;
  info.chat_template = chat_template ? &*chat_template : nullptr;
  info.sampling_defaults = sampling_defaults;
  info.tool_serving = tool_serving;
  info.reasoning_parser = o.reasoning_parser;
  // Structured output: the grammar engine's view of the vocabulary (decoded bytes per id) and EOS.
  const GrammarCompiler grammar(tokenizer, cfg.vocab_size, cfg.eos_token_ids);
  info.grammar = &grammar;

  EngineOptions eo;
  eo.scheduler = {o.max_num_seqs, o.max_num_batched_tokens, o.max_prefill_chunk, pool.max_model_len};
  eo.max_queue = o.max_queue;
  // Never sample an id the tokenizer cannot decode (padding rows of the model's vocabulary).
  eo.masked_tokens = tokenizer.unknown_ids(cfg.vocab_size);
  if (!eo.masked_tokens.empty())
    std::fprintf(stderr, "moefold serve: %zu of the model's %lld token ids are unknown to the tokenizer; they are never sampled\n",
                 eo.masked_tokens.size(), (long long)cfg.vocab_size);

  // Signals: SIGPIPE ignored (a vanished client is a failed write). SIGINT/SIGTERM may land on any
  // thread (BLAS threads exist before main), so their handler only writes to a pipe that a
  // watcher thread reads.
  ::signal(SIGPIPE, SIG_IGN);
  MOEFOLD_CHECK(::pipe(g_signal_pipe) == 0, "cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  Metrics metrics;
  Engine engine(std::move(runner), tokenizer, eo, metrics);
  HttpApi api(engine, info, metrics, ho);
  const int port = api.bind(o.host, o.port);
  std::thread watcher([&] {
    unsigned char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig != 0) std::fprintf(stderr, "moefold serve: signal %d, shutting down\n", int(sig));
    engine.stop();  // in-flight requests end with an error, so that their handlers return
    api.stop();
  });
  std::fprintf(stderr,
               "moefold serve: model '%s' (%s), max-model-len %d, %d KV pages of %d tokens, %d sequences, "
               "budget %d tokens/step\n",
               name.c_str(), family_name(cfg.family).c_str(), pool.max_model_len, pool.num_blocks, o.block_size,
               o.max_num_seqs, o.max_num_batched_tokens);
  {
    const cpu::KvElem e = kv_elem_for(ro.kv_cache_dtype, o.device != "cpu");
    const int64_t kv_bytes = int64_t(pool.num_blocks) * o.block_size * cfg.kv_bytes_per_token(kv_elem_bytes(e));
    std::fprintf(stderr, "moefold serve: KV cache %s (--kv-cache-dtype %s): %lld tokens in %.1f MiB%s\n",
                 std::string(kv_elem_name(e)).c_str(), std::string(kv_cache_dtype_name(ro.kv_cache_dtype)).c_str(),
                 (long long)pool.num_blocks * o.block_size, double(kv_bytes) / (1 << 20),
                 e == cpu::KvElem::F8E4M3 ? ", a scale per layer and KV head (the checkpoint's k_scale / v_scale, else 1)"
                                          : "");
  }
  if (!o.enable_prefix_caching)
    std::fprintf(stderr, "moefold serve: prefix caching off\n");
  else if (slot_bytes == 0)
    std::fprintf(stderr, "moefold serve: prefix caching on (KV pages of %d tokens)\n", o.block_size);
  else
    std::fprintf(stderr,
                 "moefold serve: prefix caching on: %d DeltaNet state snapshots of %.3f MiB (%.3f GiB of "
                 "--prefix-snapshot-memory %.2f GiB), at each prompt's last %d-token boundary and every %d "
                 "prompt tokens\n",
                 ro.snapshot_slots, double(slot_bytes) / 1048576.0,
                 double(slot_bytes) * ro.snapshot_slots / 1073741824.0, double(o.prefix_snapshot_memory) / 1073741824.0,
                 std::lcm(64, o.block_size), o.prefix_snapshot_interval);
  if (!ho.policy.api_key.empty())
    std::fprintf(stderr, "moefold serve: API key required on every endpoint except /health%s\n",
                 ho.policy.metrics_without_key ? " and /metrics" : "");
  std::printf("moefold serve: listening on http://%s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);
  const bool ok = api.listen();
  // listen() returned (after a signal, or on its own): wake the watcher if it still waits.
  const unsigned char zero = 0;
  (void)!::write(g_signal_pipe[1], &zero, 1);
  watcher.join();
  engine.stop();
  return ok ? 0 : 1;
}

}  // namespace moefold::server
