#include "ops/cpu/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace moefold::cpu {

void paged_rows_write(const float* rows, float* cache, const int32_t* block_table, int64_t start, int64_t n,
                      int64_t block_size, int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = start + i;
    float* dst = cache + (int64_t(block_table[p / block_size]) * block_size + p % block_size) * dim;
    std::memcpy(dst, rows + i * dim, size_t(dim) * sizeof(float));
  }
}

void mla_absorb_query(const float* q, const float* kv_b, const MlaShape& s, float* q_lat) {
  const int64_t R = s.kv_lora, blk = s.qk_nope + s.v_head;
  for (int64_t h = 0; h < s.heads; ++h) {
    float* out = q_lat + h * R;
    std::fill_n(out, R, 0.0f);
    const float* qn = q + h * s.q_dim();
    for (int64_t d = 0; d < s.qk_nope; ++d) {  // out += q_nope[d] * W_uk_h[d, :]
      const float* row = kv_b + (h * blk + d) * R;
      const float a = qn[d];
      for (int64_t r = 0; r < R; ++r) out[r] += a * row[r];
    }
  }
}

void mla_attention_absorbed(const float* q_lat, const float* q, const float* cache, const int32_t* block_table,
                            int64_t block_size, const int32_t* keys, int64_t n_keys, const MlaShape& s, float scale,
                            float* o_lat) {
  const int64_t R = s.kv_lora, E = s.entry_dim();
  std::vector<const float*> ent(static_cast<size_t>(n_keys));
  for (int64_t j = 0; j < n_keys; ++j) {
    const int64_t p = keys[j];
    ent[size_t(j)] = cache + (int64_t(block_table[p / block_size]) * block_size + p % block_size) * E;
  }
  std::vector<float> sc(static_cast<size_t>(n_keys));
  for (int64_t h = 0; h < s.heads; ++h) {
    const float* ql = q_lat + h * R;
    const float* qp = q + h * s.q_dim() + s.qk_nope;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n_keys; ++j) {
      const float* e = ent[size_t(j)];
      float dot = 0;
      for (int64_t r = 0; r < R; ++r) dot += ql[r] * e[r];
      for (int64_t d = 0; d < s.qk_rope; ++d) dot += qp[d] * e[R + d];
      sc[size_t(j)] = dot * scale;
      mx = std::max(mx, sc[size_t(j)]);
    }
    float sum = 0;
    for (auto& v : sc) sum += (v = std::exp(v - mx));
    float* out = o_lat + h * R;
    std::fill_n(out, R, 0.0f);
    for (int64_t j = 0; j < n_keys; ++j) {
      const float p = sc[size_t(j)] / sum;
      const float* e = ent[size_t(j)];
      for (int64_t r = 0; r < R; ++r) out[r] += p * e[r];
    }
  }
}

void mla_value_up(const float* o_lat, const float* kv_b, const MlaShape& s, float* o) {
  const int64_t R = s.kv_lora, blk = s.qk_nope + s.v_head;
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t d = 0; d < s.v_head; ++d) {
      const float* row = kv_b + (h * blk + s.qk_nope + d) * R;
      const float* ol = o_lat + h * R;
      float acc = 0;
      for (int64_t r = 0; r < R; ++r) acc += row[r] * ol[r];
      o[h * s.v_head + d] = acc;
    }
}

void mla_attention_row(const float* q, const float* kv_b, const float* cache, const int32_t* block_table,
                       int64_t block_size, const int32_t* keys, int64_t n_keys, const MlaShape& s, float scale,
                       float* o) {
  std::vector<float> q_lat(static_cast<size_t>(s.heads * s.kv_lora)), o_lat(q_lat.size());
  mla_absorb_query(q, kv_b, s, q_lat.data());
  mla_attention_absorbed(q_lat.data(), q, cache, block_table, block_size, keys, n_keys, s, scale, o_lat.data());
  mla_value_up(o_lat.data(), kv_b, s, o);
}

}  // namespace moefold::cpu
