// Token selection on the GPU from fp32 logits rows (the lm_head's fp32 output), matching the CPU
// sampler (runtime/sampler.h) step for step:
//   greedy  : argmax, ties -> the LOWER token id; NaN is never chosen (bit 0 of the row's flag).
//   sampled : temperature weights w_i = exp((x_i - max) / T) in double; min_p (logit space, double);
//             top_k keeps exactly k (ties by lower id); top_p keeps the shortest prefix in
//             (logit desc, id asc) order whose mass reaches top_p * Z; then inverse-CDF in ascending
//             id order with the host-supplied uniform u in [0, 1) (sampling_uniform(seed, step)),
//             returning the first token whose running weight exceeds u * Z.
// Around the selection, in the CPU sampler's order (the caller, models/cuda/device_sampler, launches):
//   mask_logits_rows    : the never-sampled ids -> -inf (mask_tokens);
//   apply_token_bitmask_rows: a grammar's disallowed ids -> -inf (apply_token_bitmask);
//   raw_logprobs_rows   : log-sum-exp of the raw (masked, unpenalized) row in double, and its
//                         top_logprobs (<= kMaxTopLogprobs, logit desc, id asc) (sampler step 1);
//   apply_penalties_rows: repetition / frequency / presence on each row's distinct history tokens,
//                         bit-exact fp32 like apply_penalties (step 2), saving the raw values;
//   then argmax_rows or sample_rows on the penalized rows (steps 3-8), then
//   token_logprobs_rows : the sampled token's raw logprob (from the saved raw value if penalized).
// Every kernel runs one block per row and reads the live row count from device memory.
// sample_rows_cluster (below; sampling_cluster.cu) computes raw logprobs -> penalties -> selection ->
// token logprob in ONE launch with a thread-block cluster per row and fixed-order sums; DeviceSampler
// uses it where cluster_sampler_supported(). The per-pass kernels stay as the reference.
//
// Exactness. Greedy is exact. For sampling, every comparison the CPU makes is made in the same
// precision; only the order of double additions differs (tree and shared-memory atomic sums instead
// of a sequential loop), so a token differs from the CPU's only when u * Z or top_p * Z falls within
// ~1e-15 relative of a boundary (never observed in the tests). The top_p boundary search sums with
// shared-memory double atomics, so that boundary decision is not bit-reproducible run to run in
// that same ~1e-15 window; everything else is deterministic.
//
// Row flags (device int32 per row, written for every live row): bit 0 = the row had NaN (treated as
// never-sample), bit 1 = +inf present (greedy over the +inf entries, lowest id), bit 2 = no
// selectable entry (all NaN / -inf): token -1.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moefold::cuda {

enum SampleFlag : int32_t { kSampleNaN = 1, kSamplePosInf = 2, kSampleEmpty = 4 };

/// Most top_logprobs entries per row (SamplingParams::kMaxTopLogprobs).
constexpr int32_t kMaxTopLogprobs = 20;

/// tokens[r] = argmax over logits[r * ld + (0 .. vocab)] for rows r < live (device count or nullptr
/// = all max_rows). ld = 0 means vocab. flags may be nullptr.
void argmax_rows(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, int32_t* tokens, int32_t* flags,
                 const int32_t* live_rows, cudaStream_t stream);

/// Per-row sampling parameters, all device arrays of max_rows entries (the SamplingParams fields
/// of each row's request). temperature < 1e-5 selects greedy for that row. top_k <= 0: off;
/// top_p >= 1: off; min_p <= 0: off. uniform: the row's draw u in [0, 1).
struct SampleRowParams {
  const float* temperature = nullptr;
  const int32_t* top_k = nullptr;
  const float* top_p = nullptr;
  const float* min_p = nullptr;  ///< may be nullptr (off for every row)
  const double* uniform = nullptr;
};

/// One token per row as described above (one 1024-thread block per row).
void sample_rows(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const SampleRowParams& params,
                 int32_t* tokens, int32_t* flags, const int32_t* live_rows, cudaStream_t stream);

/// logits[r * ld + ids[j]] = -inf for rows r < live and j < *num_ids (device count, at most max_ids,
/// which only sizes the profiler's work); ids outside [0, vocab) are ignored (CPU mask_tokens).
void mask_logits_rows(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const int32_t* ids,
                      const int32_t* num_ids, int64_t max_ids, const int32_t* live_rows, cudaStream_t stream);

/// Grammar-constrained decoding (runtime/sampler.h apply_token_bitmask): for rows r < live with
/// mask_row[r] >= 0, logits[r * ld + t] = -inf for every t < vocab whose bit (t % 32) of word
/// bitmask[mask_row[r] * words + t / 32] is clear. words = ceil(vocab / 32); mask_row has max_rows
/// entries (-1 = unconstrained row, untouched). One thread per logit (coalesced writes).
void apply_token_bitmask_rows(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const uint32_t* bitmask,
                              const int32_t* mask_row, const int32_t* live_rows, cudaStream_t stream);

/// Raw log-probabilities (sampler step 1) of rows r < live with top_n[r] >= 0 (device int32 per row;
/// -1 = logprobs off for the row, nothing written): lse[r] = log(sum_i exp(x_i)) in double over the
/// non-NaN entries (max-shifted, as the CPU's log_sum_exp); for n = min(top_n[r], kMaxTopLogprobs,
/// vocab) > 0, top_ids[r * kMaxTopLogprobs + j] / top_logprobs[...] (j < n) are the n best entries in
/// (logit desc, id asc) order and float(x - lse), as the CPU's top_logprobs(). A row with NaN gets
/// lse only (its sampling fails anyway). Run it before the penalties modify the rows.
void raw_logprobs_rows(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const int32_t* top_n,
                       double* lse, int32_t* top_ids, float* top_logprobs, const int32_t* live_rows,
                       cudaStream_t stream);

/// Per-row penalty inputs (device arrays). Row r owns history entries [offsets[r], offsets[r + 1])
/// (offsets has max_rows + 1 entries; an empty range = no penalty): tokens[j] a DISTINCT token id of
/// the row (every prompt or output id when the repetition penalty is on, else the output ids),
/// counts[j] its number of occurrences in the output. saved[j] receives the raw logit (for the
/// sampled token's logprob). repetition / frequency / presence: the row's SamplingParams values.
struct PenaltyRows {
  const float* repetition = nullptr;
  const float* frequency = nullptr;
  const float* presence = nullptr;
  const int32_t* offsets = nullptr;
  const int32_t* tokens = nullptr;
  const int32_t* counts = nullptr;
  float* saved = nullptr;
};

/// Applies the penalties in place for rows r < live, exactly as apply_penalties() in fp32:
/// x = x > 0 ? x / r : x * r (r != 1), then, if counts > 0, x -= frequency * count (frequency != 0)
/// and x -= presence (presence != 0); the operations are rounded one by one (no FMA). Ids outside
/// [0, vocab) are skipped (the host rejects them first).
void apply_penalties_rows(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const PenaltyRows& penalties,
                          const int32_t* live_rows, cudaStream_t stream);

/// logprob[r] = float(raw x[tokens[r]] - lse[r]) for rows r < live with top_n[r] >= 0 (NaN when the
/// token is -1); the raw value is penalties->saved[j] when the token is in the row's history, else the
/// row itself. penalties may be nullptr (no row was penalized).
void token_logprobs_rows(const float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const int32_t* tokens,
                         const int32_t* top_n, const double* lse, const PenaltyRows* penalties, float* logprob,
                         const int32_t* live_rows, cudaStream_t stream);

/// Everything the sampler does to a row, for the one-kernel path (sample_rows_cluster). Device arrays
/// of max_rows entries unless said otherwise.
struct ClusterSampleArgs {
  /// temperature == nullptr: every row greedy (then top_k / top_p / min_p / uniform are not read).
  SampleRowParams sample;
  /// -1 = no logprobs for the row; else lse, top_ids / top_logprobs (kMaxTopLogprobs per row) and
  /// logprob are written as raw_logprobs_rows and token_logprobs_rows write them. nullptr: no row.
  const int32_t* top_n = nullptr;
  double* lse = nullptr;
  int32_t* top_ids = nullptr;
  float* top_logprobs = nullptr;
  float* logprob = nullptr;
  /// offsets == nullptr: no row is penalized. Applied as apply_penalties_rows applies them.
  PenaltyRows penalties;
  int32_t* tokens = nullptr;  ///< required
  int32_t* flags = nullptr;   ///< may be nullptr
};

/// The whole selection of sampler steps 1-8 (raw logprobs + top_logprobs, penalties, greedy or
/// temperature / min_p / top_k / top_p / draw, the sampled token's raw logprob) in ONE kernel, one
/// thread-block cluster per row (16 CTAs, or 8), the row read from global memory once into shared
/// memory (sampling_cluster.cu). The same function as raw_logprobs_rows -> apply_penalties_rows ->
/// argmax_rows / sample_rows -> token_logprobs_rows (logits are modified in place the same way), with
/// every reduction in a fixed order that depends only on the row: bitwise reproducible, and a row's
/// results do not depend on the other rows or max_rows. Needs cluster_sampler_supported(vocab), else
/// moefold::Error. The mask and bitmask kernels run before it.
void sample_rows_cluster(float* logits, int64_t max_rows, int64_t vocab, int64_t ld, const ClusterSampleArgs& args,
                         const int32_t* live_rows, cudaStream_t stream);

/// Whether sample_rows_cluster runs for this vocabulary on the current device (sm_90+, a cluster of
/// 16 or 8 CTAs schedulable, vocab <= 16 * 256 * 151 ids). Cached per vocabulary.
bool cluster_sampler_supported(int64_t vocab);

/// The cluster size sample_rows_cluster uses for `vocab` (0 when unsupported).
int cluster_sampler_size(int64_t vocab);

/// How many of those clusters (rows) the device holds at once (0 when unsupported).
int cluster_sampler_active_clusters(int64_t vocab);

}  // namespace moefold::cuda
