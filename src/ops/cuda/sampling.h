// Token selection on the GPU from fp32 logits rows (the lm_head's fp32 output), matching the CPU
// sampler (runtime/sampler.h) step for step:
//   greedy  : argmax, ties -> the LOWER token id; NaN is never chosen (bit 0 of the row's flag).
//   sampled : temperature weights w_i = exp((x_i - max) / T) in double; min_p (logit space, double);
//             top_k keeps exactly k (ties by lower id); top_p keeps the shortest prefix in
//             (logit desc, id asc) order whose mass reaches top_p * Z; then inverse-CDF in ascending
//             id order with the host-supplied uniform u in [0, 1) (sampling_uniform(seed, step)),
//             returning the first token whose running weight exceeds u * Z.
// Penalties (repetition / frequency / presence) are not applied here: apply them to the logits
// first. Logprobs are not computed here.
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

}  // namespace moefold::cuda
