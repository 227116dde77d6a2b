#include "ops/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_block.h"
#include "ops/cpu/linear.h"

namespace moefold::cpu {

void router_topk(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize, int32_t* ids,
                 float* weights, const int32_t* replay) {
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    float m = -INFINITY;
    for (int64_t e = 0; e < E; ++e)
      if (!std::isnan(l[e])) m = std::max(m, l[e]);
    double denom = 0;
    for (int64_t e = 0; e < E; ++e) {
      p[size_t(e)] = std::isnan(l[e]) || std::isinf(m) ? 0.0f : std::exp(l[e] - m);
      denom += p[size_t(e)];
    }
    for (int64_t e = 0; e < E; ++e) p[size_t(e)] = denom > 0 ? float(p[size_t(e)] / denom) : 0.0f;
    if (replay) {
      for (int64_t s = 0; s < k; ++s) {
        const int32_t e = replay[t * k + s];
        if (e < 0 || e >= E) fail("router_topk: replayed expert id {} at row {} is outside [0, {})", e, t, E);
        order[size_t(s)] = e;
      }
    } else {
      // Ranking key: probability, NaN logits last, ties by lower index.
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        bool na = std::isnan(l[a]), nb = std::isnan(l[b]);
        if (na != nb) return nb;
        if (p[size_t(a)] != p[size_t(b)]) return p[size_t(a)] > p[size_t(b)];
        return a < b;
      });
    }
    double sum = 0;
    for (int64_t s = 0; s < k; ++s) sum += p[size_t(order[size_t(s)])];
    for (int64_t s = 0; s < k; ++s) {
      ids[t * k + s] = order[size_t(s)];
      float w = p[size_t(order[size_t(s)])];
      weights[t * k + s] = renormalize && sum > 0 ? float(w / sum) : w;
    }
  }
}

MoePlan moe_plan(const int32_t* ids, int64_t T, int64_t k, int64_t E) {
  MoePlan plan;
  plan.offsets.assign(size_t(E + 1), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    if (ids[i] < 0 || ids[i] >= E) fail("moe_plan: expert id {} at pair {} is outside [0, {})", ids[i], i, E);
    plan.offsets[size_t(ids[i] + 1)]++;
  }
  for (int64_t e = 0; e < E; ++e) plan.offsets[size_t(e + 1)] += plan.offsets[size_t(e)];
  plan.pairs.resize(size_t(T * k));
  std::vector<int32_t> fill(plan.offsets.begin(), plan.offsets.end() - 1);
  for (int64_t i = 0; i < T * k; ++i) plan.pairs[size_t(fill[size_t(ids[i])]++)] = int32_t(i);
  return plan;
}

void moe_experts(const float* x, const float* gate_up, const float* down, const int32_t* ids, const float* weights,
                 float* out, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, bool round_bf16, bool fp8_act) {
  auto rnd = [&](std::vector<float>& v) {
    if (round_bf16)
      for (auto& f : v) f = bf16_to_f32(f32_to_bf16(f));
  };
  MoePlan plan = moe_plan(ids, T, k, E);
  std::vector<float> y(static_cast<size_t>(T * k * H));  // expert output of each (row, slot) pair
  std::vector<float> xs, gu, act, ys;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = plan.offsets[size_t(e + 1)] - plan.offsets[size_t(e)];
    if (n == 0) continue;
    const int32_t* pairs = plan.pairs.data() + plan.offsets[size_t(e)];
    xs.resize(size_t(n * H));
    gu.resize(size_t(n * 2 * I));
    act.resize(size_t(n * I));
    ys.resize(size_t(n * H));
    for (int64_t r = 0; r < n; ++r) std::memcpy(&xs[size_t(r * H)], x + (pairs[r] / k) * H, size_t(H) * 4);
    if (fp8_act) fp8_fake_quantize_activations(xs.data(), n, H);
    linear(xs.data(), gate_up + e * 2 * I * H, nullptr, gu.data(), n, H, 2 * I);
    swiglu(gu.data(), act.data(), n, I);
    rnd(act);
    if (fp8_act) fp8_fake_quantize_activations(act.data(), n, I);
    linear(act.data(), down + e * H * I, nullptr, ys.data(), n, I, H);
    rnd(ys);
    for (int64_t r = 0; r < n; ++r) std::memcpy(&y[size_t(pairs[r]) * size_t(H)], &ys[size_t(r * H)], size_t(H) * 4);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < k; ++s) {
      const float w = weights[t * k + s];
      const float* ye = &y[size_t((t * k + s) * H)];
      for (int64_t h = 0; h < H; ++h) out[t * H + h] += w * ye[h];
    }
}

}  // namespace moefold::cpu
