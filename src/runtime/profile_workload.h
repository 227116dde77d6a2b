// Profiling workloads: the steps `moefold profile` times, each in one profile window (core/profiler.h)
// over a ModelRunner on any device.
//
//   prefill:N     one prompt of N random tokens in one step, then its first token sampled;
//   decode:BxC    B sequences with C random context tokens each (prefilled untimed, several sequences
//                 per step), warm-up decode steps, then `steps` timed decode steps of all B sequences
//                 (each: one forward step of B rows, then a token sampled per sequence);
//   mixed:BxPxD   B requests of P random prompt tokens and D output tokens (EOS ignored) through the
//                 real Scheduler (chunked prefill and continuous batching under a token budget), timed
//                 from the first step to the last.
// Tokens are sampled greedily by the CPU sampler, inside the window. Before a prefill or decode window
// the same steps run once more without profiling, timed by the host clock, so the report can show what
// the profiler's own instrumentation costs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/profiler.h"
#include "runtime/model_runner.h"

namespace moefold {

struct Workload {
  enum class Kind { Prefill, Decode, Mixed };
  Kind kind = Kind::Prefill;
  std::string spec;   ///< as given, e.g. "decode:64x512"
  int32_t batch = 1;  ///< sequences (decode, mixed); 1 for prefill
  int32_t prompt = 0; ///< prompt tokens (prefill N, mixed P) or context tokens (decode C)
  int32_t output = 0; ///< output tokens per request (mixed D)
};

/// Parses "prefill:N", "decode:BxC" or "mixed:BxPxD" (positive integers; decode's C >= 1).
/// Throws Error with the expected forms otherwise.
Workload parse_workload(const std::string& spec);

struct ProfileOptions {
  int32_t warmup = 1;                   ///< untimed runs (prefill) or decode steps before timing
  int32_t steps = 32;                   ///< timed decode steps (decode workloads)
  int32_t max_batched_tokens = 8192;    ///< token rows per step: decode's context prefill, mixed's budget
  uint32_t seed = 1;                    ///< seed of the random prompts
};

/// What a set of workloads needs of the runner and its executor.
struct WorkloadNeeds {
  int32_t max_rows = 1;    ///< most token rows in one step
  int32_t max_seqs = 1;    ///< most sequences at once (state slots)
  int32_t num_blocks = 1;  ///< KV pages (of block_size tokens) for the largest workload
  int32_t max_blocks_per_seq = 1;
};
WorkloadNeeds workload_needs(const std::vector<Workload>& workloads, const ProfileOptions& opt, int32_t block_size);

struct WorkloadResult {
  Workload workload;
  prof::WindowProfile profile;
  int64_t tokens = 0;             ///< token rows computed in the window
  int32_t steps = 0;              ///< forward steps in the window
  double unprofiled_wall_s = -1;  ///< the same steps without profiling (host clock); -1 when not measured
};

/// Runs `w` on `runner` (which must have the slots and pages workload_needs asks for, and no live
/// sequences) and returns its window. Sequences are released afterwards. Throws Error on a failed
/// step (the window is closed).
WorkloadResult run_workload(ModelRunner& runner, const Workload& w, const ProfileOptions& opt);

/// n token ids drawn uniformly from [0, min(vocab, 200000)) by std::mt19937(seed): synthetic prompts of
/// the profile and benchmark workloads (reproducible for a seed).
std::vector<int32_t> random_tokens(int32_t n, int64_t vocab, uint32_t seed);

}  // namespace moefold
