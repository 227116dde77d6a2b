// DeviceSampler (contract: device_sampler.h).
#include "models/cuda/device_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/sampling.h"

namespace moefold {
namespace {

constexpr int32_t kTopMax = cuda::kMaxTopLogprobs;
constexpr int64_t kArgmaxRows = 128;  // plain greedy calls of at least this many rows use argmax_rows

size_t align8(size_t n) { return (n + 7) & ~size_t(7); }

bool penalties_on(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

template <class T>
T* at(void* base, size_t off) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(base) + off);
}

}  // namespace

void DeviceSampler::Pinned::reserve(size_t n) {
  if (n <= bytes) return;
  if (ptr) MOEFOLD_CUDA_CHECK(cudaFreeHost(ptr));
  ptr = nullptr;
  bytes = 0;
  MOEFOLD_CUDA_CHECK(cudaMallocHost(&ptr, n));
  bytes = n;
}

DeviceSampler::Pinned::~Pinned() {
  if (ptr) cudaFreeHost(ptr);
}

DeviceSampler::DeviceSampler(int64_t max_rows, int64_t vocab) : max_rows_(max_rows), vocab_(vocab) {
  MOEFOLD_CHECK(max_rows >= 1 && max_rows < (int64_t(1) << 24) && vocab >= 1 &&
                    vocab < int64_t(std::numeric_limits<int32_t>::max()),
                "DeviceSampler: bad sizes max_rows={} vocab={}", max_rows, vocab);
  const size_t M = size_t(max_rows);
  size_t o = 0;
  auto seg = [&](size_t bytes) {
    const size_t at_ = o;
    o = align8(o + bytes);
    return at_;
  };
  off_uniform_ = seg(M * sizeof(double));
  off_temp_ = seg(M * sizeof(float));
  off_top_p_ = seg(M * sizeof(float));
  off_min_p_ = seg(M * sizeof(float));
  off_rep_ = seg(M * sizeof(float));
  off_freq_ = seg(M * sizeof(float));
  off_pres_ = seg(M * sizeof(float));
  off_top_k_ = seg(M * sizeof(int32_t));
  off_top_n_ = seg(M * sizeof(int32_t));
  off_offsets_ = seg((M + 1) * sizeof(int32_t));
  off_counts_ = seg(2 * sizeof(int32_t));  // live rows, masked ids
  off_bm_row_ = seg(M * sizeof(int32_t));  // grammar bitmask row per row, -1 = none
  blob_bytes_ = o;
  blob_host_.reserve(blob_bytes_);
  blob_ = cuda::DeviceBuffer<uint8_t>(blob_bytes_);
  lse_ = cuda::DeviceBuffer<double>(M);
  tokens_ = cuda::DeviceBuffer<int32_t>(M);
  flags_ = cuda::DeviceBuffer<int32_t>(M);
  logprob_ = cuda::DeviceBuffer<float>(M);
  top_ids_ = cuda::DeviceBuffer<int32_t>(M * kTopMax);
  top_lp_ = cuda::DeviceBuffer<float>(M * kTopMax);
  out_host_.reserve(M * (3 + 2 * kTopMax) * 4);
  entry_of_.assign(size_t(vocab), -1);
  cluster_ = cuda::cluster_sampler_supported(vocab);
}

void DeviceSampler::set_cluster_kernel(bool on) {
  MOEFOLD_CHECK(!on || cuda::cluster_sampler_supported(vocab_),
                "DeviceSampler: the cluster sampler is not supported for vocabulary {} on this device", vocab_);
  cluster_ = on;
}

DeviceSampler::~DeviceSampler() = default;

void DeviceSampler::update_mask(std::span<const int32_t> ids, cudaStream_t stream) {
  if (mask_valid_ && std::equal(ids.begin(), ids.end(), mask_host_.begin(), mask_host_.end())) return;
  mask_host_.assign(ids.begin(), ids.end());
  if (mask_.size() < mask_host_.size()) mask_ = cuda::DeviceBuffer<int32_t>(mask_host_.size());
  // From pageable memory: the copy is staged before cudaMemcpyAsync returns, and the list rarely changes.
  if (!mask_host_.empty()) mask_.upload(mask_host_.data(), mask_host_.size(), 0, stream, true);
  mask_valid_ = true;
}

std::string DeviceSampler::prepare_row(size_t i, const RowSampling& r, int32_t& num_entries) {
  void* b = blob_host_.ptr;
  // A skipped or failed row: greedy, no logprobs, no penalties (its result is not used).
  at<double>(b, off_uniform_)[i] = 0.0;
  at<float>(b, off_temp_)[i] = 0.0f;
  at<float>(b, off_top_p_)[i] = 1.0f;
  at<float>(b, off_min_p_)[i] = 0.0f;
  at<float>(b, off_rep_)[i] = 1.0f;
  at<float>(b, off_freq_)[i] = 0.0f;
  at<float>(b, off_pres_)[i] = 0.0f;
  at<int32_t>(b, off_top_k_)[i] = 0;
  at<int32_t>(b, off_top_n_)[i] = -1;
  at<int32_t>(b, off_offsets_)[i + 1] = num_entries;
  if (!r.sampler) return {};
  const SamplingParams& p = r.sampler->params();
  if (penalties_on(p)) {
    // The CPU's apply_penalties checks both histories whenever a penalty is on.
    for (std::span<const int32_t> h : {r.prompt, r.output})
      for (int32_t t : h)
        if (t < 0 || int64_t(t) >= vocab_)
          return fmt::format("sampler: {} token id {} is outside the vocabulary [0, {}).",
                             h.data() == r.prompt.data() ? "prompt" : "output", t, vocab_);
    const bool rep = p.repetition_penalty != 1.0f;
    const size_t begin = hist_tokens_.size();
    auto entry = [&](int32_t t) {
      int32_t& e = entry_of_[size_t(t)];
      if (e < 0) {
        e = int32_t(hist_tokens_.size());
        hist_tokens_.push_back(t);
        hist_counts_.push_back(0);
      }
      return size_t(e);
    };
    if (rep)
      for (int32_t t : r.prompt) entry(t);
    for (int32_t t : r.output) ++hist_counts_[entry(t)];
    for (size_t j = begin; j < hist_tokens_.size(); ++j) entry_of_[size_t(hist_tokens_[j])] = -1;
    num_entries = int32_t(hist_tokens_.size());
    at<float>(b, off_rep_)[i] = p.repetition_penalty;
    at<float>(b, off_freq_)[i] = p.frequency_penalty;
    at<float>(b, off_pres_)[i] = p.presence_penalty;
    at<int32_t>(b, off_offsets_)[i + 1] = num_entries;
  }
  at<float>(b, off_temp_)[i] = p.temperature;
  if (!p.greedy()) {
    at<double>(b, off_uniform_)[i] = sampling_uniform(r.sampler->seed(), r.output.size());
    at<float>(b, off_top_p_)[i] = p.top_p;
    at<float>(b, off_min_p_)[i] = p.min_p;
    at<int32_t>(b, off_top_k_)[i] = p.top_k;
  }
  if (p.logprobs) at<int32_t>(b, off_top_n_)[i] = std::min(p.top_logprobs, kTopMax);
  return {};
}

bool DeviceSampler::stage_bitmasks(std::span<const RowSampling> rows, std::vector<std::string>& errors,
                                   cudaStream_t stream) {
  int32_t* bm_row = at<int32_t>(blob_host_.ptr, off_bm_row_);
  std::vector<size_t> constrained;
  for (size_t i = 0; i < rows.size(); ++i) {
    bm_row[i] = -1;
    if (rows[i].sampler && errors[i].empty() && !rows[i].token_bitmask.empty()) constrained.push_back(i);
  }
  if (constrained.empty()) return false;
  std::string mask_error;
  for (size_t i : constrained) {
    if (!rows[i].mask_ready) continue;
    try {
      (*rows[i].mask_ready)();
    } catch (const std::exception& e) {
      mask_error = e.what();
    }
    break;
  }
  const size_t W = size_t((vocab_ + 31) / 32);
  bm_host_.reserve(constrained.size() * W * sizeof(uint32_t));  // the last call synchronised: no copy in flight
  uint32_t* host = static_cast<uint32_t*>(bm_host_.ptr);
  size_t k = 0;
  for (size_t i : constrained) {
    if (!mask_error.empty()) {
      errors[i] = "the grammar mask failed: " + mask_error;
    } else if (rows[i].token_bitmask.size() != W) {
      errors[i] = fmt::format("token bitmask has {} words for a vocabulary of {} ({} expected)",
                              rows[i].token_bitmask.size(), vocab_, W);
    } else {
      std::memcpy(host + k * W, rows[i].token_bitmask.data(), W * sizeof(uint32_t));
      bm_row[i] = int32_t(k++);
    }
  }
  if (k == 0) return false;
  if (bm_.size() < k * W) bm_ = cuda::DeviceBuffer<uint32_t>(std::max(k, size_t(8)) * W);
  bm_.upload(host, k * W, 0, stream, true);
  return true;
}

void DeviceSampler::sample(float* logits, std::span<const RowSampling> rows, std::span<const int32_t> masked_tokens,
                           std::vector<SampleResult>& out, cudaStream_t stream) {
  const int64_t R = int64_t(rows.size());
  MOEFOLD_CHECK(R <= max_rows_, "DeviceSampler: {} rows exceed the capacity of {}", R, max_rows_);
  out.resize(rows.size());
  if (R == 0) return;
  const int64_t V = vocab_;

  // Host side: per-row parameters, penalty histories, errors found before the GPU runs.
  std::vector<std::string> errors(rows.size());
  hist_tokens_.clear();
  hist_counts_.clear();
  int32_t num_entries = 0;
  at<int32_t>(blob_host_.ptr, off_offsets_)[0] = 0;
  bool all_greedy = true, any_logprobs = false, any_top = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    errors[i] = prepare_row(i, rows[i], num_entries);
    if (!errors[i].empty() || !rows[i].sampler) continue;
    const SamplingParams& p = rows[i].sampler->params();
    all_greedy = all_greedy && p.greedy();
    any_logprobs = any_logprobs || p.logprobs;
    any_top = any_top || (p.logprobs && p.top_logprobs > 0);
  }
  at<int32_t>(blob_host_.ptr, off_counts_)[0] = int32_t(R);
  at<int32_t>(blob_host_.ptr, off_counts_)[1] = int32_t(masked_tokens.size());
  const size_t E = hist_tokens_.size();
  const bool any_bitmask = stage_bitmasks(rows, errors, stream);

  // Uploads: the parameter blob, the histories (when any row is penalized), the mask (when changed).
  blob_.upload(static_cast<const uint8_t*>(blob_host_.ptr), blob_bytes_, 0, stream, true);
  void* d = blob_.data();
  const int32_t* live = at<int32_t>(d, off_counts_);
  cuda::PenaltyRows pen;
  if (E > 0) {
    if (E > hist_cap_) {
      hist_cap_ = std::max(E, 2 * hist_cap_);
      hist_ = cuda::DeviceBuffer<int32_t>(2 * hist_cap_);
      saved_ = cuda::DeviceBuffer<float>(hist_cap_);
      hist_host_.reserve(2 * hist_cap_ * sizeof(int32_t));
    }
    int32_t* h = static_cast<int32_t*>(hist_host_.ptr);
    std::memcpy(h, hist_tokens_.data(), E * sizeof(int32_t));
    std::memcpy(h + hist_cap_, hist_counts_.data(), E * sizeof(int32_t));
    hist_.upload(h, E, 0, stream, true);
    hist_.upload(h + hist_cap_, E, hist_cap_, stream, true);
    pen = {at<float>(d, off_rep_), at<float>(d, off_freq_),  at<float>(d, off_pres_), at<int32_t>(d, off_offsets_),
           hist_.data(),           hist_.data() + hist_cap_, saved_.data()};
  }
  update_mask(masked_tokens, stream);

  // Kernels, in the CPU sampler's order.
  if (!masked_tokens.empty())
    cuda::mask_logits_rows(logits, R, V, 0, mask_.data(), at<int32_t>(d, off_counts_) + 1, int64_t(masked_tokens.size()),
                           live, stream);
  if (any_bitmask) cuda::apply_token_bitmask_rows(logits, R, V, 0, bm_.data(), at<int32_t>(d, off_bm_row_), live, stream);
  const int32_t* top_n = at<int32_t>(d, off_top_n_);
  const cuda::SampleRowParams sp{at<float>(d, off_temp_), at<int32_t>(d, off_top_k_), at<float>(d, off_top_p_),
                                 at<float>(d, off_min_p_), at<double>(d, off_uniform_)};
  // A plain greedy call of many rows streams best through the one-block-per-row argmax (the cluster
  // kernel keeps each row in shared memory, which pays only when it is read more than once); both
  // are exact, so a row's token does not depend on the choice.
  const bool plain_greedy = all_greedy && !any_logprobs && E == 0;
  if (cluster_ && !(plain_greedy && R >= kArgmaxRows)) {
    cuda::ClusterSampleArgs ca;
    if (!all_greedy) ca.sample = sp;
    if (any_logprobs) {
      ca.top_n = top_n;
      ca.lse = lse_.data();
      ca.top_ids = top_ids_.data();
      ca.top_logprobs = top_lp_.data();
      ca.logprob = logprob_.data();
    }
    if (E > 0) ca.penalties = pen;
    ca.tokens = tokens_.data();
    ca.flags = flags_.data();
    cuda::sample_rows_cluster(logits, R, V, 0, ca, live, stream);
  } else {
    if (any_logprobs) cuda::raw_logprobs_rows(logits, R, V, 0, top_n, lse_.data(), top_ids_.data(), top_lp_.data(), live, stream);
    if (E > 0) cuda::apply_penalties_rows(logits, R, V, 0, pen, live, stream);
    if (all_greedy) {
      cuda::argmax_rows(logits, R, V, 0, tokens_.data(), flags_.data(), live, stream);
    } else {
      cuda::sample_rows(logits, R, V, 0, sp, tokens_.data(), flags_.data(), live, stream);
    }
    if (any_logprobs)
      cuda::token_logprobs_rows(logits, R, V, 0, tokens_.data(), top_n, lse_.data(), E > 0 ? &pen : nullptr,
                                logprob_.data(), live, stream);
  }

  // Downloads, then the one synchronisation.
  const size_t M = size_t(max_rows_), n = size_t(R);
  int32_t* h_tok = static_cast<int32_t*>(out_host_.ptr);
  int32_t* h_flag = h_tok + M;
  float* h_lp = reinterpret_cast<float*>(h_flag + M);
  int32_t* h_top_id = reinterpret_cast<int32_t*>(h_lp + M);
  float* h_top_lp = reinterpret_cast<float*>(h_top_id + M * kTopMax);
  tokens_.download(h_tok, n, 0, stream, true);
  flags_.download(h_flag, n, 0, stream, true);
  if (any_logprobs) logprob_.download(h_lp, n, 0, stream, true);
  if (any_top) {
    top_ids_.download(h_top_id, n * kTopMax, 0, stream, true);
    top_lp_.download(h_top_lp, n * kTopMax, 0, stream, true);
  }
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream));

  for (size_t i = 0; i < n; ++i) {
    SampleResult& o = out[i];
    o = SampleResult{};
    if (!rows[i].sampler) continue;
    if (!errors[i].empty()) {
      o.error = std::move(errors[i]);
      continue;
    }
    const SamplingParams& p = rows[i].sampler->params();
    const int32_t f = h_flag[i];
    if (f & cuda::kSampleNaN) {
      o.error = "sampler: logits contain NaN.";
    } else if (f & cuda::kSamplePosInf) {
      o.error = penalties_on(p) ? "sampler: logits or penalized logits contain +inf." : "sampler: logits contain +inf.";
    } else if ((f & cuda::kSampleEmpty) || h_tok[i] < 0 || int64_t(h_tok[i]) >= V) {
      o.error = "sampler: all logits are -inf; no token can be sampled.";
    }
    if (!o.error.empty()) continue;
    o.token = h_tok[i];
    o.logprob = p.logprobs ? h_lp[i] : std::nanf("");
    if (p.logprobs && p.top_logprobs > 0) {
      const int64_t k = std::min<int64_t>(std::min(p.top_logprobs, kTopMax), V);
      o.top_logprobs.reserve(size_t(k));
      for (int64_t j = 0; j < k; ++j)
        o.top_logprobs.push_back({h_top_id[i * kTopMax + size_t(j)], h_top_lp[i * kTopMax + size_t(j)]});
    }
  }
}

}  // namespace moefold
