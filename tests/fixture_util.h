// Where the per-family reference fixtures live (tests/fixtures/<family>, made by
// scripts/make_fixtures.py), which families have one, their reference.json, and the batched greedy
// decode the CPU and GPU fixture tests both run.
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/model_runner.h"

namespace moefold::test {

inline const std::filesystem::path kFixtures = std::filesystem::path(MOEFOLD_SOURCE_DIR) / "tests" / "fixtures";

/// Sorted names of the fixture directories that hold a reference.json.
inline std::vector<std::string> fixture_families() {
  std::vector<std::string> out;
  if (std::filesystem::exists(kFixtures))
    for (auto& e : std::filesystem::directory_iterator(kFixtures))
      if (std::filesystem::exists(e.path() / "reference.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// tests/fixtures/<fam>/reference.json.
inline nlohmann::json fixture_reference(const std::string& fam) {
  std::ifstream f(kFixtures / fam / "reference.json");
  return nlohmann::json::parse(f);
}

/// The lowest index of the largest of v[0 .. n).
inline int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

/// Prompts `which` (indices into `prompts`) prefilled together in one step on `r`, then `steps` greedy
/// tokens each, all sequences in every step. Returns the tokens per prompt index. V: vocabulary size.
inline std::map<size_t, std::vector<int32_t>> greedy_together(ModelRunner& r,
                                                             const std::vector<std::vector<int32_t>>& prompts,
                                                             const std::vector<size_t>& which, int steps, int64_t V) {
  std::map<size_t, std::vector<int32_t>> out;
  std::map<size_t, int32_t> sid;
  std::vector<ModelRunner::Work> work;
  for (size_t i : which) {
    sid[i] = r.add_sequence(prompts[i]);
    work.push_back({sid[i], int32_t(prompts[i].size()), false});
  }
  for (int g = 0; g < steps; ++g) {
    auto logits = r.step(work);
    work.clear();
    for (size_t k = 0; k < which.size(); ++k) {
      out[which[k]].push_back(argmax(logits[k].data(), V));
      r.append_token(sid[which[k]], out[which[k]].back());
      work.push_back({sid[which[k]], 1, false});
    }
  }
  return out;
}

}  // namespace moefold::test
