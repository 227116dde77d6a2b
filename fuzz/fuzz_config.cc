// libFuzzer target: config.json -> ModelConfig (io/model_config.h), then the derived sizes that
// `moefold inspect` prints. Input: the bytes of a config.json.
// Checked: no crash, no sanitizer finding, only moefold::Error, and a config that parses never yields a
// negative parameter, KV or state count.
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "io/model_config.h"
#include "models/weight_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  moefold::fuzz::expect_ok_or_error([&] {
    moefold::ModelConfig c = moefold::ModelConfig::from_json(j);
    if (c.kv_bytes_per_token(2) < 0 || c.deltanet_state_bytes_per_seq(2) < 0) std::abort();
    // count_params walks one spec per tensor; per-expert layouts at the bounds would have tens of
    // millions, which is a valid (slow) config, not a bug: count only moderate ones.
    if (c.num_layers * (c.num_experts + 8) <= 4096) {
      moefold::ParamCounts p = moefold::count_params(c);
      if (p.total <= 0 || p.active_per_token < 0 || p.routed_expert < 0 || p.embedding <= 0) std::abort();
    }
  });
  return 0;
}
