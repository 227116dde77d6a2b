// Whole requests through the Scheduler, compared bitwise: a request's reply (its tokens and their
// logprobs), deterministic prompts, and the mixed-step scenario that the CPU (tests/unit/
// mixed_step_test.cc) and GPU (tests/cuda/mixed_step_cuda_test.cc) tests both run: a request's decode
// steps alone vs while other requests prefill beside it (whole or chunked prompts arriving
// mid-generation), which must give bitwise the same reply.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <fmt/format.h>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/scheduler.h"

namespace moefold::test {

/// A request's reply: every sampled token and its logprob (compared bitwise), and cached_tokens.
struct Reply {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int32_t cached = -1;
  bool operator==(const Reply& o) const { return tokens == o.tokens && logprobs == o.logprobs; }
};

inline void PrintTo(const Reply& r, std::ostream* os) {
  *os << "tokens [";
  for (int32_t t : r.tokens) *os << t << " ";
  *os << "] logprobs [";
  for (float l : r.logprobs) *os << fmt::format("{:a} ", l);
  *os << "] cached " << r.cached;
}

/// n deterministic token ids in [0, vocab - 2) from `seed` (an LCG; the prefix-cache tests' prompts).
inline std::vector<int32_t> lcg_prompt(int n, int seed, int64_t vocab) {
  std::vector<int32_t> p(size_t(n > 0 ? n : 0));
  uint32_t x = uint32_t(seed) * 2654435761u + 17;
  for (int i = 0; i < n; ++i) p[size_t(i)] = int32_t((x = x * 1103515245u + 12345u) >> 9) % int32_t(vocab - 2);
  return p;
}

/// Greedy, max_tokens n, EOS ignored, logprobs on.
inline SamplingParams greedy_params(int n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  p.logprobs = true;
  return p;
}

/// Seeded sampling (temperature 0.9, top-p 0.95, seed `seed`), max_tokens n, logprobs on.
inline SamplingParams seeded_params(int n, uint64_t seed = 1234) {
  SamplingParams p = greedy_params(n);
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = seed;
  return p;
}

/// Runs `prompts` (all queued at once) to completion; a reply per prompt. Every output must be
/// error-free and report the same cached_tokens.
inline std::vector<Reply> run_requests(Scheduler& s, const std::vector<std::vector<int32_t>>& prompts,
                                       const SamplingParams& p) {
  std::map<RequestId, size_t> who;
  for (size_t i = 0; i < prompts.size(); ++i) who[s.add(prompts[i], p)] = i;
  std::vector<Reply> out(prompts.size());
  for (int step = 0; s.has_work() && step < 100000; ++step)
    for (const TokenOutput& o : s.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      Reply& r = out[who.at(o.id)];
      r.tokens.push_back(o.token);
      r.logprobs.push_back(o.logprob);
      if (r.cached < 0) r.cached = o.cached_tokens;
      EXPECT_EQ(r.cached, o.cached_tokens);
    }
  EXPECT_FALSE(s.has_work());
  return out;
}

/// A runner and its scheduler.
struct Engine {
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Scheduler> sched;
};

/// Makes a fresh engine whose scheduler batches at most `budget` tokens a step, with or without the
/// prefix cache (the backend's factory: CPU Model or CUDA executor).
using EngineFactory = std::function<Engine(int32_t budget, bool caching)>;

/// A request arriving while the probe generates: `len` prompt tokens (seed `seed`), added once the
/// probe has `after` tokens.
struct Arrival {
  int32_t len;
  int32_t after;
  int seed;
};

/// What run_with_arrivals saw.
struct MixedRun {
  Reply probe;
  std::vector<Reply> others;   ///< per arrival
  int64_t mixed_steps = 0;     ///< steps where the probe decoded while another request prefilled
  int64_t chunked_steps = 0;   ///< of those, steps where that prefill was a chunk of a longer prompt
};

/// Runs the probe (prompt `probe`, params `pp`) to completion while `arrivals` join (params `op`).
inline MixedRun run_with_arrivals(Scheduler& s, const std::vector<int32_t>& probe, const SamplingParams& pp,
                                  const std::vector<Arrival>& arrivals, const SamplingParams& op, int64_t vocab) {
  MixedRun m;
  m.others.resize(arrivals.size());
  const RequestId pid = s.add(probe, pp);
  std::map<RequestId, size_t> who;
  std::map<RequestId, int32_t> prompt_len;
  std::vector<bool> added(arrivals.size(), false);
  for (int step = 0; s.has_work() && step < 100000; ++step) {
    for (size_t i = 0; i < arrivals.size(); ++i)
      if (!added[i] && int32_t(m.probe.tokens.size()) >= arrivals[i].after) {
        const RequestId id = s.add(lcg_prompt(arrivals[i].len, arrivals[i].seed, vocab), op);
        who[id] = i;
        prompt_len[id] = arrivals[i].len;
        added[i] = true;
      }
    const std::vector<TokenOutput> outs = s.step();
    bool probe_decoded = false, other_prefilled = false, chunk = false;
    for (const ScheduledChunk& c : s.last_step()) {
      if (c.id == pid && !c.prefill) probe_decoded = true;
      if (c.id != pid && c.prefill) {
        other_prefilled = true;
        chunk = chunk || c.num_tokens < prompt_len.at(c.id);
      }
    }
    m.mixed_steps += probe_decoded && other_prefilled;
    m.chunked_steps += probe_decoded && other_prefilled && chunk;
    for (const TokenOutput& o : outs) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      Reply& r = o.id == pid ? m.probe : m.others[who.at(o.id)];
      r.tokens.push_back(o.token);
      r.logprobs.push_back(o.logprob);
      r.cached = o.cached_tokens;
    }
  }
  EXPECT_FALSE(s.has_work());
  return m;
}

/// The mixed-step scenario's outcome: the probe's and the arrivals' replies beside prefills against
/// alone.
struct MixedComparison {
  MixedRun got;
  Reply want;                     ///< the probe alone
  std::vector<Reply> want_others; ///< each arrival alone
  std::vector<Arrival> arrivals;
  bool probe_equal() const { return got.probe == want; }
  int others_equal() const {
    int n = 0;
    for (size_t i = 0; i < arrivals.size(); ++i) n += got.others[i] == want_others[i];
    return n;
  }
};

/// The mixed-step scenario on one backend: a probe request (37-token prompt, 28 tokens, greedy or
/// seeded) generates while prompts of 1, 63, 64, 65 and 300 tokens arrive mid-generation (one step's
/// budget holds them whole), against the probe and each arrival run alone (whole prefills, no
/// cache). `chunked`: a 100-token budget with the prefix cache on (hybrid chunks then end on the
/// 64-token grid), so the 300- and 130-token prompts prefill in chunks beside the probe's decodes.
inline MixedComparison compare_decode_alone_vs_beside(const EngineFactory& make, int64_t vocab, bool seeded,
                                                     bool chunked) {
  MixedComparison m;
  const std::vector<int32_t> probe = lcg_prompt(37, 900, vocab);
  const SamplingParams pp = seeded ? seeded_params(28) : greedy_params(28), op = greedy_params(4);
  m.arrivals = chunked ? std::vector<Arrival>{{300, 2, 901}, {130, 3, 902}, {65, 9, 903}, {1, 10, 904}}
                       : std::vector<Arrival>{{1, 2, 901}, {63, 4, 902}, {64, 6, 903}, {65, 8, 904}, {300, 10, 905}};
  Engine alone = make(2048, false);
  m.want = run_requests(*alone.sched, {probe}, pp)[0];
  for (const Arrival& a : m.arrivals)
    m.want_others.push_back(run_requests(*alone.sched, {lcg_prompt(a.len, a.seed, vocab)}, op)[0]);
  Engine beside = make(chunked ? 100 : 2048, chunked);
  m.got = run_with_arrivals(*beside.sched, probe, pp, m.arrivals, op, vocab);
  return m;
}

/// compare_decode_alone_vs_beside, asserted: the probe's reply and every arrival's equal their
/// replies alone, bitwise; the probe decoded beside every arrival's prefill (and beside chunks).
inline MixedComparison expect_decode_alone_equals_beside_prefills(const EngineFactory& make, int64_t vocab, bool seeded,
                                                                  bool chunked, const std::string& label) {
  MixedComparison m = compare_decode_alone_vs_beside(make, vocab, seeded, chunked);
  EXPECT_EQ(m.want.tokens.size(), 28u) << label;
  EXPECT_GE(m.got.mixed_steps, int64_t(m.arrivals.size())) << label << ": the probe must decode beside every prefill";
  if (chunked) {
    EXPECT_GE(m.got.chunked_steps, 3) << label << ": chunked prefills beside the probe's decodes";
  }
  EXPECT_EQ(m.got.probe, m.want) << label << ": the probe's reply beside prefills differs from its reply alone";
  for (size_t i = 0; i < m.arrivals.size(); ++i)
    EXPECT_EQ(m.got.others[i], m.want_others[i]) << label << ": arrival of " << m.arrivals[i].len << " tokens";
  return m;
}

}  // namespace moefold::test
