// Causal GQA softmax attention over a paged KV cache (fp32 reference).
// KV cache page layout, per attention layer: k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim].
// Token p of a sequence lives in page block_table[p / block_size], slot p % block_size.
#pragma once
#include <cstdint>

namespace moefold::cpu {

/// Writes k, v [n, kv_heads * head_dim] (tokens at positions start .. start+n-1 of one sequence) into
/// that sequence's pages. Precondition: block_table covers position start+n-1.
void kv_cache_write(const float* k, const float* v, float* k_cache, float* v_cache, const int32_t* block_table,
                    int64_t start, int64_t n, int64_t block_size, int64_t kv_dim);

/// out[i, h, :] = softmax_j(scale * q[i, h] . K[j, h / (Hq / Hkv)]) V[j, ...] over cached positions
/// j <= start + i (causal), for n query rows of one sequence at positions start .. start+n-1
/// (fixed-order loops: a row gives the same bits whatever chunk it is computed in).
/// q, out: [n, Hq, D]. Softmax in fp32 with max subtraction, scores accumulated in fp32.
/// round_p_bf16: round the unnormalised probabilities exp(s - max) to bf16 before P V (the sum stays
/// fp32), as tensor-core prefill kernels do (the ideal bf16 chain of the GPU prefill kernel).
void paged_attention(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
                     int64_t start, int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t block_size, float scale, float* out, bool round_p_bf16 = false);

}  // namespace moefold::cpu
