#include "models/load_model.h"

#include "core/error.h"
#include "models/memory_check.h"
#include "models/weight_loader.h"

namespace moefold {

LoadFormat parse_load_format(const std::string& s) {
  if (s == "safetensors" || s == "auto") return LoadFormat::Safetensors;
  if (s == "dummy") return LoadFormat::Dummy;
  fail("unknown --load-format '{}' (expected auto, safetensors or dummy)", s);
}

Quantization parse_quantization(const std::string& s) {
  if (s.empty() || s == "none") return Quantization::None;
  if (s == "fp8") return Quantization::Fp8;
  fail("unknown --quantization '{}' (expected fp8 or none)", s);
}

std::unique_ptr<WeightSource> make_weight_source(const std::string& dir, const ModelConfig& cfg, LoadFormat format,
                                                 uint64_t seed, Quantization quant, bool defer, bool fp8_lm_head) {
  std::unique_ptr<WeightSource> src = format == LoadFormat::Dummy
                                          ? dummy_source(seed, cfg.family == Family::Qwen3_5Moe, defer)
                                          : checkpoint_source(dir);
  if (quant == Quantization::Fp8 || fp8_lm_head)
    src = fp8_quantizing_source(std::move(src), quant == Quantization::Fp8, fp8_lm_head);
  return src;
}

std::unique_ptr<Model> load_model(const std::string& dir, LoadFormat format, uint64_t seed, Quantization quant,
                                  bool fp8_lm_head) {
  ModelConfig cfg = ModelConfig::from_dir(dir);
  if (cfg.family == Family::DeepseekV4)
    fail("model '{}' is deepseek_v4: it runs through load_deepseek_v4 (models/deepseek_v4.h), not the generic "
         "Model", dir);
  // Both sources materialise every tensor in fp32 on the host: refuse before allocating any of it.
  check_memory_fits(cpu_weight_bytes(cfg), available_memory_bytes(),
                    fmt::format("model '{}' ({} fp32 weights)", dir, family_name(cfg.family)),
                    /*gpu_runs_it=*/!cfg.mla.enabled());
  std::unique_ptr<WeightSource> src = make_weight_source(dir, cfg, format, seed, quant, false, fp8_lm_head);
  ModelWeights w = load_weights(cfg, *src);
  return std::make_unique<Model>(std::move(cfg), std::move(w));
}

}  // namespace moefold
