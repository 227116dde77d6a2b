// Shared helpers of the sampling_test binary (tests/cuda/sampling_test/*.cc, one GoogleTest binary of
// several files: selection_test.cc, row_kernels_test.cc, device_sampler_test.cc, perf_test.cc).
//
// Contract tests of the GPU token selection against the CPU sampler (runtime/sampler.h), which
// defines the semantics: greedy argmax must match exactly (ties -> lower id, NaN never chosen and
// flagged); sampled selection (temperature, min_p, top_k, top_p, inverse CDF with the host's
// uniform u = sampling_uniform(seed, step)) is compared draw by draw with sample_token() on the
// same u (logits quantised to create many ties), and its distribution with sampling_distribution()
// through 4096 stratified draws. Padding rows are left untouched.
// The kernels around the selection are checked against their CPU counterparts: mask_logits_rows vs
// mask_tokens and apply_penalties_rows vs apply_penalties (bytes), raw_logprobs_rows vs the CPU's
// log-sum-exp and top_logprobs (1e-5, same ids); the whole DeviceSampler vs Sampler::sample on the
// masked rows with every option, histories and failing rows (tokens equal: 0 mismatches allowed);
// and its token frequencies over seeded draws vs sampling_distribution (5-sigma binomial bounds,
// fixed seeds) for toy distributions (V = 5, 12, 50) and the real V = 248,320 with a peaked head.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/sampling.h"
#include "models/cuda/device_sampler.h"
#include "runtime/sampler.h"

namespace sampling_test {

// NOLINTBEGIN(google-build-using-namespace): the test code names the engine and test helpers unqualified
using namespace moefold;
using namespace moefold::test;
// NOLINTEND(google-build-using-namespace)
namespace cu = moefold::cuda;

inline void sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

/// The cluster kernel with only tokens / flags (and the sampling parameters when sp is given).
inline void cluster_select(float* x, int64_t R, int64_t V, const cu::SampleRowParams* sp, int32_t* tokens, int32_t* flags,
                    const int32_t* live) {
  cu::ClusterSampleArgs a;
  if (sp) a.sample = *sp;
  a.tokens = tokens;
  a.flags = flags;
  cu::sample_rows_cluster(x, R, V, 0, a, live, nullptr);
}

/// Logits ~ N(0, 2^2) quantised to multiples of 1/16 (ties everywhere), rows [R, V].
inline std::vector<float> make_logits(int64_t R, int64_t V, uint64_t seed) {
  auto v = randn(size_t(R * V), seed, 2.0f);
  for (float& x : v) x = std::round(x * 16.0f) / 16.0f;
  return v;
}

inline SamplingParams row_params(uint64_t h) {
  SamplingParams p;
  const float temps[] = {0.0f, 0.5f, 0.8f, 1.0f, 1.3f};
  const int32_t ks[] = {0, 1, 2, 20, 50, 0, 1000};
  const float ps[] = {1.0f, 0.95f, 0.8f, 0.5f, 1.0f, 0.1f};
  const float mps[] = {0.0f, 0.0f, 0.05f, 0.0f};
  p.temperature = temps[h % 5];
  p.top_k = ks[(h / 5) % 7];
  p.top_p = ps[(h / 35) % 6];
  p.min_p = mps[(h / 210) % 4];
  return p;
}

/// Logits ~ N(0, 1.5^2) rounded to 1/8 (ties), with a few -inf entries.
inline std::vector<float> make_rows(int64_t R, int64_t V, uint64_t seed) {
  auto v = randn(size_t(R * V), seed, 1.5f);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::round(v[i] * 8.0f) / 8.0f;
    if (mix64(seed ^ (i * 0x9E37ull)) % 997 == 0) v[i] = -INFINITY;
  }
  return v;
}

/// n ids uniform in [0, V).
inline std::vector<int32_t> random_history(int64_t V, size_t n, uint64_t seed) {
  std::vector<int32_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = int32_t(mix64(seed * 0x9E37ull + i) % uint64_t(V));
  return h;
}

inline bool same_bytes(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// Random penalty parameters of one row (every penalty alone and together, negative ones too).
inline SamplingParams penalty_params(uint64_t h) {
  SamplingParams p;
  const float reps[] = {1.0f, 1.3f, 0.7f, 1.0f, 2.0f};
  const float freqs[] = {0.0f, 0.5f, -0.3f, 0.0f};
  const float pres[] = {0.0f, 0.0f, 0.8f, -0.5f};
  p.repetition_penalty = reps[h % 5];
  p.frequency_penalty = freqs[(h / 5) % 4];
  p.presence_penalty = pres[(h / 20) % 4];
  return p;
}

/// A history of n ids: half among the row's 30 largest logits (so that penalties matter), with repeats.
inline std::vector<int32_t> make_history(const float* row, int64_t V, size_t n, uint64_t seed) {
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) order[size_t(i)] = int32_t(i);
  const size_t k = std::min<size_t>(30, size_t(V));
  std::partial_sort(order.begin(), order.begin() + long(k), order.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  std::vector<int32_t> h(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t z = mix64(seed + i);
    h[i] = z % 2 ? order[(z >> 8) % k] : int32_t((z >> 8) % uint64_t(V));
  }
  return h;
}

/// DeviceSampler vs the CPU sampler on the same masked rows, histories and (seed, step) (device_sampler_test.cc).
void check_device_sampler(int64_t R, int64_t V, int calls, uint64_t seed, bool cluster = true);

}  // namespace sampling_test
