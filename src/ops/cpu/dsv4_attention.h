// DeepSeek-V4 attention pieces (fp32 reference), in the form the GPU kernels follow. Source:
// transformers 5.17 modeling_deepseek_v4 (eager_attention_forward with sinks, the HCA / CSA
// compressors, DeepseekV4IndexerScorer / DeepseekV4Indexer, DeepseekV4GroupedLinear).
#pragma once
#include <cstdint>
#include <vector>

namespace moefold::cpu {

/// Shared K=V multi-query attention with a per-head sink for one query: for each head h,
///   p_j = exp(s_j - M) / (sum_i exp(s_i - M) + exp(sink_h - M)),  s_j = scale q_h . kv_j,
///   out_h = sum_j p_j kv_j      (the sink takes probability mass but carries no value)
/// over the n keys kv [n, D] (n may be 0: out = 0). q, out: [heads, D].
void sink_attention(const float* q, const float* kv, int64_t n, const float* sinks, int64_t heads, int64_t D,
                    float scale, float* out);

/// One compressed entry from `slots` source rows: out[d] = sum_s softmax_s(score[s, d]) value[s, d], the
/// softmax taken per channel over the slots (V4's gated window pooling: score = gate + position bias).
/// value, score: [slots, D] with row strides vstride / sstride (slots >= 1).
void softmax_pool(const float* value, int64_t vstride, const float* score, int64_t sstride, int64_t slots,
                  int64_t D, float* out);

/// Lightning-indexer scores of one query over n compressed keys k [n, d]:
///   score_j = sum_h w_h relu(q_h . k_j) / sqrt(d),   q [heads, d], w [heads] (already scaled by heads^-1/2).
void indexer_scores(const float* q, const float* w, const float* k, int64_t n, int64_t heads, int64_t d,
                    float* score);

/// The indices of the min(k, n) largest scores among score[0 .. n) (ties: the lower index first), in
/// decreasing score order.
std::vector<int32_t> topk_indices(const float* score, int64_t n, int64_t k);

/// Block-diagonal grouped projection: x [T, g, in] -> y [T, g, out] with y[t, i] = W_i x[t, i], where
/// w [g * out, in] stacks the g blocks W_i [out, in].
void grouped_linear(const float* x, const float* w, float* y, int64_t T, int64_t g, int64_t in, int64_t out);

}  // namespace moefold::cpu
