// The DeepSeek-V3.2 attention layer of the CPU forward (transformers DeepseekV32Attention and
// DeepseekV32Indexer), in the absorbed MQA form over the latent cache (ops/cpu/mla.h):
//   c_q = RMSNorm(q_a_proj(x));  q = q_b_proj(c_q) per head [q_nope | q_pe]
//   [c_kv | k_pe] = kv_a_proj_with_mqa(x);  c_kv = RMSNorm(c_kv);  q_pe, k_pe = RoPE_interleaved(YaRN)
//   cache k <- [c_kv | k_pe]  (one entry per token shared by all heads)
//   indexer: q_i = RoPE_half(wq_b(c_q)), k_i = RoPE_half(LayerNorm(wk(x))), w = weights_proj(x);
//            cache v <- k_i;  keep = top index_topk of sum_h w_h / sqrt(H) relu(q_ih . k_ij / sqrt(D))
//            over the real context j <= position (everything while it is no longer than index_topk)
//   o_h = MLA(q_h, cache entries of `keep`);  out = o_proj(o)
// The rest of the decoder layer (norms, residuals, MoE with grouped routing) is Model::forward's.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/profiler.h"
#include "models/model.h"
#include "ops/cpu/lightning_indexer.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/mla.h"
#include "ops/cpu/norm.h"
#include "ops/cpu/yarn_rope.h"

namespace moefold {

using namespace cpu;

namespace {

using prof::Category;
const prof::Kernel kMlaNorm{"cpu::rms_norm:mla", Category::NormRope};
const prof::Kernel kMlaRope{"cpu::apply_rope_interleaved", Category::NormRope};
const prof::Kernel kIndexerNorm{"cpu::layer_norm:indexer_k", Category::NormRope};
const prof::Kernel kIndexerRope{"cpu::apply_rope_half:indexer", Category::NormRope};
const prof::Kernel kLatentWrite{"cpu::latent_cache_write", Category::Glue};
const prof::Kernel kIndexerScores{"cpu::indexer_scores", Category::AttentionPrefill};
const prof::Kernel kIndexerTopk{"cpu::indexer_topk", Category::AttentionPrefill};
const prof::Kernel kMlaPrefill{"cpu::mla_attention:prefill", Category::AttentionPrefill};
const prof::Kernel kMlaDecode{"cpu::mla_attention:decode", Category::AttentionDecode};

template <class F>
void timed(const prof::Kernel& k, prof::Work w, F&& f) {
  prof::HostScope scope(k, w);
  f();
}
prof::Work rw(double read, double written, double flops = 0) { return {4.0 * (read + written), flops}; }

// transformers builds q_a_layernorm, kv_a_layernorm and the indexer's k_norm with eps 1e-6 whatever
// rms_norm_eps says.
constexpr float kMlaNormEps = 1e-6f;

}  // namespace

void Model::mla_attention(size_t l, const ForwardBatch& b, const float* x, float* out, KvCache& kv) const {
  const MlaWeights& w = w_.layers[l].mla;
  const MlaConfig& a = cfg_.mla;
  const int64_t T = b.num_rows(), nh = cfg_.num_heads, QL = a.q_lora_rank, R = a.kv_lora_rank;
  const int64_t dr = a.qk_rope_head_dim, Hi = a.index_n_heads, Di = a.index_head_dim, E = R + dr;
  const MlaShape s{nh, a.qk_nope_head_dim, dr, a.v_head_dim, R};
  MOEFOLD_CHECK(kv.kv_dim == E && kv.v_dim == Di, "KV cache pages hold {} + {} floats per token, MLA needs {} + {}",
                kv.kv_dim, kv.v_dim, E, Di);
  std::vector<float> cq(static_cast<size_t>(T * QL)), q(static_cast<size_t>(T * nh * s.q_dim())),
      ckv(static_cast<size_t>(T * E)), iq(static_cast<size_t>(T * Hi * Di)), ik(static_cast<size_t>(T * Di)),
      iw(static_cast<size_t>(T * Hi)), o(static_cast<size_t>(T * nh * s.v_head));
  // Query: low-rank with an RMSNorm in the middle.
  proj(w.q_a_proj, x, cq.data(), T);
  timed(kMlaNorm, rw(double(T * QL + QL), double(T * QL)),
        [&] { rms_norm(cq.data(), w.q_a_norm.data(), cq.data(), T, QL, kMlaNormEps, NormKind::Plain); });
  proj(w.q_b_proj, cq.data(), q.data(), T);
  // Latent: [c_kv | k_pe] per token; only c_kv is normalised.
  proj(w.kv_a_proj, x, ckv.data(), T);
  timed(kMlaNorm, rw(double(T * R + R), double(T * R)), [&] {
    for (int64_t t = 0; t < T; ++t)
      rms_norm(&ckv[size_t(t * E)], w.kv_a_norm.data(), &ckv[size_t(t * E)], 1, R, kMlaNormEps, NormKind::Plain);
  });
  const double rope_elems = double(T) * (nh + 1) * dr;
  timed(kMlaRope, rw(rope_elems, rope_elems), [&] {
    apply_rope_interleaved(q.data(), b.positions.data(), T, nh, s.q_dim(), s.qk_nope, dr, inv_freq_.data(),
                           rope_attention_factor_);
    apply_rope_interleaved(ckv.data(), b.positions.data(), T, 1, E, R, dr, inv_freq_.data(), rope_attention_factor_);
  });
  // Indexer query, key and head weights.
  const IndexerWeights& ix = w.indexer;
  proj(ix.wq_b, cq.data(), iq.data(), T);
  proj(ix.wk, x, ik.data(), T);
  timed(kIndexerNorm, rw(double(T * Di + 2 * Di), double(T * Di)), [&] {
    layer_norm(ik.data(), ix.k_norm.data(), ix.k_norm_bias.data(), ik.data(), T, Di, kMlaNormEps);
  });
  const double irope = double(T) * (Hi + 1) * dr;
  timed(kIndexerRope, rw(irope, irope), [&] {
    apply_rope_half_scaled(iq.data(), b.positions.data(), T, Hi, Di, dr, inv_freq_.data(), rope_attention_factor_);
    apply_rope_half_scaled(ik.data(), b.positions.data(), T, 1, Di, dr, inv_freq_.data(), rope_attention_factor_);
  });
  proj(ix.weights_proj, x, iw.data(), T);

  std::vector<float> scores;
  std::vector<int32_t> keys;
  for (int32_t sq = 0; sq < b.num_seqs(); ++sq) {
    const int64_t r0 = b.cu_seqlens[size_t(sq)], n = b.cu_seqlens[size_t(sq + 1)] - r0, start = b.context_lens[size_t(sq)];
    if (n == 0) continue;
    MOEFOLD_CHECK((start + n + kv.block_size - 1) / kv.block_size <= b.max_blocks_per_seq,
                  "sequence {} needs more KV blocks than its block table holds", sq);
    const int32_t* bt = b.block_table(sq);
    timed(kLatentWrite, rw(double(n * (E + Di)), double(n * (E + Di))), [&] {
      paged_rows_write(&ckv[size_t(r0 * E)], kv.k[l].data(), bt, start, n, kv.block_size, E);
      paged_rows_write(&ik[size_t(r0 * Di)], kv.v[l].data(), bt, start, n, kv.block_size, Di);
    });
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = r0 + i, n_ctx = start + i + 1;  // the real context of this row, itself included
      keys.resize(size_t(n_ctx));
      int64_t n_keys = n_ctx;
      if (n_ctx <= a.index_topk) {
        std::iota(keys.begin(), keys.end(), 0);
      } else {
        scores.resize(size_t(n_ctx));
        timed(kIndexerScores, rw(double(Hi * Di + Hi) + double(n_ctx * Di), double(n_ctx), 2.0 * n_ctx * Hi * Di), [&] {
          indexer_scores(&iq[size_t(r * Hi * Di)], &iw[size_t(r * Hi)], kv.v[l].data(), bt, kv.block_size, n_ctx, Hi,
                         Di, scores.data());
        });
        timed(kIndexerTopk, rw(double(n_ctx), double(a.index_topk)),
              [&] { n_keys = indexer_topk(scores.data(), n_ctx, a.index_topk, keys.data()); });
      }
      // The absorbed form: q absorb (heads x nope x R), the scores and the weighted latent sum over the
      // kept entries (heads x keys x (2R + rope)), the value up-projection (heads x v x R).
      const double flops = 2.0 * nh * (s.qk_nope * R + double(n_keys) * (2 * R + dr) + s.v_head * R);
      const prof::Work work = rw(double(nh * s.q_dim()) + double(n_keys * E) + double(nh * (s.qk_nope + s.v_head) * R),
                                 double(nh * s.v_head), flops);
      timed(n == 1 && start > 0 ? kMlaDecode : kMlaPrefill, work, [&] {
        mla_attention_row(&q[size_t(r * nh * s.q_dim())], w.kv_b_proj.w.data(), kv.k[l].data(), bt, kv.block_size,
                          keys.data(), n_keys, s, float(a.softmax_scale), &o[size_t(r * nh * s.v_head)]);
      });
    }
  }
  proj(w.o_proj, o.data(), out, T);
}

}  // namespace moefold
