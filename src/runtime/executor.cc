// The default Executor::forward_sample: logits on the host, then the CPU sampler on every row.
#include "runtime/executor.h"

#include "core/error.h"
#include "core/parallel.h"
#include "runtime/grammar_constraint.h"

namespace moefold {

void Executor::forward_sample(const ForwardBatch& batch, std::span<const RowSampling> rows,
                              std::span<const int32_t> masked_tokens, std::vector<SampleResult>& out) {
  MOEFOLD_CHECK(rows.size() == batch.logits_rows.size(), "forward_sample: {} sampling rows for {} logits rows",
                rows.size(), batch.logits_rows.size());
  forward(batch, sample_logits_);
  const size_t V = size_t(config().vocab_size);
  MOEFOLD_CHECK(sample_logits_.size() == rows.size() * V, "forward_sample: the forward returned {} logits for {} rows",
                sample_logits_.size(), rows.size());
  out.resize(rows.size());
  // Grammar bitmasks may still be being filled on the host: wait once, after the forward.
  std::string mask_error;
  for (const RowSampling& r : rows) {
    if (!r.mask_ready) continue;
    try {
      (*r.mask_ready)();
    } catch (const std::exception& e) {
      mask_error = e.what();
    }
    break;
  }
  // Rows in parallel (each request has its own Sampler and counter-based randomness).
  parallel_for_rows(int64_t(rows.size()), int64_t(V), [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      const RowSampling& r = rows[size_t(j)];
      SampleResult& o = out[size_t(j)];
      o = SampleResult{};
      if (!r.sampler) continue;
      const std::span<float> row(sample_logits_.data() + size_t(j) * V, V);
      try {
        mask_tokens(row, masked_tokens);
        if (!r.token_bitmask.empty()) {
          if (!mask_error.empty()) throw Error("the grammar mask failed: " + mask_error);
          apply_token_bitmask(row, r.token_bitmask);
        }
        o = r.sampler->sample(row, r.prompt, r.output);
      } catch (const std::exception& e) {
        o = SampleResult{};
        o.error = e.what();
      }
    }
  });
}

}  // namespace moefold
