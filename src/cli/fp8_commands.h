// `moefold probe` and `moefold drift`: FP8 accuracy tools (docs/fp8.md).
//   probe: stage probes of one MoE layer with FP8 experts against the ideal quantised chain (after the
//          expert GEMMs, per slot, after the combine, the layer output) and the whole forward (logits
//          against the CPU's fp32 chain over the same FP8 weights, and against the unquantised model
//          when --quantization fp8 quantised it).
//   drift: N prompts decoded greedily under two configurations (--a-* / --b-*: quantization, device,
//          KV cache dtype):
//          how many outputs match, where the first divergence falls, and config A's top-2 margin there;
//          plus both configurations' perplexity over the prompts (teacher-forced).
//   perplexity: teacher-forced perplexity of a real text (--text-file in windows, or --prompts-file)
//          under A and B, with KL(A || B) per token and top-1 agreement; --attribution kinds|layers adds
//          one B run per group of tensors with only that group in FP8 (where the loss comes from).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

namespace moefold {

struct Fp8Commands {
  CLI::App* probe = nullptr;
  CLI::App* drift = nullptr;
  CLI::App* perplexity = nullptr;
  std::string model_dir, device = "cpu", quantization = "fp8", prompt, prompt_ids, json_out, prompts_file;
  int layer = -1;
  bool probe_fp8_act = false;  ///< probe --fp8-activations: the W8A8 chain under test (CPU emulation / GPU prefill experts)
  // drift
  std::string a_quant = "none", b_quant = "fp8", a_device = "cpu", b_device = "cpu";
  bool a_lm_head = false, b_lm_head = false;  ///< --a-fp8-lm-head / --b-fp8-lm-head
  std::string a_kv = "auto", b_kv = "auto";   ///< --a-kv-cache-dtype / --b-kv-cache-dtype
  std::string b_only;  ///< --b-fp8-only: B quantises only the tensors whose name contains it (CPU)
  int num_prompts = 30, max_tokens = 32, prompt_len = 16;
  bool with_answers = false;
  bool b_act = false;  ///< --b-fp8-activations: B's FP8 projections see 1 x 128 FP8 activations (CPU)
  bool b_expert_act = false;  ///< --b-fp8-expert-activations: only B's routed experts do (CPU; the GPU's prefill)
  std::string text_file, attribution;  ///< perplexity: --text-file, --attribution (kinds | layers)
  int max_len = 512;                   ///< perplexity: tokens per --text-file window
  uint64_t seed = 0;
  /// Runs whichever subcommand was parsed; prints its report (and writes JSON with --json). Returns the
  /// exit code. Throws moefold::Error.
  int run();
};

/// Adds `probe` and `drift` to `app`. The returned object must live until parsing and run() are done.
std::unique_ptr<Fp8Commands> add_fp8_commands(CLI::App& app);

}  // namespace moefold
