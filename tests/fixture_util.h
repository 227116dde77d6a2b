// Where the checkout and its per-family reference fixtures live (tests/fixtures/<family>, made by
// scripts/make_fixtures.py), which families have one, their reference.json, and the batched greedy
// decode the CPU and GPU fixture tests both run.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/model_runner.h"

namespace moefold::test {

/// The root of the moefold checkout that the tests run from, found at run time so that a test binary
/// works wherever the tree sits (carried to the GPU machine, a clone at another path): the directory
/// in $MOEFOLD_SOURCE_DIR if set, else the nearest directory holding tests/fixture_util.h above the
/// executable (/proc/self/exe), else above the current directory. CTest runs the tests from the
/// source root, so out-of-tree build folders work too. Runs during static initialisation, where an
/// exception would end the binary without a word: when no checkout is found it prints what it tried
/// and exits with status 2.
inline std::filesystem::path find_source_dir() {
  namespace fs = std::filesystem;
  auto is_root = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p / "tests" / "fixture_util.h", ec);
  };
  auto walk_up = [&](fs::path p) -> fs::path {
    for (; !p.empty(); p = p.parent_path()) {
      if (is_root(p)) return p;
      if (p == p.parent_path()) break;
    }
    return {};
  };
  if (const char* env = std::getenv("MOEFOLD_SOURCE_DIR"); env && *env) {
    if (is_root(env)) return fs::absolute(env);
    std::fprintf(stderr, "MOEFOLD_SOURCE_DIR=%s is not a moefold checkout (it has no tests/fixture_util.h)\n", env);
    std::exit(2);
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    if (fs::path p = walk_up(exe.parent_path()); !p.empty()) return p;
  const fs::path cwd = fs::current_path(ec);
  if (!ec)
    if (fs::path p = walk_up(cwd); !p.empty()) return p;
  std::fprintf(stderr,
               "cannot find the moefold checkout (a folder with tests/fixture_util.h) above %s or %s: run the "
               "test from inside the checkout or set MOEFOLD_SOURCE_DIR to it\n",
               exe.c_str(), cwd.c_str());
  std::exit(2);
}

/// The checkout's root (find_source_dir, once per binary).
inline const std::filesystem::path kSourceDir = find_source_dir();
/// tests/fixtures of that checkout.
inline const std::filesystem::path kFixtures = kSourceDir / "tests" / "fixtures";

/// Sorted names of the fixture directories that hold a reference.json.
inline std::vector<std::string> fixture_families() {
  std::vector<std::string> out;
  if (std::filesystem::exists(kFixtures))
    for (auto& e : std::filesystem::directory_iterator(kFixtures))
      if (std::filesystem::exists(e.path() / "reference.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// The fixture families the CUDA executor runs (DeepSeek-V3.2's MLA + indexer is CPU-only so far).
inline std::vector<std::string> gpu_fixture_families() {
  std::vector<std::string> out;
  for (auto& f : fixture_families())
    if (f != "deepseek_v32") out.push_back(f);
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
