// Shared helpers for contract tests: seeded random inputs (never zeros), poisoned outputs, and the
// relative error ||out - ref|| / ||ref|| that every kernel check uses (NaN never passes).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace moefold::test {

inline std::vector<float> randn(size_t n, uint64_t seed, float std = 1.0f, float mean = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(mean, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// A buffer full of NaN, so that any element a kernel fails to write shows up in the error.
inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

/// ||out - ref||_2 / ||ref||_2 in double; +inf if any output is NaN/inf or the sizes differ.
template <class A, class B>
double rel_err(const A& out, const B& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    double o = double(out[i]), r = double(ref[i]);
    if (!std::isfinite(o)) return INFINITY;
    num += (o - r) * (o - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace moefold::test
