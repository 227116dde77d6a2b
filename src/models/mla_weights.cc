#include "models/mla_weights.h"

namespace moefold {

namespace {

Linear linear(WeightSource& src, const std::string& name, int64_t out, int64_t in, bool may_defer = true) {
  Linear l;
  l.out = out;
  l.in = in;
  l.w = src.load_param({name + ".weight", {out, in}, TensorRole::Linear}, may_defer);
  return l;
}

}  // namespace

void load_mla_weights(const ModelConfig& c, WeightSource& src, const std::string& p, MlaWeights& m) {
  const MlaConfig& a = c.mla;
  const int64_t H = c.hidden_size, nh = c.num_heads;
  m.q_a_proj = linear(src, p + "q_a_proj", a.q_lora_rank, H);
  m.q_a_norm = src.load({p + "q_a_layernorm.weight", {a.q_lora_rank}, TensorRole::NormPlain});
  m.q_b_proj = linear(src, p + "q_b_proj", nh * a.qk_head_dim(), a.q_lora_rank);
  m.kv_a_proj = linear(src, p + "kv_a_proj_with_mqa", a.kv_lora_rank + a.qk_rope_head_dim, H);
  m.kv_a_norm = src.load({p + "kv_a_layernorm.weight", {a.kv_lora_rank}, TensorRole::NormPlain});
  // kv_b_proj is read per head by the absorbed attention: always materialised.
  m.kv_b_proj = linear(src, p + "kv_b_proj", nh * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, false);
  m.o_proj = linear(src, p + "o_proj", H, nh * a.v_head_dim);
  IndexerWeights& ix = m.indexer;
  const std::string ip = p + "indexer.";
  ix.wq_b = linear(src, ip + "wq_b", a.index_n_heads * a.index_head_dim, a.q_lora_rank);
  ix.wk = linear(src, ip + "wk", a.index_head_dim, H);
  ix.k_norm = src.load({ip + "k_norm.weight", {a.index_head_dim}, TensorRole::NormPlain});
  ix.k_norm_bias = src.load({ip + "k_norm.bias", {a.index_head_dim}, TensorRole::Bias});
  ix.weights_proj = linear(src, ip + "weights_proj", a.index_n_heads, H);
}

void for_each_param(MlaWeights& m, const std::function<void(Param&)>& fn) {
  IndexerWeights& ix = m.indexer;
  for (Param* p : {&m.q_a_proj.w, &m.q_a_norm, &m.q_b_proj.w, &m.kv_a_proj.w, &m.kv_a_norm, &m.kv_b_proj.w, &m.o_proj.w,
                   &ix.wq_b.w, &ix.wk.w, &ix.k_norm, &ix.k_norm_bias, &ix.weights_proj.w})
    if (!p->empty()) fn(*p);
}

}  // namespace moefold
