// Profiling workloads (contract: profile_workload.h).
#include "runtime/profile_workload.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/error.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace moefold {

std::vector<int32_t> random_tokens(int32_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(std::min<int64_t>(vocab, 200000)) - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

namespace {

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  p.seed = 0;
  return p;
}

int32_t ceil_div(int64_t a, int64_t b) { return int32_t((a + b - 1) / b); }

/// Tokens each decode sequence holds by the end of the workload: context, the first sampled token,
/// warm-up steps, the unprofiled and the profiled timed steps.
int64_t decode_tokens(const Workload& w, const ProfileOptions& o) {
  return int64_t(w.prompt) + 1 + o.warmup + 2 * int64_t(o.steps);
}

/// Rows of one step of the decode workload's context prefill (whole contexts, packed).
int32_t decode_prefill_budget(const Workload& w, const ProfileOptions& o) {
  return std::max(w.prompt, o.max_batched_tokens);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// B sequences decoding together: sampled tokens are appended before each step.
struct DecodeBatch {
  explicit DecodeBatch(ModelRunner& r) : runner(r) {}
  ModelRunner& runner;
  Sampler sampler{greedy()};
  std::vector<int32_t> seqs;
  std::vector<std::vector<int32_t>> prompts, outputs;
  std::vector<SampleResult> sampled;

  /// One step over `work` (work[j] is sequence first + j), sampled inside the executor as the
  /// Scheduler does (ModelRunner::step_sample); the tokens are appended.
  void step_and_append(const std::vector<ModelRunner::Work>& work, size_t first) {
    std::vector<RowSampling> rows;
    for (size_t j = 0; j < work.size(); ++j) rows.push_back({&sampler, prompts[first + j], outputs[first + j]});
    runner.step_sample(work, rows, {}, sampled);
    for (size_t j = 0; j < work.size(); ++j) {
      MOEFOLD_CHECK(sampled[j].error.empty(), "sampling failed: {}", sampled[j].error);
      outputs[first + j].push_back(sampled[j].token);
      runner.append_token(seqs[first + j], sampled[j].token);
    }
  }
  /// One decode step of every sequence.
  void step() {
    std::vector<ModelRunner::Work> work;
    for (int32_t s : seqs) work.push_back({s, 1, false});
    step_and_append(work, 0);
  }
  void release() {
    for (int32_t s : seqs) runner.release(s);
    seqs.clear();
  }
};

/// Runs f inside a profile window; closes the window if f throws.
template <class F>
prof::WindowProfile in_window(F&& f) {
  prof::begin_window();
  try {
    f();
  } catch (...) {
    prof::abort_window();
    throw;
  }
  return prof::end_window();
}

WorkloadResult run_prefill(ModelRunner& runner, const Workload& w, const ProfileOptions& o) {
  const int64_t V = runner.config().vocab_size;
  Sampler sampler(greedy());
  uint32_t seed = o.seed;
  // One prefill and its first token, on a sequence added before and released after the timed part.
  auto prefill = [&](auto&& timed) {
    const std::vector<int32_t> prompt = random_tokens(w.prompt, V, seed++);
    const int32_t s = runner.add_sequence(prompt);
    try {
      timed([&] {
        const RowSampling row{&sampler, prompt, {}};
        std::vector<SampleResult> out;
        runner.step_sample({{s, w.prompt, false}}, {&row, 1}, {}, out);
        MOEFOLD_CHECK(out[0].error.empty(), "sampling failed: {}", out[0].error);
      });
    } catch (...) {
      runner.release(s);
      throw;
    }
    runner.release(s);
  };
  for (int i = 0; i < o.warmup; ++i) prefill([](auto&& f) { f(); });
  WorkloadResult r;
  r.workload = w;
  prefill([&](auto&& f) {
    const auto t0 = Clock::now();
    f();
    r.unprofiled_wall_s = seconds_since(t0);
  });
  prefill([&](auto&& f) { r.profile = in_window(f); });
  r.tokens = w.prompt;
  r.steps = 1;
  return r;
}

WorkloadResult run_decode(ModelRunner& runner, const Workload& w, const ProfileOptions& o) {
  const int64_t V = runner.config().vocab_size;
  DecodeBatch d(runner);
  WorkloadResult r;
  r.workload = w;
  try {
    for (int32_t b = 0; b < w.batch; ++b) {
      d.prompts.push_back(random_tokens(w.prompt, V, o.seed + 100 + uint32_t(b)));
      d.outputs.emplace_back();
      d.seqs.push_back(runner.add_sequence(d.prompts.back()));
    }
    // Context prefill, whole contexts packed into steps of at most the budget.
    const int32_t budget = decode_prefill_budget(w, o);
    for (size_t i = 0; i < d.seqs.size();) {
      std::vector<ModelRunner::Work> work;
      int32_t rows = 0;
      const size_t first = i;
      while (i < d.seqs.size() && (work.empty() || rows + w.prompt <= budget)) {
        work.push_back({d.seqs[i], w.prompt, false});
        rows += w.prompt;
        ++i;
      }
      d.step_and_append(work, first);
    }
    for (int i = 0; i < o.warmup; ++i) d.step();
    const auto t0 = Clock::now();
    for (int i = 0; i < o.steps; ++i) d.step();
    r.unprofiled_wall_s = seconds_since(t0);
    r.profile = in_window([&] {
      for (int i = 0; i < o.steps; ++i) {
        d.step();
        prof::flush();
      }
    });
  } catch (...) {
    d.release();
    throw;
  }
  d.release();
  r.tokens = int64_t(w.batch) * o.steps;
  r.steps = o.steps;
  return r;
}

WorkloadResult run_mixed(ModelRunner& runner, const Workload& w, const ProfileOptions& o) {
  const int64_t V = runner.config().vocab_size;
  SchedulerOptions so;
  so.max_num_seqs = w.batch;
  so.max_num_batched_tokens = o.max_batched_tokens;
  so.max_prefill_chunk = 0;
  so.max_model_len = w.prompt + w.output;
  Scheduler sched(runner, so);
  SamplingParams p = greedy();
  p.max_tokens = w.output;
  p.ignore_eos = true;
  for (int32_t b = 0; b < w.batch; ++b) sched.add(random_tokens(w.prompt, V, o.seed + 1000 + uint32_t(b)), p);
  WorkloadResult r;
  r.workload = w;
  try {
    r.profile = in_window([&] {
      while (sched.has_work()) {
        for (const TokenOutput& t : sched.step())
          MOEFOLD_CHECK(t.error.empty(), "workload {}: request {} failed: {}", w.spec, t.id, t.error);
        for (const ScheduledChunk& c : sched.last_step()) r.tokens += c.num_tokens;
        ++r.steps;
        prof::flush();
      }
    });
  } catch (...) {
    for (RequestId id = 0; id < w.batch; ++id) sched.abort(id);
    throw;
  }
  return r;
}

/// Parses a positive integer field of a workload spec.
int32_t field(const std::string& spec, const std::string& s, int32_t min) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || v < min || v > (1 << 24))
    fail("--workload {}: '{}' is not an integer in [{}, {}] (expected prefill:N, decode:BxC or mixed:BxPxD)", spec, s,
         min, 1 << 24);
  return int32_t(v);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t i = 0;
  for (;;) {
    const size_t j = s.find(sep, i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) return out;
    i = j + 1;
  }
}

}  // namespace

Workload parse_workload(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::vector<std::string> f = colon == std::string::npos ? std::vector<std::string>{} : split(spec.substr(colon + 1), 'x');
  Workload w;
  w.spec = spec;
  if (kind == "prefill" && f.size() == 1) {
    w.kind = Workload::Kind::Prefill;
    w.prompt = field(spec, f[0], 1);
  } else if (kind == "decode" && f.size() == 2) {
    w.kind = Workload::Kind::Decode;
    w.batch = field(spec, f[0], 1);
    w.prompt = field(spec, f[1], 1);
  } else if (kind == "mixed" && f.size() == 3) {
    w.kind = Workload::Kind::Mixed;
    w.batch = field(spec, f[0], 1);
    w.prompt = field(spec, f[1], 1);
    w.output = field(spec, f[2], 1);
  } else {
    fail("--workload {}: expected prefill:N, decode:BxC or mixed:BxPxD (e.g. prefill:32768, decode:64x512, "
         "mixed:16x8192x1024)",
         spec);
  }
  return w;
}

WorkloadNeeds workload_needs(const std::vector<Workload>& workloads, const ProfileOptions& o, int32_t bs) {
  MOEFOLD_CHECK(bs >= 1, "block size must be at least 1");
  MOEFOLD_CHECK(o.warmup >= 0 && o.steps >= 1 && o.max_batched_tokens >= 1,
                "profile options: warmup must be >= 0, steps and max_batched_tokens >= 1");
  WorkloadNeeds n;
  for (const Workload& w : workloads) {
    int32_t rows = 1, per_seq = 1;
    switch (w.kind) {
      case Workload::Kind::Prefill:
        rows = w.prompt;
        per_seq = ceil_div(w.prompt, bs) + 1;
        break;
      case Workload::Kind::Decode:
        rows = std::max<int32_t>(w.batch, int32_t(std::min<int64_t>(int64_t(w.batch) * w.prompt, decode_prefill_budget(w, o))));
        per_seq = ceil_div(decode_tokens(w, o), bs) + 1;
        break;
      case Workload::Kind::Mixed:
        rows = o.max_batched_tokens;
        per_seq = ceil_div(int64_t(w.prompt) + w.output, bs) + 1;
        break;
    }
    n.max_rows = std::max(n.max_rows, rows);
    n.max_seqs = std::max(n.max_seqs, w.batch);
    n.max_blocks_per_seq = std::max(n.max_blocks_per_seq, per_seq);
    n.num_blocks = std::max<int32_t>(n.num_blocks, int32_t(std::min<int64_t>(int64_t(w.batch) * per_seq, 1 << 30)));
  }
  return n;
}

WorkloadResult run_workload(ModelRunner& runner, const Workload& w, const ProfileOptions& o) {
  switch (w.kind) {
    case Workload::Kind::Prefill: return run_prefill(runner, w, o);
    case Workload::Kind::Decode: return run_decode(runner, w, o);
    case Workload::Kind::Mixed: return run_mixed(runner, w, o);
  }
  fail("unknown workload kind");
}

}  // namespace moefold
