// Opens a model directory: config.json, then weights from its safetensors files or, with
// LoadFormat::Dummy, seeded random weights in the layout the config describes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "models/model.h"
#include "models/weight_loader.h"

namespace moefold {

enum class LoadFormat { Safetensors, Dummy };

/// Parses "safetensors"/"auto" or "dummy"; throws Error otherwise.
LoadFormat parse_load_format(const std::string& s);

/// --quantization (vLLM's flag): None keeps the checkpoint's weights (an FP8 checkpoint stays FP8);
/// Fp8 quantises bf16 / fp32 weights at load into 128 x 128 block-scaled FP8 (models/weight_loader.h).
enum class Quantization { None, Fp8 };
/// Parses "" / "none" or "fp8"; throws Error otherwise.
Quantization parse_quantization(const std::string& s);

/// The weight source for `dir`: its checkpoint or dummy weights (`defer`: see dummy_source), wrapped in
/// fp8_quantizing_source for Quantization::Fp8 and/or `fp8_lm_head` (--fp8-lm-head: the lm_head
/// quantised to 128 x 128 block-scaled FP8 at load; opt-in, docs/fp8.md has its drift report).
std::unique_ptr<WeightSource> make_weight_source(const std::string& dir, const ModelConfig& cfg, LoadFormat format,
                                                 uint64_t seed, Quantization quant, bool defer = false,
                                                 bool fp8_lm_head = false);

/// Loads the model in `dir` (fp32 on the host; FP8 weights dequantised exactly, their FP8 form kept in
/// Param::fp8). Throws Error (naming the file/tensor) on any problem.
std::unique_ptr<Model> load_model(const std::string& dir, LoadFormat format, uint64_t seed = 0,
                                  Quantization quant = Quantization::None, bool fp8_lm_head = false);

}  // namespace moefold
