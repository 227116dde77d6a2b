// `moefold serve` options (contract: serve_command.h).
#include "cli/serve_command.h"

namespace moefold {

std::unique_ptr<ServeCommand> add_serve_command(CLI::App& app) {
  auto cmd = std::make_unique<ServeCommand>();
  server::ServeOptions& o = cmd->options;
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  cmd->app = c;
  c->add_option("--model", o.model_dir, "model directory (config.json, tokenizer.json, safetensors)")->required();
  c->add_option("--served-model-name", o.served_model_name, "model name in the API (default: the directory's name)");
  c->add_option("--load-format", o.load_format, "auto | safetensors | dummy (seeded random weights)");
  c->add_option("--device", o.device, "cpu");
  c->add_option("--seed", o.seed, "seed for dummy weights");
  c->add_option("--host", o.host, "address to listen on")->capture_default_str();
  c->add_option("--port", o.port, "port to listen on; 0 picks a free one")->capture_default_str()->check(CLI::Range(0, 65535));
  c->add_option("--max-num-seqs", o.max_num_seqs, "sequences running at once (= DeltaNet state slots)")
      ->capture_default_str();
  c->add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "token rows per step")->capture_default_str();
  c->add_option("--max-prefill-chunk", o.max_prefill_chunk, "most prompt tokens of one request per step (0: budget)");
  c->add_option("--max-model-len", o.max_model_len, "prompt + output tokens (default: the model's, capped by the KV cache)");
  c->add_option("--kv-cache-memory", cmd->kv_cache_memory, "bytes for KV pages, e.g. 2G (default 1G)");
  c->add_option("--num-kv-blocks", o.num_kv_blocks, "KV pages; overrides --kv-cache-memory");
  c->add_option("--block-size", o.block_size, "tokens per KV page")->capture_default_str();
  c->add_option("--max-queue", o.max_queue, "waiting sequences before new requests get 503")->capture_default_str();
  c->add_option("--max-n", o.max_n, "largest n (choices per request) accepted")->capture_default_str();
  c->add_option("--http-threads", o.http_threads, "HTTP handler threads (each open stream holds one)")
      ->capture_default_str();
  return cmd;
}

int ServeCommand::run() {
  if (!kv_cache_memory.empty()) options.kv_cache_memory = server::parse_bytes(kv_cache_memory);
  return server::run_server(options);
}

}  // namespace moefold
