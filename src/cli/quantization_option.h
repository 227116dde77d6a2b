// The weight-quantisation options every model-loading command shares (vLLM's names where it has them):
//   --quantization / -q  none | fp8: quantise bf16 / fp32 weights at load into 128 x 128 block-scaled FP8
//                        (an FP8 checkpoint is FP8 without it; docs/fp8.md)
//   --fp8-lm-head        also (or only) the lm_head, opt-in (it moves greedy outputs: docs/fp8.md, drift)
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace moefold {

/// Adds both options to `c`, writing into `quantization` ("", "none" or "fp8") and `fp8_lm_head`.
inline void add_quantization_options(CLI::App* c, std::string& quantization, bool& fp8_lm_head) {
  c->add_option("--quantization,-q", quantization,
                "fp8: quantise the weights at load into 128x128 block-scaled FP8 (an FP8 checkpoint needs no flag)")
      ->check(CLI::IsMember({"", "none", "fp8"}));
  c->add_flag("--fp8-lm-head", fp8_lm_head,
              "quantise the lm_head into 128x128 block-scaled FP8 at load (opt-in: see docs/fp8.md's drift report)");
}

}  // namespace moefold
