// Multi-head latent attention (DeepSeek-V2/V3/V3.2 MLA) over a paged latent cache, in the absorbed
// MQA form the decode kernels use. Source: the DeepSeek-V2 report (section 2.1) and transformers
// DeepseekV32Attention (which runs the expanded form).
//
// Per token the cache holds ONE entry shared by all heads: [c (kv_lora_rank) | k_pe (qk_rope_head_dim)],
// c = RMSNorm(kv_a_proj(x)[:kv_lora_rank]) and k_pe the rotated rope key. kv_b_proj (W [heads *
// (qk_nope + v_head), kv_lora_rank]) expands c per head h into k_nope_h = W_uk_h c and v_h = W_uv_h c
// (W_uk_h: the first qk_nope rows of head h's block, W_uv_h the next v_head rows). The expanded form:
//   s_hj = scale (q_nope_h . W_uk_h c_j + q_pe_h . k_pe_j),  o_h = sum_j softmax_j(s_hj) W_uv_h c_j
// equals the absorbed form, where the projections move to the query and the output:
//   q_lat_h = W_uk_h^T q_nope_h;  s_hj = scale (q_lat_h . c_j + q_pe_h . k_pe_j);
//   o_lat_h = sum_j softmax_j(s_hj) c_j;  o_h = W_uv_h o_lat_h
// so every head reads the same cached entries (one shared "KV head" of width kv_lora + rope).
#pragma once
#include <cstdint>

namespace moefold::cpu {

struct MlaShape {
  int64_t heads = 0, qk_nope = 0, qk_rope = 0, v_head = 0, kv_lora = 0;
  int64_t entry_dim() const { return kv_lora + qk_rope; }  ///< floats per cached token
  int64_t q_dim() const { return qk_nope + qk_rope; }      ///< per head: [q_nope | q_pe]
};

/// Copies n rows of `dim` floats (tokens at positions start .. start+n-1 of one sequence) into that
/// sequence's pages [num_blocks, block_size, dim]. Precondition: block_table covers start+n-1.
void paged_rows_write(const float* rows, float* cache, const int32_t* block_table, int64_t start, int64_t n,
                      int64_t block_size, int64_t dim);

/// q_lat[h, :] = W_uk_h^T q[h, :qk_nope] for each head. q: [heads, q_dim]; kv_b: [heads * (qk_nope +
/// v_head), kv_lora]; q_lat: [heads, kv_lora].
void mla_absorb_query(const float* q, const float* kv_b, const MlaShape& s, float* q_lat);

/// Absorbed attention of one query row over the cached tokens at positions keys[0 .. n_keys) of one
/// sequence: o_lat[h] = sum_j softmax_j(scale (q_lat[h] . c_j + q_pe[h] . k_pe_j)) c_j, with q_pe the
/// rope part of q ([heads, q_dim]). Softmax in fp32 with max subtraction. o_lat: [heads, kv_lora].
/// Precondition: n_keys >= 1 and every key position is covered by block_table.
void mla_attention_absorbed(const float* q_lat, const float* q, const float* cache, const int32_t* block_table,
                            int64_t block_size, const int32_t* keys, int64_t n_keys, const MlaShape& s, float scale,
                            float* o_lat);

/// o[h, :] = W_uv_h o_lat[h, :]. o: [heads, v_head].
void mla_value_up(const float* o_lat, const float* kv_b, const MlaShape& s, float* o);

/// The three steps for one query row: q [heads, q_dim] (q_pe already rotated) -> o [heads, v_head].
void mla_attention_row(const float* q, const float* kv_b, const float* cache, const int32_t* block_table,
                       int64_t block_size, const int32_t* keys, int64_t n_keys, const MlaShape& s, float scale,
                       float* o);

}  // namespace moefold::cpu
