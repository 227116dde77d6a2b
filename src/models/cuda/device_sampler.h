// DeviceSampler: samples one token per fp32 logits row that is already on the GPU, computing the
// same function as the CPU sampler (runtime/sampler.h, the definition) on the masked rows, and
// brings back only the token ids and, where asked for, the log-probabilities.
//
// One call = the host prepares the per-row parameters (temperature, top_k, top_p, min_p, penalties,
// the draw u = sampling_uniform(seed, output.size()) — counter-based, so a seeded request samples the
// same tokens whatever else is in the batch), the distinct penalty histories of the rows with a
// penalty on, and (only when it changed) the mask list; uploads them in a few async copies; launches
// on the stream, in the CPU sampler's order (ops/cuda/sampling.h), either as one cluster kernel per call
// after the mask kernels (sample_rows_cluster, the default on sm_90) or pass by pass:
//   mask -> grammar bitmask (rows with RowSampling::token_bitmask; waits for mask_ready first, after the
//   host work above, so the host-side mask fill overlaps the forward already queued on the stream)
//   -> raw log-softmax + top_logprobs (rows with logprobs) -> penalties (rows with penalties)
//   -> argmax (greedy-only batch) or sample -> the sampled token's raw logprob (rows with logprobs);
// downloads tokens + flags (+ logprobs, + top_logprobs when requested) and synchronises the stream
// ONCE. Every kernel reads the live row count from device memory. With the cluster kernel a row's
// results are bitwise independent of the other rows and the row count (batch invariance).
//
// Exactness: greedy, masks and penalties are bit-exact; sampled tokens equal the CPU's except when
// u * Z or top_p * Z falls within ~1e-15 relative of a boundary (sampling.h); logprobs agree to
// ~1e-7 (double log-sum-exp summed in another order).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ops/cuda/device_buffer.h"
#include "runtime/executor.h"
#include "runtime/sampler.h"

namespace moefold {

class DeviceSampler {
 public:
  /// Buffers for up to max_rows rows of `vocab` logits (both >= 1, else moefold::Error). Allocates
  /// device and pinned host memory (CUDA errors throw moefold::Error).
  DeviceSampler(int64_t max_rows, int64_t vocab);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  /// Samples rows.size() (<= max_rows, else moefold::Error) rows of `logits` (device fp32
  /// [rows.size(), vocab], row-major, contiguous; MODIFIED in place: masked ids become -inf, penalized
  /// ids their penalized value) on `stream`; returns when the results are on the host.
  /// out is resized to rows.size(); out[i] is what rows[i].sampler->sample() returns on the masked
  /// row i (Executor::forward_sample's contract): token, logprob (NaN unless params.logprobs),
  /// top_logprobs; a row whose sampling fails (NaN / +inf / all -inf logits, a history id outside the
  /// vocabulary) gets token -1 and SampleResult::error; a row with a null sampler is skipped (token
  /// -1, no error). CUDA errors throw moefold::Error.
  void sample(float* logits, std::span<const RowSampling> rows, std::span<const int32_t> masked_tokens,
              std::vector<SampleResult>& out, cudaStream_t stream);

  /// Chooses the kernels: true (the default where ops/cuda/sampling.h's cluster_sampler_supported) =
  /// the one-kernel cluster sampler after the mask kernels; false = the pass-by-pass kernels (the
  /// reference path: raw logprobs, penalties, argmax / sample, token logprobs, one block per row).
  /// Both compute the same function; setting true where unsupported throws moefold::Error.
  void set_cluster_kernel(bool on);
  bool cluster_kernel() const { return cluster_; }

  int64_t max_rows() const { return max_rows_; }
  int64_t vocab() const { return vocab_; }

 private:
  /// Page-locked host memory (cudaMallocHost), for truly asynchronous copies.
  struct Pinned {
    void* ptr = nullptr;
    size_t bytes = 0;
    void reserve(size_t n);  ///< grows (contents dropped)
    ~Pinned();
  };
  /// Prepares row i's parameters into the staging blob; returns its error ("" = fine).
  std::string prepare_row(size_t i, const RowSampling& r, int32_t& num_entries);
  /// Uploads the mask list when it differs from the one on the device.
  void update_mask(std::span<const int32_t> ids, cudaStream_t stream);

  int64_t max_rows_, vocab_;
  bool cluster_ = false;
  // Per-row parameter blob (SoA at fixed offsets), staged in pinned memory, uploaded in one copy.
  size_t off_uniform_, off_temp_, off_top_p_, off_min_p_, off_rep_, off_freq_, off_pres_, off_top_k_, off_top_n_,
      off_offsets_, off_counts_, off_bm_row_, blob_bytes_;
  Pinned blob_host_;
  cuda::DeviceBuffer<uint8_t> blob_;
  // Device results and scratch.
  cuda::DeviceBuffer<double> lse_;
  cuda::DeviceBuffer<int32_t> tokens_, flags_, top_ids_;
  cuda::DeviceBuffer<float> logprob_, top_lp_;
  Pinned out_host_;  // tokens, flags, logprob, top ids, top logprobs (max_rows each / x kMaxTopLogprobs)
  // Penalty histories of this call: distinct tokens per row and their output counts, staged as
  // [tokens | counts] with hist_cap_ entries each.
  std::vector<int32_t> hist_tokens_, hist_counts_;
  size_t hist_cap_ = 0;
  Pinned hist_host_;
  cuda::DeviceBuffer<int32_t> hist_;
  cuda::DeviceBuffer<float> saved_;
  std::vector<int32_t> entry_of_;  // [vocab] token -> entry of the row being prepared, -1 = none
  // Grammar bitmasks of the constrained rows of a call, staged in pinned memory ([k, words] uint32).
  Pinned bm_host_;
  cuda::DeviceBuffer<uint32_t> bm_;
  /// Waits for the rows' grammar bitmasks, stages and uploads them, and fills the blob's mask-row
  /// index (-1 = none); a row whose mask is unusable gets its error. Returns whether any row is masked.
  bool stage_bitmasks(std::span<const RowSampling> rows, std::vector<std::string>& errors, cudaStream_t stream);
  // The mask on the device.
  std::vector<int32_t> mask_host_;
  bool mask_valid_ = false;
  cuda::DeviceBuffer<int32_t> mask_;
};

}  // namespace moefold
