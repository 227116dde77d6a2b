#include "models/load_model.h"

#include "core/error.h"
#include "models/weight_loader.h"

namespace moefold {

LoadFormat parse_load_format(const std::string& s) {
  if (s == "safetensors" || s == "auto") return LoadFormat::Safetensors;
  if (s == "dummy") return LoadFormat::Dummy;
  fail("unknown --load-format '{}' (expected auto, safetensors or dummy)", s);
}

std::unique_ptr<Model> load_model(const std::string& dir, LoadFormat format, uint64_t seed) {
  ModelConfig cfg = ModelConfig::from_dir(dir);
  std::unique_ptr<WeightSource> src = format == LoadFormat::Dummy
                                          ? dummy_source(seed, cfg.family == Family::Qwen3_5Moe)
                                          : checkpoint_source(dir);
  ModelWeights w = load_weights(cfg, *src);
  return std::make_unique<Model>(std::move(cfg), std::move(w));
}

}  // namespace moefold
