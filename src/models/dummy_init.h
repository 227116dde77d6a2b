// Dummy (--load-format dummy) weight values: element i of a tensor is a pure function of (seed, tensor
// name, i), scaled per role, so any range of any tensor can be generated independently, on the host or
// on a GPU (src/ops/cuda/dummy_fill.cu), with bit-identical results.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MOEFOLD_HD __host__ __device__
#else
#define MOEFOLD_HD
#endif

namespace moefold {

/// A dummy tensor that has not been materialised: `seed` is the per-tensor state (the run's seed mixed
/// with the tensor's name) and every element is `scale * u(i)` with u uniform in [-1, 1).
struct DummyRecipe {
  uint64_t seed = 0;
  float scale = 0.0f;
};

MOEFOLD_HD inline uint64_t dummy_splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// u(i) in [-1, 1): the top 53 bits of splitmix64(seed + i * golden) as a double, rounded to float.
MOEFOLD_HD inline float dummy_uniform(uint64_t seed, int64_t i) {
  const uint64_t r = dummy_splitmix64(seed + uint64_t(i) * 0x9e3779b97f4a7c15ull);
  return float(double(r >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/// Element i of a recipe tensor (one fp32 multiply, so host and device agree bit for bit).
MOEFOLD_HD inline float dummy_value(const DummyRecipe& r, int64_t i) { return r.scale * dummy_uniform(r.seed, i); }

}  // namespace moefold
