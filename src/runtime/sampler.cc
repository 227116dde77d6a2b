// CPU reference token sampler. The contract (order of steps, tie-breaking, the random draw) is
// specified in sampler.h; this file implements exactly that.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "core/profiler.h"

namespace moefold {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// Max and argmax (lower id on ties) of a logit row that was checked for NaN / +inf.
struct RowMax {
  float value;
  int32_t index;
};

/// Throws for an empty row, NaN, +inf, or a row with no finite entry; returns max / argmax.
/// `what` names the row in the message ("logits" or "penalized logits").
RowMax scan_row(std::span<const float> x, const char* what) {
  if (x.empty()) fail("sampler: empty {} row (vocabulary size 0).", what);
  if (x.size() > size_t(std::numeric_limits<int32_t>::max()))
    fail("sampler: vocabulary of {} entries exceeds the int32 token id range.", x.size());
  float best = -kInf;
  int32_t arg = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    if (std::isnan(v)) fail("sampler: {} contain NaN (first at token {}).", what, i);
    if (v == kInf) fail("sampler: {} contain +inf (first at token {}).", what, i);
    if (v > best) {  // strict: the lower id wins ties
      best = v;
      arg = int32_t(i);
    }
  }
  if (arg < 0) fail("sampler: all {} are -inf; no token can be sampled.", what);
  return {best, arg};
}

/// log(sum_i exp(x_i)) in double, given the row's maximum (finite).
double log_sum_exp(std::span<const float> x, float xmax) {
  const double m = xmax;
  double s = 0.0;
  for (float v : x) s += std::exp(double(v) - m);  // exp(-inf) = 0
  return m + std::log(s);
}

/// The n best (logit desc, id asc) entries of x, as log-probabilities given lse.
std::vector<TokenLogprob> top_n(std::span<const float> x, size_t n, double lse) {
  n = std::min(n, x.size());
  std::vector<TokenLogprob> out;
  if (n == 0) return out;
  // Sorted buffer of (logit, id), best first. Scanning ids in ascending order means a later
  // token only displaces an entry with a strictly smaller logit.
  std::vector<std::pair<float, int32_t>> buf;
  buf.reserve(n + 1);
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    if (buf.size() == n && !(v > buf.back().first)) continue;
    size_t pos = buf.size();
    while (pos > 0 && v > buf[pos - 1].first) --pos;
    buf.insert(buf.begin() + pos, {v, int32_t(i)});
    if (buf.size() > n) buf.pop_back();
  }
  out.reserve(n);
  for (const auto& [v, id] : buf) out.push_back({id, float(double(v) - lse)});
  return out;
}

/// One token that survived truncation, with its unnormalized weight w = exp((x - max) / T).
struct Cand {
  float x;
  int32_t id;
  double w;
};

/// Ordering used by top_k / top_p: larger logit first, lower id first among equal logits.
inline bool better(const Cand& a, const Cand& b) {
  return a.x > b.x || (a.x == b.x && a.id < b.id);
}

/// Steps 4-7 of sampler.h: the surviving tokens in ascending id order, with their weights.
/// No step reorders the output, so no sort by id is needed; top_k and top_p find a boundary
/// element and then filter in id order.
std::vector<Cand> survivors(std::span<const float> x, float xmax, const SamplingParams& p) {
  const double xm = xmax, t = p.temperature;
  // Step 5 (min_p): w_i >= min_p  <=>  (x_i - max) / T >= ln(min_p); evaluated in logit space
  // so that truncation needs no exp.
  const bool use_min_p = p.min_p > 0.0f;
  const double log_min_p = use_min_p ? std::log(double(p.min_p)) : 0.0;
  auto alive = [&](float v) {
    return v != -kInf && (!use_min_p || (double(v) - xm) / t >= log_min_p);
  };

  // Step 6 (top_k): vk = k-th largest surviving logit (counted with multiplicity) via a size-k
  // min-heap; tokens above vk are kept, and of those equal to vk the lowest ids up to k in all.
  bool use_top_k = false;
  float vk = 0.0f;
  size_t ties_left = 0;
  if (p.top_k > 0 && size_t(p.top_k) < x.size()) {
    const size_t k = size_t(p.top_k);
    std::vector<float> heap;
    heap.reserve(k);
    size_t n_alive = 0;
    for (float v : x) {
      if (!alive(v)) continue;
      ++n_alive;
      if (heap.size() < k) {
        heap.push_back(v);
        std::push_heap(heap.begin(), heap.end(), std::greater<float>());
      } else if (v > heap.front()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
        heap.back() = v;
        std::push_heap(heap.begin(), heap.end(), std::greater<float>());
      }
    }
    if (n_alive > k) {
      use_top_k = true;
      vk = heap.front();
      ties_left = size_t(std::count(heap.begin(), heap.end(), vk));
    }
  }

  // Step 4 for the survivors of steps 5-6, in ascending id order.
  std::vector<Cand> c;
  c.reserve(use_top_k ? size_t(p.top_k) : x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    if (!alive(v)) continue;
    if (use_top_k) {
      if (v < vk) continue;
      if (v == vk) {
        if (ties_left == 0) continue;
        --ties_left;
      }
    }
    c.push_back({v, int32_t(i), std::exp((double(v) - xm) / t)});
  }

  // Step 7 (top_p): find the boundary token (the one whose cumulative probability, in `better`
  // order, first reaches top_p) by a mass-guided quickselect on a scratch copy: halve the
  // unresolved range [lo, hi) with nth_element (everything before lo is better and already
  // counted in `acc` < target) and sort only the last <= 64 entries. Expected O(n). Then keep,
  // in id order, every token that is not worse than the boundary.
  if (p.top_p < 1.0f && c.size() > 1) {
    double z = 0.0;
    for (const Cand& e : c) z += e.w;
    const double target = double(p.top_p) * z;
    // Prefilter: the tokens with w >= tau form a prefix of the `better` order (w is monotone in
    // x). If their mass already reaches the target, the boundary lies among them. tau is set so
    // that the tail below it weighs at most half of what top_p discards.
    const double tau = 0.5 * (z - target) / double(c.size());
    std::vector<Cand> s;
    double head = 0.0;
    for (const Cand& e : c)
      if (e.w >= tau) head += e.w;
    if (head >= target) {
      for (const Cand& e : c)
        if (e.w >= tau) s.push_back(e);
    } else {
      s = c;
    }
    size_t lo = 0, hi = s.size();
    double acc = 0.0;
    while (hi - lo > 64) {
      const size_t mid = lo + (hi - lo) / 2;
      std::nth_element(s.begin() + lo, s.begin() + mid, s.begin() + hi, better);
      double upper = 0.0;
      for (size_t i = lo; i < mid; ++i) upper += s[i].w;
      if (acc + upper >= target) {
        hi = mid;  // the crossing token is in [lo, mid)
      } else {
        acc += upper;
        lo = mid;
      }
    }
    std::sort(s.begin() + lo, s.begin() + hi, better);
    size_t last = hi - 1;  // kept if rounding never lets acc reach target: the whole range
    for (size_t i = lo; i < hi; ++i) {
      acc += s[i].w;
      if (acc >= target) {
        last = i;
        break;
      }
    }
    const Cand boundary = s[last];
    c.erase(std::remove_if(c.begin(), c.end(), [&](const Cand& e) { return better(boundary, e); }),
            c.end());
  }
  return c;
}

/// Penalized logits (a copy only when some penalty is active) and their max / argmax.
struct Prepared {
  std::vector<float> buf;
  std::span<const float> x;
  RowMax max;
};

bool penalties_active(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

Prepared prepare(std::span<const float> logits, RowMax raw_max, std::span<const int32_t> prompt,
                 std::span<const int32_t> output, const SamplingParams& p) {
  Prepared r;
  r.x = logits;
  r.max = raw_max;
  if (penalties_active(p)) {
    r.buf.assign(logits.begin(), logits.end());
    apply_penalties(r.buf, prompt, output, p);
    r.x = r.buf;
    // A tiny repetition_penalty can overflow a positive logit to +inf; report it, don't sample.
    r.max = scan_row(r.x, "penalized logits");
  }
  return r;
}

}  // namespace

void mask_tokens(std::span<float> logits, std::span<const int32_t> ids) {
  for (int32_t id : ids)
    if (id >= 0 && size_t(id) < logits.size()) logits[size_t(id)] = -std::numeric_limits<float>::infinity();
}

void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> mask) {
  const int64_t V = int64_t(logits.size());
  MOEFOLD_CHECK(int64_t(mask.size()) == bitmask_words(V), "token bitmask has {} words for a vocabulary of {} ({} expected)",
                mask.size(), V, bitmask_words(V));
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t w = 0; w < int64_t(mask.size()); ++w) {
    const uint32_t bits = mask[size_t(w)];
    if (bits == ~0u) continue;
    const int64_t base = w * 32, end = std::min<int64_t>(base + 32, V);
    if (bits == 0u) {
      std::fill(logits.begin() + base, logits.begin() + end, ninf);
      continue;
    }
    float* x = logits.data() + base;
    for (int64_t b = 0; b < end - base; ++b) x[b] = ((bits >> b) & 1u) ? x[b] : ninf;  // branch-free select
  }
}

uint64_t splitmix64_at(uint64_t seed, uint64_t step) {
  uint64_t z = seed + (step + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double sampling_uniform(uint64_t seed, uint64_t step) {
  return double(splitmix64_at(seed, step) >> 11) * 0x1.0p-53;
}

uint64_t random_seed() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();
  return (hi << 32) ^ lo;
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                     std::span<const int32_t> output_tokens, const SamplingParams& params) {
  const bool rep = params.repetition_penalty != 1.0f;
  const bool freq = params.frequency_penalty != 0.0f;
  const bool pres = params.presence_penalty != 0.0f;
  if (!rep && !freq && !pres) return;
  const size_t v = logits.size();
  auto check = [v](std::span<const int32_t> toks, const char* which) {
    for (int32_t t : toks)
      if (t < 0 || size_t(t) >= v)
        fail("sampler: {} token id {} is outside the vocabulary [0, {}).", which, t, v);
  };
  check(prompt_tokens, "prompt");
  check(output_tokens, "output");

  if (rep) {
    const float r = params.repetition_penalty;
    std::vector<uint8_t> seen(v, 0);
    auto penalize = [&](int32_t t) {
      if (seen[size_t(t)]) return;
      seen[size_t(t)] = 1;
      float& x = logits[size_t(t)];
      x = x > 0.0f ? x / r : x * r;
    };
    for (int32_t t : prompt_tokens) penalize(t);
    for (int32_t t : output_tokens) penalize(t);
  }
  if (freq || pres) {
    std::vector<int32_t> count(v, 0);
    std::vector<int32_t> distinct;
    for (int32_t t : output_tokens)
      if (count[size_t(t)]++ == 0) distinct.push_back(t);
    for (int32_t t : distinct) {
      float& x = logits[size_t(t)];
      if (freq) x -= params.frequency_penalty * float(count[size_t(t)]);
      if (pres) x -= params.presence_penalty;
    }
  }
}

std::vector<double> sampling_distribution(std::span<const float> logits,
                                          std::span<const int32_t> prompt_tokens,
                                          std::span<const int32_t> output_tokens,
                                          const SamplingParams& params) {
  params.validate();
  const RowMax raw = scan_row(logits, "logits");
  const Prepared pre = prepare(logits, raw, prompt_tokens, output_tokens, params);
  std::vector<double> probs(logits.size(), 0.0);
  if (params.greedy()) {
    probs[size_t(pre.max.index)] = 1.0;
    return probs;
  }
  const std::vector<Cand> c = survivors(pre.x, pre.max.value, params);
  double z = 0.0;
  for (const Cand& e : c) z += e.w;
  for (const Cand& e : c) probs[size_t(e.id)] = e.w / z;
  return probs;
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t n) {
  const RowMax raw = scan_row(logits, "logits");
  return top_n(logits, size_t(std::max(n, 0)), log_sum_exp(logits, raw.value));
}

namespace {
// The CPU sampler as a registry entry (the profiler's 'sampling' category): one call per sampled token.
const prof::Kernel kSampleToken{"cpu::sample_token", prof::Category::Sampling};
}  // namespace

SampleResult sample_token(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                          std::span<const int32_t> output_tokens, const SamplingParams& params,
                          uint64_t seed, uint64_t step) {
  const prof::HostScope scope(kSampleToken, prof::Work{4.0 * double(logits.size()), 0});
  params.validate();
  const RowMax raw = scan_row(logits, "logits");
  // Step 1, raw log_softmax: only when asked for (one exp per vocabulary entry dominates greedy).
  const double lse = params.logprobs ? log_sum_exp(logits, raw.value) : 0.0;
  SampleResult r;
  if (params.logprobs && params.top_logprobs > 0)
    r.top_logprobs = top_n(logits, size_t(params.top_logprobs), lse);

  const Prepared pre = prepare(logits, raw, prompt_tokens, output_tokens, params);
  if (params.greedy()) {
    r.token = pre.max.index;
  } else {
    const std::vector<Cand> c = survivors(pre.x, pre.max.value, params);
    // Step 8: inverse CDF over the survivors in ascending id order.
    double z = 0.0;
    for (const Cand& e : c) z += e.w;
    const double target = sampling_uniform(seed, step) * z;
    double cum = 0.0;
    r.token = c.back().id;  // only reachable through rounding; c is never empty (max survives)
    for (const Cand& e : c) {
      cum += e.w;
      if (cum > target) {
        r.token = e.id;
        break;
      }
    }
  }
  r.logprob = params.logprobs ? float(double(logits[size_t(r.token)]) - lse) : std::nanf("");
  return r;
}

Sampler::Sampler(SamplingParams params)
    : params_(std::move(params)),
      seed_(params_.seed ? uint64_t(*params_.seed) : random_seed()) {
  params_.validate();
}

}  // namespace moefold
