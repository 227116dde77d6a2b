#include "ops/cpu/grouped_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace moefold::cpu {

namespace {

/// a ranks before b: larger value first, NaN last, then the lower index.
bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

}  // namespace

void grouped_topk(const float* logits, const float* bias, int64_t T, const GroupedRouting& r, int32_t* ids,
                  float* weights, const int32_t* replay) {
  const int64_t E = r.num_experts, G = r.n_group, k = r.top_k;
  MOEFOLD_CHECK(E > 0 && G > 0 && E % G == 0, "grouped routing: {} experts do not split into {} groups", E, G);
  const int64_t per = E / G;
  MOEFOLD_CHECK(per >= 2, "grouped routing: groups of {} expert(s); the group score needs at least 2", per);
  MOEFOLD_CHECK(r.topk_group >= 1 && r.topk_group <= G, "grouped routing: topk_group {} is outside [1, {}]",
                r.topk_group, G);
  MOEFOLD_CHECK(k >= 1 && k <= r.topk_group * per, "grouped routing: top_k {} exceeds the {} experts of {} groups", k,
                r.topk_group * per, r.topk_group);
  std::vector<float> s(static_cast<size_t>(E)), c(static_cast<size_t>(E)), gscore(static_cast<size_t>(G));
  std::vector<int64_t> order(static_cast<size_t>(std::max(E, G)));
  std::vector<bool> kept(static_cast<size_t>(G));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      s[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[t * E + e]));
      c[size_t(e)] = s[size_t(e)] + (bias ? bias[e] : 0.0f);
    }
    int32_t* id = ids + t * k;
    if (replay) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = replay[t * k + j];
        MOEFOLD_CHECK(e >= 0 && e < E, "routing replay: expert id {} outside [0, {})", e, E);
        id[j] = e;
      }
    } else {
      // Group score: the sum of the two largest c in the group.
      for (int64_t g = 0; g < G; ++g) {
        float a = -INFINITY, b = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          const float v = c[size_t(e)];
          if (ranks_before(v, e, a, E)) {
            b = a;
            a = v;
          } else if (ranks_before(v, e, b, E)) {
            b = v;
          }
        }
        gscore[size_t(g)] = a + b;
      }
      std::iota(order.begin(), order.begin() + G, 0);
      std::partial_sort(order.begin(), order.begin() + r.topk_group, order.begin() + G, [&](int64_t x, int64_t y) {
        return ranks_before(gscore[size_t(x)], x, gscore[size_t(y)], y);
      });
      std::fill(kept.begin(), kept.end(), false);
      for (int64_t j = 0; j < r.topk_group; ++j) kept[size_t(order[size_t(j)])] = true;
      // Top-k of c among the experts of the kept groups only.
      int64_t n = 0;
      for (int64_t e = 0; e < E; ++e)
        if (kept[size_t(e / per)]) order[size_t(n++)] = e;
      std::partial_sort(order.begin(), order.begin() + k, order.begin() + n, [&](int64_t x, int64_t y) {
        return ranks_before(c[size_t(x)], x, c[size_t(y)], y);
      });
      for (int64_t j = 0; j < k; ++j) id[j] = int32_t(order[size_t(j)]);
    }
    float* w = weights + t * k;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = s[size_t(id[j])];
      sum += w[j];
    }
    const float denom = r.renormalize ? float(sum) + 1e-20f : 1.0f;
    for (int64_t j = 0; j < k; ++j) w[j] = w[j] / denom * r.routed_scaling_factor;
  }
}

}  // namespace moefold::cpu
