// Causal GQA softmax attention over a paged KV cache (fp32 reference).
// KV cache page layout, per attention layer: k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim].
// Token p of a sequence lives in page block_table[p / block_size], slot p % block_size.
// Pages hold fp32, bf16 or float8_e4m3fn elements (KvPages; --kv-cache-dtype, ops/cpu/kv_quant.h):
// the store quantises each element on its own (a token's stored bits depend only on its K/V), the
// attention dequantises the gathered keys and values to fp32 and computes as for fp32 pages.
#pragma once
#include <cstdint>

namespace moefold::cpu {

/// Element type of stored K/V pages.
enum class KvElem : uint8_t { F32, BF16, F8E4M3 };

/// One attention layer's pages as stored: k, v each [num_blocks, block_size, num_kv_heads, head_dim]
/// elements of type `elem`. For F8E4M3, k_scale and v_scale [num_kv_heads] are the dequantisation
/// scales (value = e4m3 * scale, stored = e4m3(x / scale)); unused (may be null) otherwise.
struct KvPages {
  KvElem elem = KvElem::F32;
  void* k = nullptr;
  void* v = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t block_size = 0, num_kv_heads = 0, head_dim = 0;
};

/// Writes k, v [n, kv_heads * head_dim] (tokens at positions start .. start+n-1 of one sequence) into
/// that sequence's pages, converting each element to pages.elem (bf16: round to nearest even; e4m3:
/// ops/cpu/kv_quant.h, saturating). Returns the number of elements that saturated (|x / scale| > 448,
/// infinities included; 0 for fp32 and bf16 pages). Precondition: block_table covers position start+n-1.
int64_t kv_cache_write(const float* k, const float* v, const KvPages& pages, const int32_t* block_table,
                       int64_t start, int64_t n);
/// The fp32 form: pages of fp32 elements with kv_dim floats per token.
void kv_cache_write(const float* k, const float* v, float* k_cache, float* v_cache, const int32_t* block_table,
                    int64_t start, int64_t n, int64_t block_size, int64_t kv_dim);

/// out[i, h, :] = softmax_j(scale * q[i, h] . K[j, h / (Hq / Hkv)]) V[j, ...] over cached positions
/// j <= start + i (causal), for n query rows of one sequence at positions start .. start+n-1
/// (fixed-order loops: a row gives the same bits whatever chunk it is computed in).
/// q, out: [n, Hq, D]. K and V are read as stored and dequantised to fp32 (exactly for bf16; e4m3 value
/// times its head's scale, one fp32 multiply). Softmax in fp32 with max subtraction, scores in fp32.
/// round_p_bf16: round the unnormalised probabilities exp(s - max) to bf16 before P V (the sum stays
/// fp32), as tensor-core prefill kernels do (the ideal bf16 chain of the GPU prefill kernel).
void paged_attention(const float* q, const KvPages& pages, const int32_t* block_table, int64_t start, int64_t n,
                     int64_t num_heads, float scale, float* out, bool round_p_bf16 = false);
/// The fp32 form: pages of fp32 elements, num_kv_heads * head_dim floats per token.
void paged_attention(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
                     int64_t start, int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t block_size, float scale, float* out, bool round_p_bf16 = false);

}  // namespace moefold::cpu
