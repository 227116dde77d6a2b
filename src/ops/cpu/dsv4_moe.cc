#include "ops/cpu/dsv4_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/cpu/linear.h"

namespace moefold::cpu {

void dsv4_route(const float* logits, const float* bias, const int32_t* hash_ids, int64_t T, int64_t E, int64_t k,
                float scale, const std::string& scoring, int32_t* idx, float* weight) {
  const bool sqrtsp = scoring == "sqrtsoftplus";
  std::vector<float> s(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const float x = logits[t * E + e];
      // softplus as torch computes it (linear above 20), then sqrt.
      s[size_t(e)] = sqrtsp ? std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x))) : sigmoid(x);
    }
    int32_t* id = idx + t * k;
    if (hash_ids) {
      for (int64_t j = 0; j < k; ++j) {
        id[j] = hash_ids[t * k + j];
        if (id[j] < 0 || id[j] >= E) fail("tid2eid: expert id {} is outside [0, {})", id[j], E);
      }
    } else {
      std::iota(order.begin(), order.end(), 0);
      auto key = [&](int32_t e) { return s[size_t(e)] + (bias ? bias[e] : 0.0f); };
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return key(a) > key(b) || (key(a) == key(b) && a < b); });
      std::copy_n(order.begin(), k, id);
    }
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[size_t(id[j])];
    for (int64_t j = 0; j < k; ++j) weight[t * k + j] = s[size_t(id[j])] / (sum + 1e-20f) * scale;
  }
}

void clamped_swiglu(const float* gate_up, float* y, int64_t T, int64_t I, float limit) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      float g = gate_up[t * 2 * I + i], u = gate_up[t * 2 * I + I + i];
      if (limit > 0) {
        g = std::min(g, limit);
        u = std::clamp(u, -limit, limit);
      }
      y[t * I + i] = silu(g) * u;
    }
}

}  // namespace moefold::cpu
