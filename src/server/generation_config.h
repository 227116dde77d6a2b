// The server's default sampling parameters from a checkpoint's generation_config.json, as vLLM's
// `--generation-config auto` does: the fields temperature, top_p, top_k, min_p and
// repetition_penalty that the file sets become the defaults of every request, and a request's own
// fields override them. `--generation-config vllm` ignores the file (SamplingParams' defaults).
#pragma once
#include <optional>
#include <string>

namespace moefold::server {

/// Per-field sampling defaults; nullopt: SamplingParams' own default applies.
struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;

  bool empty() const { return !temperature && !top_p && !top_k && !min_p && !repetition_penalty; }
  /// E.g. "temperature=0.7 top_p=0.8 top_k=20" (only the fields set).
  std::string describe() const;
};

/// Reads `<model_dir>/generation_config.json`. A missing file gives no defaults; fields other than
/// the five above are ignored, as are null values. Throws moefold::Error for a file that is not a
/// JSON object, a field of the wrong type, or a value SamplingParams::validate() rejects (the
/// message names the file and the field), so a bad checkpoint fails at start-up, not per request.
SamplingDefaults load_generation_config(const std::string& model_dir);

}  // namespace moefold::server
