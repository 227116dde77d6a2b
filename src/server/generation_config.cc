// generation_config.json sampling defaults (contract: generation_config.h).
#include "server/generation_config.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "runtime/sampling_params.h"

namespace moefold::server {

std::string SamplingDefaults::describe() const {
  std::string s;
  auto add = [&](const char* name, const std::string& v) { s += (s.empty() ? "" : " ") + std::string(name) + "=" + v; };
  if (temperature) add("temperature", fmt::format("{}", *temperature));
  if (top_p) add("top_p", fmt::format("{}", *top_p));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (min_p) add("min_p", fmt::format("{}", *min_p));
  if (repetition_penalty) add("repetition_penalty", fmt::format("{}", *repetition_penalty));
  return s;
}

SamplingDefaults load_generation_config(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "generation_config.json";
  SamplingDefaults d;
  if (!std::filesystem::exists(path)) return d;
  std::ifstream in(path);
  if (!in) fail("{}: cannot read", path.string());
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
  if (!j.is_object()) fail("{}: expected a JSON object", path.string());
  auto number = [&](const char* name) -> std::optional<float> {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) fail("{}: '{}' must be a number", path.string(), name);
    return float(it->get<double>());
  };
  d.temperature = number("temperature");
  d.top_p = number("top_p");
  d.min_p = number("min_p");
  d.repetition_penalty = number("repetition_penalty");
  if (auto k = number("top_k")) {
    if (*k != std::floor(*k) || *k < -1 || *k > float(std::numeric_limits<int32_t>::max()))
      fail("{}: 'top_k' must be an integer >= -1, got {}", path.string(), *k);
    d.top_k = int32_t(*k);
  }
  SamplingParams p;
  if (d.temperature) p.temperature = *d.temperature;
  if (d.top_p) p.top_p = *d.top_p;
  if (d.top_k) p.top_k = *d.top_k;
  if (d.min_p) p.min_p = *d.min_p;
  if (d.repetition_penalty) p.repetition_penalty = *d.repetition_penalty;
  try {
    p.validate();
  } catch (const Error& e) {
    fail("{}: {}", path.string(), e.what());
  }
  return d;
}

}  // namespace moefold::server
