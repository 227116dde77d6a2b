// Opens a model directory: config.json, then weights from its safetensors files or, with
// LoadFormat::Dummy, seeded random weights in the layout the config describes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "models/model.h"

namespace moefold {

enum class LoadFormat { Safetensors, Dummy };

/// Parses "safetensors"/"auto" or "dummy"; throws Error otherwise.
LoadFormat parse_load_format(const std::string& s);

/// Loads the model in `dir`. Throws Error (naming the file/tensor) on any problem.
std::unique_ptr<Model> load_model(const std::string& dir, LoadFormat format, uint64_t seed = 0);

}  // namespace moefold
