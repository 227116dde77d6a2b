#include "parallel/shard_weights.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fp8_block.h"

namespace moefold {

namespace {

void need_host(const Param& p) {
  MOEFOLD_CHECK(p.empty() || int64_t(p.host.size()) == p.numel,
                "tensor parallel sharding needs host copies of the weights (an unmaterialised dummy tensor of {} "
                "elements was given)",
                p.numel);
}

/// The listed row ranges of p (rows of `cols` elements), stacked in order.
Param rows_of(const Param& p, int64_t cols, const std::vector<Range>& ranges) {
  if (p.empty()) return {};
  need_host(p);
  std::vector<float> out;
  for (const Range& r : ranges)
    out.insert(out.end(), p.host.begin() + r.begin * cols, p.host.begin() + (r.begin + r.count) * cols);
  Param q(std::move(out));
  if (p.fp8) {
    auto f = std::make_shared<Fp8Weight>();
    for (const Range& r : ranges) fp8_append_rows(*f, fp8_slice_rows(*p.fp8, r.begin, r.count));
    q.fp8 = std::move(f);
  }
  return q;
}

/// Columns c of p [rows, cols]. The FP8 form is kept when the slice keeps whole scale blocks
/// (fp8_cols_sliceable); otherwise only the exact fp32 copy (what the CPU computes with) remains.
Param cols_of(const Param& p, int64_t rows, int64_t cols, Range c) {
  if (p.empty()) return {};
  need_host(p);
  std::vector<float> out(size_t(rows * c.count));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(p.host.begin() + r * cols + c.begin, p.host.begin() + r * cols + c.begin + c.count,
              out.begin() + r * c.count);
  Param q(std::move(out));
  if (p.fp8 && fp8_cols_sliceable(cols, c.begin, c.count))
    q.fp8 = std::make_shared<Fp8Weight>(fp8_slice_cols(*p.fp8, c.begin, c.count));
  return q;
}

Param copy(const Param& p) {
  need_host(p);
  return p;  // device pointers are never set on the host copies given here
}

/// Column-parallel: the rows in `ranges` of l (and of its bias).
Linear col_parallel(const Linear& l, const std::vector<Range>& ranges) {
  Linear o;
  o.in = l.in;
  for (const Range& r : ranges) o.out += r.count;
  o.w = rows_of(l.w, l.in, ranges);
  o.b = rows_of(l.b, 1, ranges);
  return o;
}

/// Row-parallel: columns c of l; the bias (added once to the reduced sum) on rank 0 only.
Linear row_parallel(const Linear& l, Range c, int rank) {
  Linear o;
  o.out = l.out;
  o.in = c.count;
  o.w = cols_of(l.w, l.out, l.in, c);
  if (rank == 0) o.b = copy(l.b);
  return o;
}

Linear replicated(const Linear& l) { return {l.out, l.in, copy(l.w), copy(l.b)}; }

Range scaled(Range r, int64_t k) { return {r.begin * k, r.count * k}; }
Range offset(Range r, int64_t by) { return {r.begin + by, r.count}; }

}  // namespace

ModelWeights shard_weights(const ModelConfig& c, const ModelWeights& w, const RankShard& s) {
  const int64_t H = c.hidden_size;
  ModelWeights o;
  o.embed = rows_of(w.embed, H, {s.vocab});
  o.final_norm = copy(w.final_norm);
  if (!w.lm_head.empty()) o.lm_head = rows_of(w.lm_head, H, {s.vocab});
  o.layers.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    LayerWeights& O = o.layers[l];
    O.input_norm = copy(L.input_norm);
    O.post_attention_norm = copy(L.post_attention_norm);
    if (c.layer_types[l] == LayerType::LinearAttention) {
      const DeltaNetWeights& g = L.gdn;
      DeltaNetWeights& G = O.gdn;
      const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, kd = c.key_dim();
      const Range q = scaled(s.k_heads, dk), v = scaled(s.v_heads, dv);
      const std::vector<Range> qkv{q, offset(q, kd), offset(v, 2 * kd)};
      G.in_proj_qkv = col_parallel(g.in_proj_qkv, qkv);
      G.in_proj_z = col_parallel(g.in_proj_z, {v});
      G.in_proj_b = col_parallel(g.in_proj_b, {s.v_heads});
      G.in_proj_a = col_parallel(g.in_proj_a, {s.v_heads});
      G.conv1d = rows_of(g.conv1d, c.linear_conv_kernel_dim, qkv);  // channels follow their heads
      G.dt_bias = rows_of(g.dt_bias, 1, {s.v_heads});
      G.A_log = rows_of(g.A_log, 1, {s.v_heads});
      G.norm = copy(g.norm);  // per value head dim: the same for every head
      G.out_proj = row_parallel(g.out_proj, v, s.rank);
    } else if (c.mla.enabled()) {  // per-head q_b_proj, kv_b_proj, o_proj; the rest replicated
      const MlaWeights& a = L.mla;
      MlaWeights& A = O.mla;
      A = a;
      const MlaConfig& m = c.mla;
      A.q_b_proj = col_parallel(a.q_b_proj, {scaled(s.q_heads, m.qk_head_dim())});
      A.kv_b_proj = col_parallel(a.kv_b_proj, {scaled(s.q_heads, m.qk_nope_head_dim + m.v_head_dim)});
      A.o_proj = row_parallel(a.o_proj, scaled(s.q_heads, m.v_head_dim), s.rank);
    } else {
      const AttentionWeights& a = L.attn;
      AttentionWeights& A = O.attn;
      const int64_t D = c.head_dim, per_q = c.attn_output_gate ? 2 * D : D;
      A.q_proj = col_parallel(a.q_proj, {scaled(s.q_heads, per_q)});
      A.k_proj = col_parallel(a.k_proj, {scaled(s.kv_heads, D)});
      A.v_proj = col_parallel(a.v_proj, {scaled(s.kv_heads, D)});
      A.o_proj = row_parallel(a.o_proj, scaled(s.q_heads, D), s.rank);
      A.q_norm = copy(a.q_norm);
      A.k_norm = copy(a.k_norm);
      for (auto [from, to] : {std::pair{&a.k_scale, &A.k_scale}, std::pair{&a.v_scale, &A.v_scale}})
        if (!from->empty())  // per KV head: the rank's heads
          to->assign(from->begin() + s.kv_heads.begin, from->begin() + s.kv_heads.begin + s.kv_heads.count);
    }
    if (c.layer_is_moe[l]) {
      const MoeWeights& m = L.moe;
      MoeWeights& M = O.moe;
      const int64_t I = c.moe_intermediate_size;
      M.router = replicated(m.router);
      M.e_score_correction_bias = copy(m.e_score_correction_bias);
      std::vector<Range> gu, dn;
      for (int64_t e = s.experts.begin; e < s.experts.begin + s.experts.count; ++e) {
        gu.push_back(offset(s.expert_cols, e * 2 * I));
        gu.push_back(offset(s.expert_cols, e * 2 * I + I));
        dn.push_back({e * H, H});
      }
      M.gate_up = rows_of(m.gate_up, H, gu);
      M.down = cols_of(rows_of(m.down, I, dn), s.experts.count * H, I, s.expert_cols);
      if (const int64_t Is = c.shared_expert_intermediate_size; Is > 0) {
        M.shared_gate_up = col_parallel(m.shared_gate_up, {s.shared_cols, offset(s.shared_cols, Is)});
        M.shared_down = row_parallel(m.shared_down, s.shared_cols, s.rank);
        if (!m.shared_expert_gate.w.empty()) M.shared_expert_gate = replicated(m.shared_expert_gate);
      }
    } else {
      const MlpWeights& m = L.mlp;
      const int64_t I = c.intermediate_size;
      O.mlp.gate_up = col_parallel(m.gate_up, {s.mlp_cols, offset(s.mlp_cols, I)});
      O.mlp.down = row_parallel(m.down, s.mlp_cols, s.rank);
    }
  }
  return o;
}

void pad_expert_columns(ModelConfig& c, ModelWeights& w, int64_t multiple) {
  MOEFOLD_CHECK(multiple >= 1, "pad_expert_columns: multiple {} must be >= 1", multiple);
  const int64_t I = c.moe_intermediate_size, H = c.hidden_size;
  if (I == 0 || I % multiple == 0) return;
  const int64_t Ip = (I + multiple - 1) / multiple * multiple;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    if (!c.layer_is_moe[l]) continue;
    MoeWeights& m = w.layers[l].moe;
    need_host(m.gate_up);
    need_host(m.down);
    MOEFOLD_CHECK(!m.gate_up.fp8 && !m.down.fp8, "pad_expert_columns: layer {}'s experts are FP8 (not padded)", l);
    const int64_t E = m.gate_up.numel / (2 * I * H);
    MOEFOLD_CHECK(m.gate_up.numel == E * 2 * I * H && m.down.numel == E * H * I,
                  "pad_expert_columns: layer {}'s experts are not [E, 2 x {}, {}] and [E, {}, {}]", l, I, H, H, I);
    std::vector<float> gu(static_cast<size_t>(E * 2 * Ip * H), 0.0f), dn(static_cast<size_t>(E * H * Ip), 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t half = 0; half < 2; ++half)
        std::copy_n(m.gate_up.host.begin() + (e * 2 * I + half * I) * H, I * H,
                    gu.begin() + (e * 2 * Ip + half * Ip) * H);
      for (int64_t h = 0; h < H; ++h)
        std::copy_n(m.down.host.begin() + (e * H + h) * I, I, dn.begin() + (e * H + h) * Ip);
    }
    m.gate_up = Param(std::move(gu));
    m.down = Param(std::move(dn));
  }
  c.moe_intermediate_size = Ip;
}

}  // namespace moefold
