// `moefold serve` options (contract: serve_command.h).
#include "cli/serve_command.h"

#include "cli/parallel_options.h"
#include "cli/kv_cache_dtype_option.h"
#include "cli/quantization_option.h"

namespace moefold {

std::unique_ptr<ServeCommand> add_serve_command(CLI::App& app) {
  auto cmd = std::make_unique<ServeCommand>();
  server::ServeOptions& o = cmd->options;
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  cmd->app = c;
  c->add_option("--model", o.model_dir, "model directory (config.json, tokenizer.json, safetensors)")->required();
  c->add_option("--served-model-name", o.served_model_name, "model name in the API (default: the directory's name)");
  c->add_option("--load-format", o.load_format, "auto | safetensors | dummy (seeded random weights)")
      ->capture_default_str();
  c->add_option("--device", o.device, "cpu | cuda (cuda needs a build with the CUDA backend)")->capture_default_str();
  c->add_option("--seed", o.seed, "seed for dummy weights")->capture_default_str();
  add_quantization_options(c, o.quantization, o.fp8_lm_head);
  add_kv_cache_dtype_option(c, o.kv_cache_dtype);
  c->add_option("--host", o.host, "address to listen on")->capture_default_str();
  c->add_option("--port", o.port, "port to listen on; 0 picks a free one")->capture_default_str()->check(CLI::Range(0, 65535));
  c->add_option("--max-num-seqs", o.max_num_seqs, "sequences running at once (= DeltaNet state slots)")
      ->capture_default_str();
  c->add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "token rows per step")->capture_default_str();
  c->add_option("--max-prefill-chunk", o.max_prefill_chunk, "most prompt tokens of one request per step (0: budget)")
      ->capture_default_str();
  c->add_option("--max-model-len", o.max_model_len, "prompt + output tokens (0: the model's, capped by the KV cache)")
      ->capture_default_str();
  c->add_option("--kv-cache-memory", cmd->kv_cache_memory, "bytes for KV pages, e.g. 2G (default 1G)");
  c->add_option("--num-kv-blocks", o.num_kv_blocks, "KV pages; overrides --kv-cache-memory when > 0")
      ->capture_default_str();
  c->add_option("--block-size", o.block_size, "tokens per KV page")->capture_default_str();
  c->add_option("--max-queue", o.max_queue, "waiting sequences before new requests get 503")->capture_default_str();
  c->add_option("--max-n", o.max_n, "largest n (choices per request) accepted")->capture_default_str();
  c->add_option("--http-threads", o.http_threads, "HTTP handler threads (each open stream holds one)")
      ->capture_default_str();
  c->add_option("--generation-config", o.generation_config,
                "auto: sampling defaults from the model's generation_config.json; vllm: ignore it")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "vllm"}));
  c->add_option("--api-key", o.api_key,
                "require 'Authorization: Bearer KEY' on every endpoint except /health (default: $MOEFOLD_API_KEY)");
  c->add_flag("--disable-metrics-auth", o.disable_metrics_auth, "with an API key, leave /metrics open");
  c->add_option("--allowed-origins", o.allowed_origins,
                "CORS origins, comma-separated or a JSON list (\"*\": any); default: no CORS headers");
  c->add_option("--allowed-methods", o.allowed_methods, "CORS methods allowed in a preflight")->capture_default_str();
  c->add_option("--allowed-headers", o.allowed_headers, "CORS request headers allowed in a preflight")
      ->capture_default_str();
  c->add_option("--allowed-hosts", o.allowed_hosts,
                "accepted Host header names, comma-separated (others get 400); default: any");
  c->add_option("--http-receive-timeout", o.http_receive_timeout,
                "seconds from a request's first byte to its last before it gets 408")
      ->capture_default_str();
  c->add_option("--http-keep-alive-timeout", o.http_keep_alive_timeout,
                "seconds an idle connection stays open")
      ->capture_default_str();
  c->add_flag("--disable-log-requests", o.disable_log_requests, "no log line per finished request");
  c->add_flag("--enforce-eager", o.enforce_eager, "--device cuda: run decode steps eagerly (no CUDA graphs)");
  c->add_option("--cuda-graph-sizes", o.cuda_graph_sizes,
                "--device cuda: decode batch sizes captured as CUDA graphs (default 1,2,4,8,16,24,32,48,64,96,"
                "128,192,256, capped by --max-num-seqs)")
      ->delimiter(',')
      ->default_str("");
  c->add_flag("--batch-invariant,!--no-batch-invariant", o.batch_invariant,
              "--device cuda: kernels whose per-row results do not depend on the rest of the batch (default: on)");
  c->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.enable_prefix_caching,
              "reuse the KV pages (and DeltaNet state snapshots) of shared prompt prefixes (default: on)");
  c->add_option("--prefix-snapshot-memory", cmd->prefix_snapshot_memory,
                "hybrid models: bytes for the prefix cache's DeltaNet state snapshots, e.g. 2G (default 1G)");
  c->add_option("--prefix-snapshot-interval", o.prefix_snapshot_interval,
                "hybrid models: besides each prompt's last 64-token boundary, a state snapshot every this many "
                "prompt tokens (a multiple of 64; 0: none)")
      ->capture_default_str();
  c->add_option("--tool-call-parser", o.tool_call_parser,
                "tool-call format of the model's output: qwen3_coder | hermes (default: the one its chat template shows)")
      ->check(CLI::IsMember({"qwen3_coder", "hermes"}));
  c->add_flag("--enable-auto-tool-choice", o.enable_auto_tool_choice,
              "parse tool calls when a request's tool_choice is \"auto\" (the default with tools)");
  add_parallel_options(c, o.parallel);
  c->add_option("--reasoning-parser", o.reasoning_parser,
                "split thinking into reasoning_content: qwen3 | deepseek_r1 (default: none)")
      ->check(CLI::IsMember({"qwen3", "deepseek_r1"}));
  return cmd;
}

int ServeCommand::run() {
  if (!kv_cache_memory.empty()) options.kv_cache_memory = server::parse_bytes(kv_cache_memory);
  if (!prefix_snapshot_memory.empty()) options.prefix_snapshot_memory = server::parse_bytes(prefix_snapshot_memory);
  return server::run_server(options);
}

}  // namespace moefold
