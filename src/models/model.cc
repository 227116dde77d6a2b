#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_block.h"
#include "core/profiler.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/gated_delta_net.h"
#include "ops/cpu/grouped_router.h"
#include "ops/cpu/yarn_rope.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/moe.h"
#include "ops/cpu/norm.h"
#include "ops/cpu/rope.h"
#include "parallel/communicator.h"
#include "parallel/expert_dispatch.h"

namespace moefold {

using namespace cpu;

namespace {

// Every op of the forward is a registry entry (core/kernel_registry.h): counted always, timed while a
// profile window is open, with its bytes (fp32: 4 per element, read + written) and FLOPs.
using prof::Category;
const prof::Kernel kEmbed{"cpu::embedding", Category::Glue};
const prof::Kernel kRmsNorm{"cpu::rms_norm", Category::NormRope};
const prof::Kernel kLinear{"cpu::linear", Category::DenseGemm};
const prof::Kernel kLmHead{"cpu::linear:lm_head", Category::DenseGemm};
const prof::Kernel kRouter{"cpu::linear:router", Category::MoeRouting};
const prof::Kernel kSharedGate{"cpu::linear:shared_expert_gate", Category::MoeRouting};
const prof::Kernel kRoundBf16{"cpu::round_bf16", Category::Glue};
const prof::Kernel kResidual{"cpu::residual_add", Category::Other};
const prof::Kernel kSplit{"cpu::split_heads", Category::Glue};
const prof::Kernel kRope{"cpu::apply_rope", Category::NormRope};
const prof::Kernel kKvWrite{"cpu::kv_cache_write", Category::Glue};
const prof::Kernel kAttnPrefill{"cpu::paged_attention:prefill", Category::AttentionPrefill};
const prof::Kernel kAttnDecode{"cpu::paged_attention:decode", Category::AttentionDecode};
const prof::Kernel kOutputGate{"cpu::sigmoid_gate_mul", Category::Other};
const prof::Kernel kGdnGating{"cpu::gdn_gating", Category::DeltaNet};
const prof::Kernel kConv{"cpu::causal_conv1d_silu", Category::Conv};
const prof::Kernel kGdnRecurrent{"cpu::gated_delta_rule_recurrent", Category::DeltaNet};
const prof::Kernel kGdnChunked{"cpu::gated_delta_rule_chunked", Category::DeltaNet};
const prof::Kernel kGatedNorm{"cpu::gated_rms_norm", Category::NormRope};
const prof::Kernel kTopk{"cpu::router_topk", Category::MoeRouting};
const prof::Kernel kGroupedTopk{"cpu::grouped_topk", Category::MoeRouting};
const prof::Kernel kZero{"cpu::zero_fill", Category::Glue};
const prof::Kernel kExperts{"cpu::moe_experts", Category::RoutedExpertGemm};
const prof::Kernel kSwiglu{"cpu::swiglu", Category::Other};
const prof::Kernel kSharedCombine{"cpu::shared_expert_combine", Category::MoeRouting};
// Tensor / expert parallel collectives (CPU communicator: shared-memory copies and sums).
const prof::Kernel kAllReduce{"cpu::all_reduce", Category::Communication};
const prof::Kernel kAllGather{"cpu::all_gather:logits", Category::Communication};

/// Runs f as one call of op k (a HostScope around it).
template <class F>
void timed(const prof::Kernel& k, prof::Work w, F&& f) {
  prof::HostScope scope(k, w);
  f();
}

/// fp32 bytes of n elements read once and m written once.
prof::Work rw(double read, double written, double flops = 0) { return {4.0 * (read + written), flops}; }

prof::Work linear_work(const Linear& l, int64_t T) {
  return rw(double(T) * l.in + double(l.in) * l.out + (l.b.empty() ? 0.0 : double(l.out)), double(T) * l.out,
            2.0 * double(T) * l.in * l.out);
}

void project(const prof::Kernel& k, const Linear& l, const float* x, float* y, int64_t T) {
  timed(k, linear_work(l, T), [&] { linear(x, l.w.data(), l.b.empty() ? nullptr : l.b.data(), y, T, l.in, l.out); });
}

}  // namespace

void Model::round_act(float* p, int64_t n) const {
  if (!emulate_bf16_) return;
  timed(kRoundBf16, rw(double(n), double(n)), [&] {
    for (int64_t i = 0; i < n; ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
  });
}

void Model::proj(const Linear& l, const float* x, float* y, int64_t T) const {
  if (emulate_fp8_act_ && l.w.fp8) {
    std::vector<float> xq(x, x + T * l.in);
    fp8_fake_quantize_activations(xq.data(), T, l.in);
    project(kLinear, l, xq.data(), y, T);
    round_act(y, T * l.out);
    return;
  }
  project(kLinear, l, x, y, T);
  round_act(y, T * l.out);
}

Model::Model(ModelConfig cfg, ModelWeights weights, ShardContext shard) : Model(std::move(cfg), std::move(weights)) {
  shard_ = std::move(shard);
  MOEFOLD_CHECK(!shard_.comm || shard_.comm->world_size() == shard_.shard.world,
                "Model: a shard of a {}-rank group was given a communicator of {} ranks", shard_.shard.world,
                shard_.comm ? shard_.comm->world_size() : 0);
}

void Model::all_reduce(float* p, int64_t n) const {
  if (!sharded()) return;
  timed(kAllReduce, rw(double(n) * shard_.shard.world, double(n)), [&] { shard_.comm->all_reduce_sum(p, n); });
}

Model::Model(ModelConfig cfg, ModelWeights weights) : cfg_(std::move(cfg)), w_(std::move(weights)) {
  inv_freq_ = rope_inv_freq(cfg_.rotary_dim, cfg_.rope_theta, cfg_.rope_llama3_factor, cfg_.rope_llama3_low_freq,
                            cfg_.rope_llama3_high_freq, cfg_.rope_llama3_original_max);
  if (cfg_.yarn.factor > 0) {
    const YarnRopeConfig& y = cfg_.yarn;
    const YarnParams p{y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow, y.mscale, y.mscale_all_dim,
                       y.truncate};
    inv_freq_ = yarn_inv_freq(cfg_.rotary_dim, cfg_.rope_theta, p);
    rope_attention_factor_ = yarn_attention_factor(p);
  }
}

void Model::forward(const ForwardBatch& b, KvCache& kv, StatePool& st, std::vector<float>& logits,
                    RoutingControl routing) const {
  const int64_t T = b.num_rows(), H = cfg_.hidden_size, V = cfg_.vocab_size;
  MOEFOLD_CHECK(b.cu_seqlens.size() == size_t(b.num_seqs() + 1) && b.cu_seqlens.back() == T &&
                    b.positions.size() == size_t(T) && b.state_slots.size() == size_t(b.num_seqs()),
                "ForwardBatch is inconsistent: {} rows, {} sequences", T, b.num_seqs());
  const NormKind nk = cfg_.norm_zero_centred ? NormKind::ZeroCentred : NormKind::Plain;
  const float eps = float(cfg_.rms_norm_eps);
  prepare_routing(routing, cfg_, T);  // before any layer: a rejected replay changes nothing
  size_t moe_index = 0;

  // h = embed(tokens)
  std::vector<float> h(static_cast<size_t>(T * H)), x(static_cast<size_t>(T * H)), y(static_cast<size_t>(T * H));
  // Vocab-parallel: a rank holds rows [v0, v0 + vn) and zeros the others; the all-reduce adds each
  // row to zeros only, so h is the same bits as unsharded.
  const int64_t v0 = sharded() ? shard_.shard.vocab.begin : 0, vn = sharded() ? shard_.shard.vocab.count : V;
  timed(kEmbed, rw(double(T * H), double(T * H)), [&] {
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = b.token_ids[size_t(t)];
      MOEFOLD_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
      if (id >= v0 && id < v0 + vn)
        std::memcpy(&h[size_t(t * H)], w_.embed.data() + size_t(id - v0) * size_t(H), size_t(H) * 4);
    }
  });
  all_reduce(h.data(), T * H);
  const prof::Work norm_work = rw(double(T * H + H), double(T * H)), add_work = rw(2.0 * T * H, double(T * H));

  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& L = w_.layers[l];
    // h = h + Mixer(RMSNorm_in(h))
    timed(kRmsNorm, norm_work, [&] { rms_norm(h.data(), L.input_norm.data(), x.data(), T, H, eps, nk); });
    round_act(x.data(), T * H);
    if (cfg_.mla.enabled()) mla_attention(l, b, x.data(), y.data(), kv);
    else if (cfg_.layer_types[l] == LayerType::FullAttention) attention(l, b, x.data(), y.data(), kv);
    else deltanet(l, b, x.data(), y.data(), st);
    all_reduce(y.data(), T * H);  // row-parallel sum
    timed(kResidual, add_work, [&] { for (size_t i = 0; i < h.size(); ++i) h[i] += y[i]; });
    round_act(h.data(), T * H);
    // h = h + FFN(RMSNorm_post(h))
    timed(kRmsNorm, norm_work, [&] { rms_norm(h.data(), L.post_attention_norm.data(), x.data(), T, H, eps, nk); });
    round_act(x.data(), T * H);
    if (cfg_.layer_is_moe[l]) {
      moe(l, x.data(), y.data(), T, routing.replay ? routing.replay->layers[moe_index].data() : nullptr,
          routing.capture ? routing.capture->layers[moe_index].data() : nullptr);
      ++moe_index;
    } else {
      mlp(l, x.data(), y.data(), T);
    }
    all_reduce(y.data(), T * H);  // row-parallel / expert-parallel sum
    if (ffn_tap_) ffn_tap_(l, h.data(), x.data(), y.data(), T);
    timed(kResidual, add_work, [&] { for (size_t i = 0; i < h.size(); ++i) h[i] += y[i]; });
    round_act(h.data(), T * H);
  }

  // logits = lm_head(RMSNorm_final(h[logits_rows]))
  const int64_t R = int64_t(b.logits_rows.size());
  std::vector<float> hr(static_cast<size_t>(R * H));
  for (int64_t r = 0; r < R; ++r) {
    const int32_t row = b.logits_rows[size_t(r)];
    MOEFOLD_CHECK(row >= 0 && row < T, "logits row {} outside the batch's {} rows", row, T);
    timed(kRmsNorm, rw(double(2 * H), double(H)),
          [&] { rms_norm(&h[size_t(row) * size_t(H)], w_.final_norm.data(), &hr[size_t(r * H)], 1, H, eps, nk); });
  }
  round_act(hr.data(), R * H);
  logits.resize(size_t(R * V));
  if (!sharded()) {
    timed(kLmHead, rw(double(R * H + H * V), double(R * V), 2.0 * double(R) * H * V),
          [&] { linear(hr.data(), w_.lm_head_param().data(), nullptr, logits.data(), R, H, V); });
    return;
  }
  // Vocab-parallel lm_head: each rank's [R, vocab_shard] block (zero-padded), gathered in rank order.
  const int64_t N = shard_.shard.world, Vs = shard_.shard.vocab_shard;
  std::vector<float> part(static_cast<size_t>(R * Vs), 0.0f), all(static_cast<size_t>(N * R * Vs));
  std::vector<float> mine(static_cast<size_t>(R * vn));
  timed(kLmHead, rw(double(R * H + H * vn), double(R * vn), 2.0 * double(R) * H * vn),
        [&] { linear(hr.data(), w_.lm_head_param().data(), nullptr, mine.data(), R, H, vn); });
  for (int64_t r = 0; r < R; ++r) std::copy_n(&mine[size_t(r * vn)], vn, &part[size_t(r * Vs)]);
  timed(kAllGather, rw(double(R * Vs), double(N * R * Vs)), [&] { shard_.comm->all_gather(part.data(), all.data(), R * Vs); });
  for (int64_t k = 0; k < N; ++k) {
    const int64_t b0 = k * Vs, n = std::min(V, b0 + Vs) - std::min(V, b0);
    for (int64_t r = 0; r < R; ++r) std::copy_n(&all[size_t((k * R + r) * Vs)], n, &logits[size_t(r * V + b0)]);
  }
}

// Gated softmax attention (transformers Qwen3_5MoeAttention; Qwen3Attention and LlamaAttention are the
// special cases without output gate, and without q/k norm for Llama):
//   [q | gate] = q_proj(x), k = k_proj(x), v = v_proj(x); q, k = RMSNorm(q), RMSNorm(k) per head;
//   q, k = RoPE(q, k); o = softmax(q k^T / sqrt(D) + causal) v; o = o * sigmoid(gate); out = o_proj(o)
void Model::attention(size_t l, const ForwardBatch& b, const float* x, float* out, KvCache& kv) const {
  const AttentionWeights& a = w_.layers[l].attn;
  const int64_t T = b.num_rows(), Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  const NormKind nk = cfg_.norm_zero_centred ? NormKind::ZeroCentred : NormKind::Plain;
  std::vector<float> qg(static_cast<size_t>(T * a.q_proj.out)), q(static_cast<size_t>(T * Hq * D)), gate, k(static_cast<size_t>(T * Hkv * D)),
      v(static_cast<size_t>(T * Hkv * D)), o(static_cast<size_t>(T * Hq * D));
  proj(a.q_proj, x, qg.data(), T);
  proj(a.k_proj, x, k.data(), T);
  proj(a.v_proj, x, v.data(), T);
  if (cfg_.attn_output_gate) {  // per head: [query D | gate D]
    gate.resize(size_t(T * Hq * D));
    timed(kSplit, rw(2.0 * T * Hq * D, 2.0 * T * Hq * D), [&] {
      for (int64_t r = 0; r < T * Hq; ++r) {
        std::memcpy(&q[size_t(r * D)], &qg[size_t(r * 2 * D)], size_t(D) * 4);
        std::memcpy(&gate[size_t(r * D)], &qg[size_t(r * 2 * D + D)], size_t(D) * 4);
      }
    });
  } else {
    q.swap(qg);
  }
  if (cfg_.qk_norm) {
    timed(kRmsNorm, rw(double(T * Hq * D + D), double(T * Hq * D)),
          [&] { rms_norm(q.data(), a.q_norm.data(), q.data(), T * Hq, D, float(cfg_.rms_norm_eps), nk); });
    timed(kRmsNorm, rw(double(T * Hkv * D + D), double(T * Hkv * D)),
          [&] { rms_norm(k.data(), a.k_norm.data(), k.data(), T * Hkv, D, float(cfg_.rms_norm_eps), nk); });
    round_act(q.data(), T * Hq * D);
    round_act(k.data(), T * Hkv * D);
  }
  const double rope_elems = double(T) * (Hq + Hkv) * cfg_.rotary_dim;
  timed(kRope, rw(rope_elems, rope_elems), [&] {
    apply_rope(q.data(), b.positions.data(), T, Hq, D, cfg_.rotary_dim, inv_freq_.data());
    apply_rope(k.data(), b.positions.data(), T, Hkv, D, cfg_.rotary_dim, inv_freq_.data());
  });
  round_act(q.data(), T * Hq * D);
  round_act(k.data(), T * Hkv * D);
  const float scale = float(1.0 / std::sqrt(double(D)));
  // The GPU runs a decode sequence (one generated row after cached context) through the decode kernel
  // (fp32 P), in decode and mixed steps alike, and every other sequence through the tensor-core prefill
  // kernel (bf16 P V).
  // FP8 pages: the checkpoint's k_scale / v_scale per KV head, else 1 (runtime/kv_cache.h).
  const cpu::KvPages pages = kv.pages(l, a.k_scale.empty() ? nullptr : a.k_scale.data(),
                                      a.v_scale.empty() ? nullptr : a.v_scale.data());
  for (int32_t s = 0; s < b.num_seqs(); ++s) {
    const int64_t r0 = b.cu_seqlens[size_t(s)], n = b.cu_seqlens[size_t(s + 1)] - r0, start = b.context_lens[size_t(s)];
    if (n == 0) continue;
    MOEFOLD_CHECK((start + n + kv.block_size - 1) / kv.block_size <= b.max_blocks_per_seq,
                  "sequence {} needs more KV blocks than its block table holds", s);
    timed(kKvWrite, rw(2.0 * n * kv.kv_dim, 2.0 * n * kv.kv_dim), [&] {
      kv.count_saturated(l, kv_cache_write(&k[size_t(r0 * Hkv * D)], &v[size_t(r0 * Hkv * D)], pages,
                                           b.block_table(s), start, n));
    });
    // q read and o written; the cached K and V read once; QK^T and PV over the causal pairs.
    const double pairs = double(n) * start + double(n) * (n + 1) / 2;
    const prof::Work attn_work = rw(double(n * Hq * D) + 2.0 * (start + n) * Hkv * D, double(n * Hq * D),
                                    4.0 * pairs * Hq * D);
    const bool gpu_decode = b.decode_rows(s) && start > 0;
    timed(n == 1 && start > 0 ? kAttnDecode : kAttnPrefill, attn_work, [&] {
      paged_attention(&q[size_t(r0 * Hq * D)], pages, b.block_table(s), start, n, Hq, scale, &o[size_t(r0 * Hq * D)],
                      emulate_bf16_ && !gpu_decode);
    });
  }
  if (cfg_.attn_output_gate)
    timed(kOutputGate, rw(2.0 * o.size(), double(o.size())),
          [&] { for (size_t i = 0; i < o.size(); ++i) o[i] *= sigmoid(gate[i]); });
  round_act(o.data(), int64_t(o.size()));
  proj(a.o_proj, o.data(), out, T);
}

// Gated DeltaNet (transformers Qwen3_5MoeGatedDeltaNet; design doc section 4.4):
//   qkv = conv1d_silu(in_proj_qkv(x)); q, k, v = split(qkv); z = in_proj_z(x);
//   beta = sigmoid(in_proj_b(x)); g = -exp(A_log) softplus(in_proj_a(x) + dt_bias);
//   o = delta_rule(q, k, v, g, beta; S); out = out_proj(GatedRMSNorm(o, z))
// A decode row (one generated token, ForwardBatch::decode_rows) takes the recurrent step; prompt rows the
// chunked form, which also takes the step's state snapshots (ForwardBatch::snapshots).
void Model::deltanet(size_t l, const ForwardBatch& b, const float* x, float* out, StatePool& st) const {
  const DeltaNetWeights& g = w_.layers[l].gdn;
  const int64_t T = b.num_rows(), C = cfg_.conv_dim(), K = cfg_.linear_conv_kernel_dim;
  const int64_t Hk = cfg_.linear_num_key_heads, Hv = cfg_.linear_num_value_heads;
  const int64_t dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim, kd = cfg_.key_dim();
  const GdnShape shape{Hk, Hv, dk, dv};
  std::vector<float> mixed(static_cast<size_t>(T * C)), conv(static_cast<size_t>(T * C)), z(static_cast<size_t>(T * Hv * dv)), braw(static_cast<size_t>(T * Hv)),
      araw(static_cast<size_t>(T * Hv)), gl(static_cast<size_t>(T * Hv)), beta(static_cast<size_t>(T * Hv)), o(static_cast<size_t>(T * Hv * dv));
  proj(g.in_proj_qkv, x, mixed.data(), T);
  proj(g.in_proj_z, x, z.data(), T);
  proj(g.in_proj_b, x, braw.data(), T);
  proj(g.in_proj_a, x, araw.data(), T);
  timed(kGdnGating, rw(2.0 * T * Hv + 2.0 * Hv, 2.0 * T * Hv),
        [&] { gdn_gating(araw.data(), braw.data(), g.A_log.data(), g.dt_bias.data(), gl.data(), beta.data(), T, Hv); });
  std::vector<float> q, k, v;
  std::vector<GdnStateSnapshot> snaps;
  for (int32_t s = 0; s < b.num_seqs(); ++s) {
    const int64_t r0 = b.cu_seqlens[size_t(s)], n = b.cu_seqlens[size_t(s + 1)] - r0;
    if (n == 0) continue;
    const int32_t slot = b.state_slots[size_t(s)];
    MOEFOLD_CHECK(slot >= 0 && slot < st.num_slots, "sequence {} has state slot {} outside [0, {})", s, slot, st.num_slots);
    timed(kConv, rw(double(n * C + C * K + C * (K - 1)), double(n * C + C * (K - 1)), 2.0 * n * C * K), [&] {
      causal_conv1d_silu(&mixed[size_t(r0 * C)], g.conv1d.data(), st.conv_state(l, slot), &conv[size_t(r0 * C)], n, C,
                         K);
    });
    round_act(&conv[size_t(r0 * C)], n * C);
    q.resize(size_t(n * kd));
    k.resize(size_t(n * kd));
    v.resize(size_t(n * Hv * dv));
    timed(kSplit, rw(double(n * C), double(n * C)), [&] {
      for (int64_t t = 0; t < n; ++t) {
        const float* c = &conv[size_t((r0 + t) * C)];
        std::memcpy(&q[size_t(t * kd)], c, size_t(kd) * 4);
        std::memcpy(&k[size_t(t * kd)], c + kd, size_t(kd) * 4);
        std::memcpy(&v[size_t(t * Hv * dv)], c + 2 * kd, size_t(Hv * dv) * 4);
      }
    });
    float* S = st.recurrent_state(l, slot);
    const float* gs = &gl[size_t(r0 * Hv)];
    const float* bs = &beta[size_t(r0 * Hv)];
    float* os = &o[size_t(r0 * Hv * dv)];
    // q, k, v, g, beta read and o written per token, the fp32 state read and written once; the recurrent
    // form's three dk x dv products per token and value head.
    const prof::Work rule_work = rw(double(n) * (2 * kd + Hv * dv + 2 * Hv) + double(Hv * dk * dv),
                                    double(n * Hv * dv) + double(Hv * dk * dv), 6.0 * n * Hv * dk * dv);
    // Snapshots of this sequence: the conv state is the K-1 inputs before the snapshot row (all inside
    // this step, as a snapshot row is >= 64 > K-1), the recurrent state comes from the chunked rule.
    snaps.clear();
    for (const StateSnapshot& sn : b.snapshots) {
      if (sn.seq != s) continue;
      const int64_t p = int64_t(kStateSnapshotChunk) * (sn.chunk + 1);
      MOEFOLD_CHECK(sn.chunk >= 0 && p <= n && p >= K - 1 && !b.decode_rows(s) && sn.dst_slot >= 0 &&
                        sn.dst_slot < st.num_slots && sn.dst_slot != slot,
                    "sequence {}: snapshot after chunk {} into slot {} does not fit its {} rows", s, sn.chunk,
                    sn.dst_slot, n);
      float* cs = st.conv_state(l, sn.dst_slot);
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < K - 1; ++j) cs[c * (K - 1) + j] = mixed[size_t((r0 + p - (K - 1) + j) * C + c)];
      snaps.push_back({sn.chunk, st.recurrent_state(l, sn.dst_slot)});
    }
    if (b.decode_rows(s))
      timed(kGdnRecurrent, rule_work,
            [&] { gated_delta_rule_recurrent(q.data(), k.data(), v.data(), gs, bs, S, os, n, shape); });
    else
      timed(kGdnChunked, rule_work, [&] {
        gated_delta_rule_chunked(q.data(), k.data(), v.data(), gs, bs, S, os, n, shape, kStateSnapshotChunk, snaps);
      });
  }
  round_act(o.data(), int64_t(o.size()));
  timed(kGatedNorm, rw(2.0 * o.size() + double(dv), double(o.size())),
        [&] { gated_rms_norm(o.data(), z.data(), g.norm.data(), o.data(), T * Hv, dv, float(cfg_.rms_norm_eps)); });
  round_act(o.data(), int64_t(o.size()));
  proj(g.out_proj, o.data(), out, T);
}

// MoE (transformers Qwen3_5MoeSparseMoeBlock): p = softmax(router(x)); top-k (renormalised);
//   out = sum_k w_k E_k(x) + sigmoid(shared_expert_gate(x)) * SharedExpert(x)
// replay: experts to use instead of the top-k ([T, k], or null); chosen: receives the experts used.
void Model::moe(size_t l, const float* x, float* out, int64_t T, const int32_t* replay, int32_t* chosen) const {
  const MoeWeights& m = w_.layers[l].moe;
  const int64_t H = cfg_.hidden_size, E = cfg_.num_experts, k = cfg_.num_experts_per_tok;
  std::vector<float> rl(static_cast<size_t>(T * E)), wts(static_cast<size_t>(T * k));
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  const int64_t I = cfg_.moe_intermediate_size;
  project(kRouter, m.router, x, rl.data(), T);
  if (cfg_.grouped_routing.enabled) {  // DeepSeek noaux_tc: sigmoid scores, bias picks, groups by top-two sum
    const GroupedRoutingConfig& g = cfg_.grouped_routing;
    const GroupedRouting gr{E, g.n_group, g.topk_group, k, cfg_.norm_topk_prob, float(g.routed_scaling_factor)};
    timed(kGroupedTopk, rw(double(T * E + E), 2.0 * T * k), [&] {
      grouped_topk(rl.data(), m.e_score_correction_bias.empty() ? nullptr : m.e_score_correction_bias.data(), T, gr,
                   ids.data(), wts.data(), replay);
    });
  } else {
    timed(kTopk, rw(double(T * E), 2.0 * T * k),
          [&] { router_topk(rl.data(), T, E, k, cfg_.norm_topk_prob, ids.data(), wts.data(), replay); });
  }
  if (chosen) std::copy(ids.begin(), ids.end(), chosen);
  timed(kZero, rw(0, double(T * H)), [&] { std::fill_n(out, T * H, 0.0f); });
  if (sharded() && shard_.shard.experts.count < E) {
    moe_expert_parallel(l, x, out, T, ids.data(), wts.data());
  } else {
    routed_pairs_.fetch_add(T * k, std::memory_order_relaxed);
    // The touched experts' weights, x and the routing read, out read and written; 3 H x I products per pair.
    std::vector<bool> touched(size_t(E), false);
    for (int32_t e : ids) touched[size_t(e)] = true;
    const double n_touched = double(std::count(touched.begin(), touched.end(), true));
    const prof::Work expert_work = rw(n_touched * 3 * H * I + double(T * H) + 2.0 * T * k + double(T * H),
                                      double(T * H), 2.0 * T * k * 3 * H * I);
    timed(kExperts, expert_work, [&] {
      moe_experts(x, m.gate_up.data(), m.down.data(), ids.data(), wts.data(), out, T, H, I, E, k, emulate_bf16_,
                  emulate_fp8_expert_act_ && m.gate_up.fp8 && m.down.fp8);
    });
  }
  if (cfg_.shared_expert_intermediate_size > 0) {
    const int64_t Is = cfg_.shared_expert_intermediate_size;
    std::vector<float> gu(static_cast<size_t>(T * 2 * Is)), act(static_cast<size_t>(T * Is)), ys(static_cast<size_t>(T * H)), sg(static_cast<size_t>(T));
    proj(m.shared_gate_up, x, gu.data(), T);
    timed(kSwiglu, rw(2.0 * T * Is, double(T * Is)), [&] { swiglu(gu.data(), act.data(), T, Is); });
    round_act(act.data(), T * Is);
    proj(m.shared_down, act.data(), ys.data(), T);
    const bool gated = !m.shared_expert_gate.w.empty();  // DeepSeek's shared experts have no gate
    if (gated) project(kSharedGate, m.shared_expert_gate, x, sg.data(), T);
    timed(kSharedCombine, rw(2.0 * T * H + double(T), double(T * H)), [&] {
      for (int64_t t = 0; t < T; ++t) {
        const float s = gated ? sigmoid(sg[size_t(t)]) : 1.0f;
        for (int64_t i = 0; i < H; ++i) out[t * H + i] += s * ys[size_t(t * H + i)];
      }
    });
  }
}

void Model::moe_expert_parallel(size_t l, const float* x, float* out, int64_t T, const int32_t* ids,
                                const float* wts) const {
  const MoeWeights& m = w_.layers[l].moe;
  const RankShard& s = shard_.shard;
  const LocalExperts ex{m.gate_up.data(), m.down.data(), s.experts.begin, s.experts.count, cfg_.hidden_size,
                        cfg_.moe_intermediate_size, emulate_bf16_};
  const int64_t k = cfg_.num_experts_per_tok;
  // Times its own expert GEMMs (cpu::moe_experts:ep) and messages (cpu::all_to_all:moe_dispatch).
  routed_pairs_.fetch_add(expert_parallel_moe(*shard_.comm, s, ex, x, ids, wts, T, k, out), std::memory_order_relaxed);
}

// Dense SwiGLU MLP: out = down(silu(gate(x)) * up(x)).
void Model::mlp(size_t l, const float* x, float* out, int64_t T) const {
  const MlpWeights& m = w_.layers[l].mlp;
  const int64_t I = m.down.in;
  std::vector<float> gu(static_cast<size_t>(T * 2 * I)), act(static_cast<size_t>(T * I));
  proj(m.gate_up, x, gu.data(), T);
  timed(kSwiglu, rw(2.0 * T * I, double(T * I)), [&] { swiglu(gu.data(), act.data(), T, I); });
  round_act(act.data(), T * I);
  proj(m.down, act.data(), out, T);
}

}  // namespace moefold
