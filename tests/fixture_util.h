// Where the per-family reference fixtures live (tests/fixtures/<family>, made by
// scripts/make_fixtures.py) and which families have one.
#pragma once
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

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

}  // namespace moefold::test
