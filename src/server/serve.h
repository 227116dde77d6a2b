// `moefold serve`: loads a model, sizes the KV page pool and DeltaNet state slots, starts the
// engine thread and the HTTP server, and serves until SIGINT or SIGTERM.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/shard_plan.h"

namespace moefold::server {

struct ServeOptions {
  std::string model_dir;
  std::string served_model_name;  ///< "" = the model directory's basename
  std::string load_format = "auto";
  std::string device = "cpu";
  uint64_t seed = 0;  ///< dummy-weight seed
  std::string quantization;   ///< --quantization: "" / "none" or "fp8" (models/load_model.h)
  bool fp8_lm_head = false;   ///< --fp8-lm-head
  std::string host = "127.0.0.1";
  int port = 8000;  ///< 0 = any free port (printed at start)
  int32_t max_num_seqs = 32;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_prefill_chunk = 0;  ///< 0 = the whole budget
  int32_t max_model_len = 0;      ///< 0 = max_position_embeddings, capped by the KV pool
  int64_t kv_cache_memory = int64_t(1) << 30;  ///< bytes for KV pages (of kv_cache_dtype's elements)
  int32_t num_kv_blocks = 0;                   ///< overrides kv_cache_memory when > 0
  /// --kv-cache-dtype: auto | bfloat16 | fp8 | fp8_e4m3 (runtime/kv_cache.h); sizes the pages that
  /// kv_cache_memory holds (fp8: twice the tokens of bf16, four times the CPU's fp32).
  std::string kv_cache_dtype = "auto";
  int32_t block_size = 16;
  int32_t max_queue = 1024;  ///< waiting sequences before requests get 503
  int32_t max_n = 16;        ///< largest `n` accepted
  int32_t http_threads = 512;
  /// "auto": sampling defaults from the model's generation_config.json; "vllm": ignore the file.
  std::string generation_config = "auto";
  /// API key ("" = none); when empty, the MOEFOLD_API_KEY environment variable is used.
  std::string api_key;
  bool disable_metrics_auth = false;  ///< /metrics answers without the key
  std::string allowed_origins, allowed_methods = "*", allowed_headers = "*";  ///< CORS lists
  std::string allowed_hosts;  ///< Host allow-list ("" = any)
  double http_receive_timeout = 30;     ///< seconds from a request's first byte to its last
  double http_keep_alive_timeout = 5;   ///< seconds an idle connection stays open
  bool disable_log_requests = false;    ///< no per-request log lines
  bool enforce_eager = false;           ///< --device cuda: no CUDA graphs for decode steps
  std::vector<int32_t> cuda_graph_sizes;  ///< decode batch sizes captured as CUDA graphs (empty: default)
  bool batch_invariant = true;          ///< --device cuda: per-row results independent of the batch
  bool enable_prefix_caching = true;    ///< reuse cached prompt prefixes (runtime/prefix_cache.h)
  int64_t prefix_snapshot_memory = int64_t(1) << 30;  ///< bytes for DeltaNet state snapshots (hybrid models)
  int32_t prefix_snapshot_interval = 4096;  ///< a snapshot every this many prompt tokens (0: only prompt ends)
  /// --tool-call-parser: qwen3_coder | hermes; "" = the format the chat template shows (if any).
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;  ///< --enable-auto-tool-choice: tool_choice "auto" is parsed
  std::string reasoning_parser;          ///< --reasoning-parser: qwen3 | deepseek_r1 ("" = none)
  ParallelConfig parallel;               ///< --tensor-parallel-size, --enable-expert-parallel (CPU threads; CUDA: cuda_tp_executor.h)
};

/// Parses a byte count with an optional K/M/G/T suffix (powers of 1024), e.g. "512M".
/// Throws Error for anything else.
int64_t parse_bytes(const std::string& s);

/// Runs the server; returns the process exit code. Throws Error for a bad model directory or
/// inconsistent options (before anything is served).
int run_server(const ServeOptions& opt);

}  // namespace moefold::server
