#include "models/deepseek_v4.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cpu/dsv4_attention.h"
#include "ops/cpu/dsv4_mhc.h"
#include "ops/cpu/dsv4_moe.h"
#include "ops/cpu/dsv4_rope.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/norm.h"

namespace moefold {

using namespace cpu;

namespace {

std::vector<float> proj(const Linear& l, const float* x, int64_t T) {
  std::vector<float> y(static_cast<size_t>(T * l.out));
  linear(x, l.w.data(), l.b.empty() ? nullptr : l.b.data(), y.data(), T, l.in, l.out);
  return y;
}

void rms(float* x, const Param* w, int64_t rows, int64_t dim, float eps) {
  if (w) {
    rms_norm(x, w->data(), x, rows, dim, eps, NormKind::Plain);
    return;
  }
  std::vector<float> ones(static_cast<size_t>(dim), 1.0f);
  rms_norm(x, ones.data(), x, rows, dim, eps, NormKind::Plain);
}

}  // namespace

DeepseekV4Model::DeepseekV4Model(DeepseekV4Config cfg, Dsv4Weights w) : cfg_(std::move(cfg)), w_(std::move(w)) {
  inv_main_ = dsv4_inv_freq(cfg_.rope_theta, cfg_.rope_dim, 0, 0, 0, 0);
  inv_compress_ = dsv4_inv_freq(cfg_.compress_rope_theta, cfg_.rope_dim, cfg_.yarn_factor, cfg_.yarn_beta_fast,
                                cfg_.yarn_beta_slow, cfg_.yarn_original_max);
}

Dsv4Cache DeepseekV4Model::new_cache() const {
  Dsv4Cache c;
  c.layers.resize(size_t(cfg_.num_layers));
  return c;
}

// One compressor over T new rows x [T, H]: project, append to the unfinished window, and turn every
// finished window w (source positions w m .. w m + m - 1) into one entry:
//   HCA: e = sum_i softmax_i(gate_i + ape_i) kv_i                      (m slots, per channel)
//   CSA: slots = [first halves of window w-1 | second halves of window w] (2m slots; w = 0: m)
//   e = RMSNorm(e) with the compressor's weight, rotated at position w m (compressed RoPE).
void DeepseekV4Model::compress(const Dsv4CompressorWeights& w, Dsv4CompressorState& st, int64_t m, int64_t dim,
                               bool overlap, const float* x, int64_t T) const {
  const int64_t width = overlap ? 2 * dim : dim;
  std::vector<float> kv = proj(w.wkv, x, T), gate = proj(w.wgate, x, T);
  st.buf_kv.insert(st.buf_kv.end(), kv.begin(), kv.end());
  st.buf_gate.insert(st.buf_gate.end(), gate.begin(), gate.end());
  const float* ape = w.ape.data();
  while (int64_t(st.buf_kv.size()) >= m * width) {
    const float* bk = st.buf_kv.data();
    const float* bg = st.buf_gate.data();
    std::vector<float> val, score;  // [slots, dim]
    if (overlap && !st.prev_kv.empty()) {
      val = st.prev_kv;
      score = st.prev_gate;
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t d = 0; d < dim; ++d) {
        const int64_t c = overlap ? dim + d : d;
        val.push_back(bk[i * width + c]);
        score.push_back(bg[i * width + c] + ape[i * width + c]);
      }
    std::vector<float> e(static_cast<size_t>(dim));
    softmax_pool(val.data(), dim, score.data(), dim, int64_t(val.size()) / dim, dim, e.data());
    rms_norm(e.data(), w.norm.data(), e.data(), 1, dim, float(cfg_.rms_norm_eps), NormKind::Plain);
    dsv4_rope_inplace(e.data(), 1, dim, cfg_.rope_dim, inv_compress_, st.n_entries * m);
    st.entries.insert(st.entries.end(), e.begin(), e.end());
    ++st.n_entries;
    if (overlap) {  // this window's first halves (gate with its position bias) feed the next entry
      st.prev_kv.assign(size_t(m * dim), 0.0f);
      st.prev_gate.assign(size_t(m * dim), 0.0f);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t d = 0; d < dim; ++d) {
          st.prev_kv[size_t(i * dim + d)] = bk[i * width + d];
          st.prev_gate[size_t(i * dim + d)] = bg[i * width + d] + ape[i * width + d];
        }
    }
    st.buf_kv.erase(st.buf_kv.begin(), st.buf_kv.begin() + m * width);
    st.buf_gate.erase(st.buf_gate.begin(), st.buf_gate.begin() + m * width);
  }
}

// Attention of one layer for T rows at positions start .. start+T-1 (x: the normed collapsed stream).
void DeepseekV4Model::attention(size_t l, Dsv4LayerCache& c, int64_t start, const float* x, int64_t T,
                                float* out) const {
  const Dsv4LayerWeights& L = w_.layers[l];
  const int64_t nh = cfg_.num_heads, D = cfg_.head_dim, rd = cfg_.rope_dim, W = cfg_.sliding_window;
  const int32_t ratio = cfg_.compress_ratios[l];
  const float eps = float(cfg_.rms_norm_eps);
  const std::vector<double>& inv = ratio == 0 ? inv_main_ : inv_compress_;

  std::vector<float> qr = proj(L.wq_a, x, T);
  rms(qr.data(), &L.q_norm, T, cfg_.q_lora_rank, eps);
  std::vector<float> q = proj(L.wq_b, qr.data(), T);  // [T, nh, D]
  rms(q.data(), nullptr, T * nh, D, eps);
  std::vector<float> kv = proj(L.wkv, x, T);  // [T, D]
  rms(kv.data(), &L.kv_norm, T, D, eps);
  for (int64_t t = 0; t < T; ++t) {
    dsv4_rope_inplace(q.data() + t * nh * D, nh, D, rd, inv, start + t);
    dsv4_rope_inplace(kv.data() + t * D, 1, D, rd, inv, start + t);
  }
  // Window keys: cached tokens start - nw .. start - 1, then this chunk.
  const int64_t nw = int64_t(c.window.size()) / D;
  std::vector<float> keys = c.window;
  keys.insert(keys.end(), kv.begin(), kv.end());

  // Lightning indexer inputs (CSA).
  std::vector<float> iq, iw;
  const int64_t ih = cfg_.index_n_heads, id = cfg_.index_head_dim;
  if (ratio > 0) compress(L.comp, c.comp, ratio, D, ratio == 4, x, T);
  if (ratio == 4) {
    compress(L.index_comp, c.index_comp, ratio, id, true, x, T);
    iq = proj(L.index_wq_b, qr.data(), T);  // [T, ih, id]
    for (int64_t t = 0; t < T; ++t) dsv4_rope_inplace(iq.data() + t * ih * id, ih, id, rd, inv_compress_, start + t);
    iw = proj(L.index_weights_proj, x, T);
    for (auto& v : iw) v *= 1.0f / std::sqrt(float(ih));
  }

  std::vector<float> att(static_cast<size_t>(T * nh * D)), sel, score;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = start + t;
    const int64_t first = std::max(p - W + 1, start - nw);  // oldest window position in view
    const int64_t lo = first - (start - nw), hi = nw + t + 1;  // rows of `keys`
    sel.assign(keys.begin() + lo * D, keys.begin() + hi * D);
    if (ratio > 0) {
      const int64_t vis = std::min(c.comp.n_entries, (p + 1) / ratio);
      if (ratio == 128) {
        sel.insert(sel.end(), c.comp.entries.begin(), c.comp.entries.begin() + vis * D);
      } else {
        score.resize(size_t(vis));
        indexer_scores(iq.data() + t * ih * id, iw.data() + t * ih, c.index_comp.entries.data(), vis, ih, id,
                       score.data());
        for (int32_t e : topk_indices(score.data(), vis, cfg_.index_topk))
          sel.insert(sel.end(), c.comp.entries.begin() + e * D, c.comp.entries.begin() + (e + 1) * D);
      }
    }
    float* o = att.data() + t * nh * D;
    sink_attention(q.data() + t * nh * D, sel.data(), int64_t(sel.size()) / D, L.attn_sink.data(), nh, D,
                   1.0f / std::sqrt(float(D)), o);
    dsv4_rope_inplace(o, nh, D, rd, inv, p, -1);  // K = V carried the key's rotation: undo it at p
  }
  // Keep the last W tokens for the next call.
  const int64_t total = nw + T, keep = std::min(total, W);
  c.window.assign(keys.end() - keep * D, keys.end());

  const int64_t g = cfg_.o_groups, gin = nh * D / g, gout = cfg_.o_lora_rank;
  std::vector<float> y(static_cast<size_t>(T * g * gout));
  grouped_linear(att.data(), L.wo_a.w.data(), y.data(), T, g, gin, gout);
  linear(y.data(), L.wo_b.w.data(), nullptr, out, T, g * gout, cfg_.hidden_size);
}

void DeepseekV4Model::moe(size_t l, const float* x, const int32_t* tokens, int64_t T, float* out) const {
  const Dsv4LayerWeights& L = w_.layers[l];
  const int64_t H = cfg_.hidden_size, E = cfg_.num_experts, k = cfg_.num_experts_per_tok, I = cfg_.moe_intermediate_size;
  const float limit = float(cfg_.swiglu_limit);
  std::vector<float> logits = proj(L.gate, x, T), wts(static_cast<size_t>(T * k));
  std::vector<int32_t> idx(static_cast<size_t>(T * k)), hash;
  const bool is_hash = cfg_.is_hash_layer(int64_t(l));
  if (is_hash) {
    hash.resize(size_t(T * k));
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(L.tid2eid.begin() + tokens[t] * k, k, hash.begin() + t * k);
  }
  dsv4_route(logits.data(), is_hash || L.gate_bias.empty() ? nullptr : L.gate_bias.data(),
             is_hash ? hash.data() : nullptr, T, E, k, float(cfg_.routed_scaling_factor), cfg_.scoring_func,
             idx.data(), wts.data());
  // Shared expert (the same clamped SwiGLU).
  std::vector<float> gu = proj(L.shared_gate_up, x, T), act(static_cast<size_t>(T * I));
  clamped_swiglu(gu.data(), act.data(), T, I, limit);
  linear(act.data(), L.shared_down.w.data(), nullptr, out, T, I, H);
  std::vector<float> g1(static_cast<size_t>(2 * I)), a1(static_cast<size_t>(I)), o1(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx[size_t(t * k + j)];
      linear(x + t * H, L.gate_up.data() + e * 2 * I * H, nullptr, g1.data(), 1, H, 2 * I);
      clamped_swiglu(g1.data(), a1.data(), 1, I, limit);
      linear(a1.data(), L.down.data() + e * H * I, nullptr, o1.data(), 1, I, H);
      const float wt = wts[size_t(t * k + j)];
      for (int64_t d = 0; d < H; ++d) out[t * H + d] += wt * o1[size_t(d)];
    }
}

std::vector<float> DeepseekV4Model::forward(Dsv4Cache& cache, std::span<const int32_t> tokens) const {
  const int64_t T = int64_t(tokens.size()), H = cfg_.hidden_size, hc = cfg_.hc_mult, V = cfg_.vocab_size;
  MOEFOLD_CHECK(int64_t(cache.layers.size()) == cfg_.num_layers, "Dsv4Cache has {} layers, model {}",
                cache.layers.size(), cfg_.num_layers);
  for (int32_t id : tokens)
    if (id < 0 || id >= V) fail("token id {} is outside the vocabulary [0, {})", id, V);
  const float eps = float(cfg_.rms_norm_eps), hc_eps = float(cfg_.hc_eps);
  std::vector<float> X(static_cast<size_t>(T * hc * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j)
      std::copy_n(w_.embed.data() + tokens[size_t(t)] * H, H, X.data() + (t * hc + j) * H);
  std::vector<float> pre(static_cast<size_t>(T * hc)), post(static_cast<size_t>(T * hc)), comb(static_cast<size_t>(T * hc * hc)), col(static_cast<size_t>(T * H)),
      out(size_t(T * H));
  for (size_t l = 0; l < size_t(cfg_.num_layers); ++l) {
    const Dsv4LayerWeights& L = w_.layers[l];
    mhc_mix(X.data(), L.hc_attn_fn.data(), L.hc_attn_base.data(), L.hc_attn_scale.data(), T, hc, H,
            cfg_.hc_sinkhorn_iters, hc_eps, eps, pre.data(), post.data(), comb.data(), col.data());
    rms(col.data(), &L.attn_norm, T, H, eps);
    attention(l, cache.layers[l], cache.len, col.data(), T, out.data());
    mhc_expand(X.data(), out.data(), post.data(), comb.data(), T, hc, H);
    mhc_mix(X.data(), L.hc_ffn_fn.data(), L.hc_ffn_base.data(), L.hc_ffn_scale.data(), T, hc, H,
            cfg_.hc_sinkhorn_iters, hc_eps, eps, pre.data(), post.data(), comb.data(), col.data());
    rms(col.data(), &L.ffn_norm, T, H, eps);
    moe(l, col.data(), tokens.data(), T, out.data());
    mhc_expand(X.data(), out.data(), post.data(), comb.data(), T, hc, H);
  }
  cache.len += T;
  mhc_head(X.data(), w_.hc_head_fn.data(), w_.hc_head_base.data(), w_.hc_head_scale.data(), T, hc, H, hc_eps, eps,
           col.data());
  rms(col.data(), &w_.norm, T, H, eps);
  std::vector<float> logits(static_cast<size_t>(T * V));
  linear(col.data(), w_.head.data(), nullptr, logits.data(), T, H, V);
  return logits;
}

std::vector<std::vector<float>> DeepseekV4Model::forward_batch(std::span<Dsv4Cache*> caches,
                                                               std::span<const std::vector<int32_t>> chunks) const {
  MOEFOLD_CHECK(caches.size() == chunks.size(), "forward_batch: {} caches for {} chunks", caches.size(), chunks.size());
  std::vector<std::vector<float>> out(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) out[i] = forward(*caches[i], chunks[i]);
  return out;
}

}  // namespace moefold
