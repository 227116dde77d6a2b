// DeepSeek-V3.2's lightning indexer (DeepSeek Sparse Attention): a cheap multi-head scorer that picks,
// per query token, the index_topk cached tokens its MLA attends to. Source: the DeepSeek-V3.2-Exp
// report and transformers DeepseekV32Indexer.
//   q_h = wq_b(c_q)[h] (rope on its first qk_rope dims, half-split), k_j = LayerNorm(wk(x_j)) (same rope),
//   w_h = weights_proj(x)[h]
//   I_j = sum_h w_h / sqrt(H) * ReLU(q_h . k_j / sqrt(D))     fp32, over the REAL context j <= position
//   keep the top index_topk positions (all of them while the context is shorter)
// The key cache holds one D-dim k_j per token (shared by all indexer heads).
#pragma once
#include <cstdint>

namespace moefold::cpu {

/// scores[j] = sum_h w[h] / sqrt(heads) * relu(q[h] . K[j] / sqrt(head_dim)) for j < n_ctx, where K[j]
/// is the key cached at position j of the sequence (pages [num_blocks, block_size, head_dim]).
/// q: [heads, head_dim]; w: [heads]. Cost: n_ctx * heads * head_dim, never the maximum context.
void indexer_scores(const float* q, const float* w, const float* key_cache, const int32_t* block_table,
                    int64_t block_size, int64_t n_ctx, int64_t heads, int64_t head_dim, float* scores);

/// The positions of the min(k, n) largest scores[0 .. n), ties to the lower position and NaN last,
/// written to out in ascending position order. Returns how many were written.
int64_t indexer_topk(const float* scores, int64_t n, int64_t k, int32_t* out);

}  // namespace moefold::cpu
