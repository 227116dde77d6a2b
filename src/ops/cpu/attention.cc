#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cpu/kv_quant.h"

namespace moefold::cpu {

namespace {

/// Stores one token's head row `x` [D] at element offset `at` of page array `dst`.
int64_t store_row(const float* x, const KvPages& p, void* dst, int64_t at, float scale) {
  const int64_t D = p.head_dim;
  switch (p.elem) {
    case KvElem::F32: std::memcpy(static_cast<float*>(dst) + at, x, size_t(D) * 4); return 0;
    case KvElem::BF16: {
      uint16_t* o = static_cast<uint16_t*>(dst) + at;
      for (int64_t d = 0; d < D; ++d) o[d] = f32_to_bf16(x[d]);
      return 0;
    }
    case KvElem::F8E4M3: {
      uint8_t* o = static_cast<uint8_t*>(dst) + at;
      int64_t sat = 0;
      for (int64_t d = 0; d < D; ++d) {
        bool s = false;
        o[d] = kv_fp8_store(x[d], scale, &s);
        sat += s;
      }
      return sat;
    }
  }
  return 0;
}

/// Reads D elements at element offset `at` of page array `src` as fp32 into out[d * stride].
void load_row(const KvPages& p, const void* src, int64_t at, float scale, float* out, int64_t stride) {
  const int64_t D = p.head_dim;
  switch (p.elem) {
    case KvElem::F32: {
      const float* s = static_cast<const float*>(src) + at;
      for (int64_t d = 0; d < D; ++d) out[d * stride] = s[d];
      return;
    }
    case KvElem::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + at;
      for (int64_t d = 0; d < D; ++d) out[d * stride] = bf16_to_f32(s[d]);
      return;
    }
    case KvElem::F8E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(src) + at;
      const float* t = kv_fp8_table();
      for (int64_t d = 0; d < D; ++d) out[d * stride] = t[s[d]] * scale;
      return;
    }
  }
}

float head_scale(const KvPages& p, const float* scales, int64_t g) {
  return p.elem == KvElem::F8E4M3 ? scales[g] : 1.0f;
}

void check_pages(const KvPages& p) {
  MOEFOLD_CHECK(p.k && p.v && p.block_size > 0 && p.num_kv_heads > 0 && p.head_dim > 0,
                "KvPages: null pages or an empty shape");
  if (p.elem == KvElem::F8E4M3) {
    MOEFOLD_CHECK(p.k_scale && p.v_scale, "KvPages: FP8 pages need k_scale and v_scale");
    for (int64_t g = 0; g < p.num_kv_heads; ++g)
      MOEFOLD_CHECK(std::isfinite(p.k_scale[g]) && p.k_scale[g] > 0 && std::isfinite(p.v_scale[g]) && p.v_scale[g] > 0,
                    "KvPages: FP8 KV scale of head {} is not finite and positive (k {}, v {})", g, p.k_scale[g],
                    p.v_scale[g]);
  }
}

}  // namespace

int64_t kv_cache_write(const float* k, const float* v, const KvPages& p, const int32_t* block_table, int64_t start,
                       int64_t n) {
  check_pages(p);
  const int64_t D = p.head_dim, kv_dim = p.num_kv_heads * D;
  int64_t saturated = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = start + i;
    const int64_t slot = int64_t(block_table[pos / p.block_size]) * p.block_size + pos % p.block_size;
    for (int64_t g = 0; g < p.num_kv_heads; ++g) {
      const int64_t at = slot * kv_dim + g * D;
      saturated += store_row(k + i * kv_dim + g * D, p, p.k, at, head_scale(p, p.k_scale, g));
      saturated += store_row(v + i * kv_dim + g * D, p, p.v, at, head_scale(p, p.v_scale, g));
    }
  }
  return saturated;
}

void kv_cache_write(const float* k, const float* v, float* k_cache, float* v_cache, const int32_t* block_table,
                    int64_t start, int64_t n, int64_t block_size, int64_t kv_dim) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t p = start + i;
    int64_t slot = int64_t(block_table[p / block_size]) * block_size + p % block_size;
    std::memcpy(k_cache + slot * kv_dim, k + i * kv_dim, size_t(kv_dim) * 4);
    std::memcpy(v_cache + slot * kv_dim, v + i * kv_dim, size_t(kv_dim) * 4);
  }
}

// Per KV head: gather the sequence's keys (transposed, [D, ctx]) and values ([ctx, D]) from its pages,
// dequantised to fp32, then for each query row of each head of the group: scores s_j = scale * (q . k_j)
// for the causal keys, row softmax (fp32, max subtracted), o = sum_j p_j v_j. Every sum runs in a fixed
// order (over d for a score, over j for an output), so a row's bits do not depend on the chunk it is
// computed in (batch invariance: a prompt resumed from cached pages gives the bits of a cold prefill).
void paged_attention(const float* q, const KvPages& pg, const int32_t* block_table, int64_t start, int64_t n,
                     int64_t num_heads, float scale, float* out, bool round_p_bf16) {
  check_pages(pg);
  const int64_t num_kv_heads = pg.num_kv_heads, block_size = pg.block_size, D = pg.head_dim;
  const int64_t group = num_heads / num_kv_heads, kv_dim = num_kv_heads * D;
  const int64_t ctx = start + n;
  std::vector<float> Kt(static_cast<size_t>(ctx * D)), V(static_cast<size_t>(ctx * D)), S(static_cast<size_t>(ctx)),
      O(static_cast<size_t>(D));
  for (int64_t g = 0; g < num_kv_heads; ++g) {
    const float ks = head_scale(pg, pg.k_scale, g), vs = head_scale(pg, pg.v_scale, g);
    for (int64_t p = 0; p < ctx; ++p) {
      const int64_t slot = int64_t(block_table[p / block_size]) * block_size + p % block_size;
      load_row(pg, pg.k, slot * kv_dim + g * D, ks, &Kt[size_t(p)], ctx);
      load_row(pg, pg.v, slot * kv_dim + g * D, vs, &V[size_t(p * D)], 1);
    }
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const float* qi = q + (i * num_heads + h) * D;
        const int64_t len = start + i + 1;  // causal: keys 0 .. start + i
        float* row = S.data();
        std::fill(row, row + len, 0.0f);
        for (int64_t d = 0; d < D; ++d) {
          const float qd = qi[d];
          const float* kd = &Kt[size_t(d * ctx)];
          for (int64_t j = 0; j < len; ++j) row[j] += qd * kd[j];
        }
        for (int64_t j = 0; j < len; ++j) row[j] *= scale;
        const float m = *std::max_element(row, row + len);
        float denom = 0;
        for (int64_t j = 0; j < len; ++j) denom += (row[j] = std::exp(row[j] - m));
        const float inv = 1.0f / denom;
        std::fill(O.begin(), O.end(), 0.0f);
        for (int64_t j = 0; j < len; ++j) {
          const float pj = (round_p_bf16 ? bf16_to_f32(f32_to_bf16(row[j])) : row[j]) * inv;
          const float* vj = &V[size_t(j * D)];
          for (int64_t d = 0; d < D; ++d) O[size_t(d)] += pj * vj[d];
        }
        std::memcpy(out + (i * num_heads + h) * D, O.data(), size_t(D) * 4);
      }
  }
}

void paged_attention(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
                     int64_t start, int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t block_size, float scale, float* out, bool round_p_bf16) {
  KvPages p;
  p.k = const_cast<float*>(k_cache);  // read only
  p.v = const_cast<float*>(v_cache);
  p.block_size = block_size, p.num_kv_heads = num_kv_heads, p.head_dim = head_dim;
  paged_attention(q, p, block_table, start, n, num_heads, scale, out, round_p_bf16);
}

}  // namespace moefold::cpu
