#include "models/cuda/cuda_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "models/weight_loader.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/causal_conv1d.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_buffer.h"
#include "ops/cuda/dummy_fill.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gated_delta_net.h"
#include "ops/cuda/gated_rms_norm.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/rope.h"

namespace moefold {

using cuda::bf16;
using cuda::DeviceBuffer;

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

namespace {

const bf16* dev(const Param& p) { return static_cast<const bf16*>(p.device); }

class CudaExecutor : public Executor {
 public:
  CudaExecutor(ModelConfig cfg, const CudaExecutorOptions& opt) : cfg_(std::move(cfg)), opt_(opt) {
    MOEFOLD_CUDA_CHECK(cudaSetDevice(opt.device));
    MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaExecutor() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  /// Uploads one finished Param as bf16 and drops its host copy (small ones are kept: the fp32
  /// DeltaNet parameters are uploaded again as fp32 from them).
  void place(Param& p) {
    if (p.dummy) {  // unmaterialised dummy tensor: generate it here
      weights_store_.emplace_back(size_t(p.numel));
      cuda::dummy_fill_bf16(*p.dummy, weights_store_.back().data(), p.numel, nullptr);
      p.device = weights_store_.back().data();
      return;
    }
    std::vector<uint16_t> bits(p.host.size());
    parallel_for(int64_t(bits.size()), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) bits[size_t(i)] = f32_to_bf16(p.host[size_t(i)]);
    });
    weights_store_.emplace_back(bits.size());
    weights_store_.back().upload(reinterpret_cast<const bf16*>(bits.data()), bits.size());
    p.device = weights_store_.back().data();
    if (p.numel > 65536) {
      p.host.clear();
      p.host.shrink_to_fit();
    }
  }

  void finish_load(ModelWeights w) {
    w_ = std::move(w);
    const ModelConfig& c = cfg_;
    const int64_t cap = opt_.max_rows, H = c.hidden_size, S = opt_.num_slots;
    // fp32 copies of A_log and dt_bias for the DeltaNet kernels.
    for (auto& L : w_.layers)
      if (!L.gdn.A_log.empty()) {
        fp32_store_.push_back(cuda::to_device(L.gdn.A_log.host));
        a_log_.push_back(fp32_store_.back().data());
        fp32_store_.push_back(cuda::to_device(L.gdn.dt_bias.host));
        dt_bias_.push_back(fp32_store_.back().data());
      } else {
        a_log_.push_back(nullptr);
        dt_bias_.push_back(nullptr);
      }
    freqs_ = std::make_unique<cuda::RopeFreqs>(
        c.rotary_dim, cpu::rope_inv_freq(c.rotary_dim, c.rope_theta, c.rope_llama3_factor, c.rope_llama3_low_freq,
                                         c.rope_llama3_high_freq, c.rope_llama3_original_max));
    // Batch metadata.
    ids_ = DeviceBuffer<int32_t>(cap);
    positions_ = DeviceBuffer<int32_t>(cap);
    slot_mapping_ = DeviceBuffer<int32_t>(cap);
    logits_rows_ = DeviceBuffer<int32_t>(cap);
    cu_seqlens_ = DeviceBuffer<int32_t>(S + 1);
    context_lens_ = DeviceBuffer<int32_t>(S);
    state_slots_ = DeviceBuffer<int32_t>(S);
    counts_ = DeviceBuffer<int32_t>(4);  // num_rows, num_seqs, oob flag, logits rows
    // Activations (zero-filled once: GEMM inputs of padding rows stay finite).
    auto act = [&](int64_t cols) {
      DeviceBuffer<bf16> b(size_t(cap * std::max<int64_t>(cols, 1)));
      b.fill_bytes(0);
      return b;
    };
    h_ = act(H);
    x_ = act(H);
    y_ = act(H);
    if (c.num_layers_of(LayerType::FullAttention)) {
      qg_ = act(c.q_proj_rows());
      k_ = act(c.num_kv_heads * c.head_dim);
      v_ = act(c.num_kv_heads * c.head_dim);
      o_ = act(c.num_heads * c.head_dim);
    }
    if (c.num_layers_of(LayerType::LinearAttention)) {
      mixed_ = act(c.conv_dim());
      conv_ = act(c.conv_dim());
      z_ = act(c.value_dim());
      gb_ = act(c.linear_num_value_heads);
      ga_ = act(c.linear_num_value_heads);
      go_ = act(c.value_dim());
    }
    int64_t ffn = 0;
    for (int64_t l = 0; l < c.num_layers; ++l)
      ffn = std::max(ffn, c.layer_is_moe[size_t(l)] ? c.shared_expert_intermediate_size : c.intermediate_size);
    if (ffn > 0) {
      gu_ = act(2 * ffn);
      ffn_act_ = act(ffn);
    }
    if (c.num_experts > 0) {
      moe_shape_ = {int(cap), int(c.num_experts), int(c.num_experts_per_tok), int(H), int(c.moe_intermediate_size)};
      const size_t bytes = cuda::moe_workspace_bytes(moe_shape_);
      moe_ws_mem_ = DeviceBuffer<uint8_t>(bytes);
      moe_ws_ = cuda::moe_workspace_bind(moe_ws_mem_.data(), bytes, moe_shape_);
    }
    hr_ = DeviceBuffer<bf16>(size_t(opt_.max_logits_rows) * size_t(H));
    logits_ = DeviceBuffer<float>(size_t(opt_.max_logits_rows) * size_t(c.vocab_size));
    // KV cache and state pool: the state pool first, then the KV pages, sized from free memory when
    // num_blocks <= 0 (everything else is allocated by now).
    for (int64_t l = 0; l < c.num_layers; ++l)
      if (c.layer_types[size_t(l)] == LayerType::LinearAttention) {
        conv_state_.emplace_back(size_t(S) * size_t(c.conv_dim() * (c.linear_conv_kernel_dim - 1)));
        rec_state_.emplace_back(size_t(S) * size_t(c.linear_num_value_heads * c.linear_key_head_dim *
                                                     c.linear_value_head_dim));
        conv_state_.back().fill_bytes(0);
        rec_state_.back().fill_bytes(0);
      } else {
        conv_state_.emplace_back();
        rec_state_.emplace_back();
      }
    if (opt_.num_blocks <= 0) {
      size_t free_b = 0, total_b = 0;
      MOEFOLD_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      const double budget = double(free_b) - (1.0 - opt_.gpu_memory_utilization) * double(total_b);
      const double per_block = double(c.kv_bytes_per_token(2)) * opt_.block_size;
      const int64_t blocks = per_block > 0 ? int64_t(budget / per_block) : 1;
      MOEFOLD_CHECK(blocks >= 1, "no GPU memory left for the KV cache ({:.1f} GiB free of {:.1f} GiB)",
                    double(free_b) / 1073741824.0, double(total_b) / 1073741824.0);
      opt_.num_blocks = int32_t(std::min<int64_t>(blocks, 1 << 24));
    }
    if (opt_.max_blocks_per_seq <= 0 || opt_.max_blocks_per_seq > opt_.num_blocks) opt_.max_blocks_per_seq = opt_.num_blocks;
    block_tables_ = DeviceBuffer<int32_t>(size_t(S) * size_t(opt_.max_blocks_per_seq));
    if (c.num_layers_of(LayerType::FullAttention)) {
      decode_ws_bytes_ = cuda::attention_decode_workspace_bytes(S, attention_shape(),
                                                                int64_t(opt_.max_blocks_per_seq) * opt_.block_size);
      decode_ws_ = DeviceBuffer<uint8_t>(std::max<size_t>(decode_ws_bytes_, 1));
    }
    kv_elems_ = int64_t(opt_.num_blocks) * opt_.block_size * c.num_kv_heads * c.head_dim;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      if (c.layer_types[size_t(l)] == LayerType::FullAttention) {
        k_cache_.emplace_back(size_t(kv_elems_));
        v_cache_.emplace_back(size_t(kv_elems_));
      } else {
        k_cache_.emplace_back();
        v_cache_.emplace_back();
      }
    }
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  }

  const ModelConfig& config() const override { return cfg_; }
  std::string device() const override { return "cuda:" + std::to_string(opt_.device); }
  int32_t num_kv_blocks() const override { return opt_.num_blocks; }

  void reset_slot(int32_t s) override {
    MOEFOLD_CHECK(s >= 0 && s < opt_.num_slots, "state slot {} outside [0, {})", s, opt_.num_slots);
    for (size_t l = 0; l < conv_state_.size(); ++l) {
      if (conv_state_[l].empty()) continue;
      const size_t ce = conv_state_[l].size() / size_t(opt_.num_slots), re = rec_state_[l].size() / size_t(opt_.num_slots);
      cuda::fill_device_bytes(conv_state_[l].data() + size_t(s) * ce, 0, ce * sizeof(bf16), stream_);
      cuda::fill_device_bytes(rec_state_[l].data() + size_t(s) * re, 0, re * sizeof(float), stream_);
    }
  }

  void forward(const ForwardBatch& b, std::vector<float>& logits) override;
  void set_routing(RoutingControl routing) override { routing_ = routing; }

 private:
  cuda::AttentionShape attention_shape() const {
    cuda::AttentionShape sh;
    sh.num_heads = int(cfg_.num_heads);
    sh.num_kv_heads = int(cfg_.num_kv_heads);
    sh.head_dim = int(cfg_.head_dim);
    sh.block_size = opt_.block_size;
    if (cfg_.attn_output_gate) {  // q_proj output per head: [query D | gate D], read in place
      sh.q_token_stride = 2 * cfg_.num_heads * cfg_.head_dim;
      sh.q_head_stride = 2 * cfg_.head_dim;
      sh.gate_token_stride = sh.q_token_stride;
      sh.gate_head_stride = sh.q_head_stride;
    }
    return sh;
  }
  void gemm(const Linear& l, const bf16* x, bf16* y, int64_t T) {
    cuda::gemm_bf16(x, dev(l.w), l.b.empty() ? nullptr : dev(l.b), y, T, l.in, l.out, stream_);
  }
  void attention(size_t l, const ForwardBatch& b, int64_t T, bool decode, int max_q_len);
  void deltanet(size_t l, const ForwardBatch& b, int64_t T, bool decode);
  void ffn(size_t l, int64_t T, size_t moe_index);

  ModelConfig cfg_;
  CudaExecutorOptions opt_;
  cudaStream_t stream_ = nullptr;
  ModelWeights w_;
  std::vector<DeviceBuffer<bf16>> weights_store_;
  std::vector<DeviceBuffer<float>> fp32_store_;
  std::vector<const float*> a_log_, dt_bias_;
  std::unique_ptr<cuda::RopeFreqs> freqs_;
  DeviceBuffer<int32_t> ids_, positions_, slot_mapping_, logits_rows_, cu_seqlens_, context_lens_, state_slots_,
      block_tables_, counts_;
  DeviceBuffer<bf16> h_, x_, y_, qg_, k_, v_, o_, mixed_, conv_, z_, gb_, ga_, go_, gu_, ffn_act_, hr_;
  DeviceBuffer<float> logits_;
  DeviceBuffer<uint8_t> decode_ws_, moe_ws_mem_;
  size_t decode_ws_bytes_ = 0;
  int64_t kv_elems_ = 0;
  cuda::MoeShape moe_shape_;
  cuda::MoeWorkspace moe_ws_;
  std::vector<DeviceBuffer<bf16>> k_cache_, v_cache_, conv_state_;
  std::vector<DeviceBuffer<float>> rec_state_;
  RoutingControl routing_;
  DeviceBuffer<int32_t> replay_ids_;  // [MoE layers, T, k] of the current step when replaying
};

void CudaExecutor::forward(const ForwardBatch& b, std::vector<float>& logits) {
  const ModelConfig& c = cfg_;
  const int64_t T = b.num_rows(), H = c.hidden_size, V = c.vocab_size;
  const int32_t S = b.num_seqs();
  MOEFOLD_CHECK(T > 0 && T <= opt_.max_rows, "step has {} rows; this executor holds at most {}", T, opt_.max_rows);
  MOEFOLD_CHECK(S <= opt_.num_slots, "step has {} sequences; this executor holds at most {}", S, opt_.num_slots);
  MOEFOLD_CHECK(b.max_blocks_per_seq <= opt_.max_blocks_per_seq, "block table of {} pages exceeds the limit {}",
                b.max_blocks_per_seq, opt_.max_blocks_per_seq);
  int max_q_len = 0;
  bool decode = true;
  for (int32_t s = 0; s < S; ++s) {
    const int n = b.cu_seqlens[size_t(s + 1)] - b.cu_seqlens[size_t(s)];
    max_q_len = std::max(max_q_len, n);
    decode = decode && n == 1 && b.context_lens[size_t(s)] > 0;
  }
  // Upload the batch (stream-ordered; the host vectors live until the synchronise below).
  auto up = [&](DeviceBuffer<int32_t>& d, const std::vector<int32_t>& h) {
    if (!h.empty()) d.upload(h.data(), h.size(), 0, stream_, true);
  };
  up(ids_, b.token_ids);
  up(positions_, b.positions);
  up(cu_seqlens_, b.cu_seqlens);
  up(context_lens_, b.context_lens);
  up(state_slots_, b.state_slots);
  up(block_tables_, b.block_tables);
  const std::vector<int32_t> counts = {int32_t(T), S, 0, int32_t(b.logits_rows.size())};
  up(counts_, counts);
  // Checked on the host: the top-k kernel would keep an id outside [0, E) and moe_plan drop its pair
  // silently (ws.status is not read back).
  prepare_routing(routing_, c, T);
  if (routing_.replay) {
    const auto& r = routing_.replay->layers;
    const size_t pairs = size_t(T * c.num_experts_per_tok);
    if (replay_ids_.size() < r.size() * pairs) replay_ids_ = DeviceBuffer<int32_t>(r.size() * pairs);
    for (size_t i = 0; i < r.size(); ++i) replay_ids_.upload(r[i].data(), pairs, i * pairs, stream_, true);
  }
  size_t moe_index = 0;
  const int32_t* num_rows = counts_.data();

  // h = embed(tokens); x = RMSNorm_in(h) for layer 0
  cuda::embedding_gather(dev(w_.embed), V, H, ids_.data(), h_.data(), T, num_rows, counts_.data() + 2, stream_);
  const cpu::NormKind nk = c.norm_zero_centred ? cpu::NormKind::ZeroCentred : cpu::NormKind::Plain;
  const float eps = float(c.rms_norm_eps);
  if (c.num_layers_of(LayerType::FullAttention))
    cuda::compute_slot_mapping(cu_seqlens_.data(), context_lens_.data(), block_tables_.data(), b.max_blocks_per_seq,
                               opt_.block_size, S, max_q_len, slot_mapping_.data(), stream_);
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& L = w_.layers[l];
    // h = h + Mixer(RMSNorm_in(h))
    cuda::rms_norm(h_.data(), dev(L.input_norm), x_.data(), T, H, eps, nk, num_rows, stream_);
    if (c.layer_types[l] == LayerType::FullAttention) attention(l, b, T, decode, max_q_len);
    else deltanet(l, b, T, decode);
    // h = h + FFN(RMSNorm_post(h))
    cuda::add_rms_norm(h_.data(), y_.data(), dev(L.post_attention_norm), x_.data(), T, H, eps, nk, num_rows, stream_);
    ffn(l, T, moe_index);
    moe_index += c.layer_is_moe[l] ? 1 : 0;
  }

  // logits = lm_head(RMSNorm_final(h[logits_rows])), max_logits_rows rows per pass
  const int64_t R = int64_t(b.logits_rows.size());
  up(logits_rows_, b.logits_rows);
  logits.resize(size_t(R * V));
  for (int64_t r0 = 0; r0 < R; r0 += opt_.max_logits_rows) {
    const int64_t n = std::min<int64_t>(opt_.max_logits_rows, R - r0);
    cuda::embedding_gather(h_.data(), T, H, logits_rows_.data() + r0, hr_.data(), n, nullptr, counts_.data() + 2, stream_);
    cuda::rms_norm(hr_.data(), dev(w_.final_norm), hr_.data(), n, H, eps, nk, nullptr, stream_);
    cuda::gemm_bf16_f32out(hr_.data(), dev(w_.lm_head_param()), nullptr, logits_.data(), n, H, V, stream_);
    logits_.download(logits.data() + r0 * V, size_t(n * V), 0, stream_, true);
  }
  int32_t oob = 0;
  counts_.download(&oob, 1, 2, stream_, true);
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  MOEFOLD_CHECK(oob == 0, "a token id or logits row of this step is out of range");
}

// Gated softmax attention, as Model::attention: [q | gate] = q_proj(x); k, v; q/k RMSNorm per head;
// RoPE; causal paged attention; o * sigmoid(gate) (fused); out = o_proj(o).
void CudaExecutor::attention(size_t l, const ForwardBatch& b, int64_t T, bool decode, int max_q_len) {
  const AttentionWeights& a = w_.layers[l].attn;
  const ModelConfig& c = cfg_;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  const int32_t* num_rows = counts_.data();
  const cpu::NormKind nk = c.norm_zero_centred ? cpu::NormKind::ZeroCentred : cpu::NormKind::Plain;
  gemm(a.q_proj, x_.data(), qg_.data(), T);
  gemm(a.k_proj, x_.data(), k_.data(), T);
  gemm(a.v_proj, x_.data(), v_.data(), T);
  cuda::AttentionShape sh = attention_shape();
  cuda::HeadRows q_rows{Hq, sh.q_token_stride, sh.q_head_stride}, k_rows{Hkv, 0, 0};
  if (c.qk_norm) {
    cuda::rms_norm(qg_.data(), dev(a.q_norm), qg_.data(), T, D, float(c.rms_norm_eps), nk, num_rows, stream_, q_rows);
    cuda::rms_norm(k_.data(), dev(a.k_norm), k_.data(), T, D, float(c.rms_norm_eps), nk, num_rows, stream_, k_rows);
  }
  cuda::apply_rope(qg_.data(), q_rows, k_.data(), k_rows, positions_.data(), T, D, *freqs_, num_rows, stream_);
  cuda::kv_cache_write(k_.data(), 0, v_.data(), 0, k_cache_[l].data(), v_cache_[l].data(), slot_mapping_.data(), T,
                       Hkv * D, num_rows, stream_);
  if (c.attn_output_gate) sh.gate = qg_.data() + D;
  if (decode)
    cuda::attention_decode(qg_.data(), k_cache_[l].data(), v_cache_[l].data(), block_tables_.data(),
                           b.max_blocks_per_seq, context_lens_.data(), b.num_seqs(),
                           int64_t(b.max_blocks_per_seq) * opt_.block_size, o_.data(), sh, decode_ws_.data(),
                           decode_ws_bytes_, stream_);
  else
    cuda::attention_prefill(qg_.data(), k_cache_[l].data(), v_cache_[l].data(), block_tables_.data(),
                            b.max_blocks_per_seq, cu_seqlens_.data(), context_lens_.data(), b.num_seqs(), max_q_len,
                            o_.data(), sh, stream_);
  gemm(a.o_proj, o_.data(), y_.data(), T);
}

// Gated DeltaNet, as Model::deltanet: conv1d_silu(in_proj_qkv(x)) with the carried conv state;
// gating, q/k L2 norm and the delta rule (chunked for prefill, recurrent for decode) over the
// sequence's state slot; GatedRMSNorm(o, z); out_proj.
void CudaExecutor::deltanet(size_t l, const ForwardBatch& b, int64_t T, bool decode) {
  const DeltaNetWeights& g = w_.layers[l].gdn;
  const ModelConfig& c = cfg_;
  const int64_t C = c.conv_dim(), K = c.linear_conv_kernel_dim, Hv = c.linear_num_value_heads, kd = c.key_dim();
  const int32_t* num_seqs = counts_.data() + 1;
  gemm(g.in_proj_qkv, x_.data(), mixed_.data(), T);
  gemm(g.in_proj_z, x_.data(), z_.data(), T);
  gemm(g.in_proj_b, x_.data(), gb_.data(), T);
  gemm(g.in_proj_a, x_.data(), ga_.data(), T);
  if (decode)
    cuda::causal_conv1d_silu_decode(mixed_.data(), dev(g.conv1d), state_slots_.data(), num_seqs, b.num_seqs(),
                                    conv_state_[l].data(), conv_.data(), int(C), int(K), stream_);
  else
    cuda::causal_conv1d_silu_prefill(mixed_.data(), dev(g.conv1d), cu_seqlens_.data(), state_slots_.data(), num_seqs,
                                     int(T), conv_state_[l].data(), conv_.data(), int(C), int(K), stream_);
  cuda::GdnArgs args{conv_.data(), conv_.data() + kd, conv_.data() + 2 * kd, C, ga_.data(), gb_.data(), Hv,
                     a_log_[l], dt_bias_[l], rec_state_[l].data(), state_slots_.data(), num_seqs, go_.data()};
  const cuda::GdnDims dims{int(c.linear_num_key_heads), int(Hv), int(c.linear_key_head_dim),
                           int(c.linear_value_head_dim)};
  if (decode) cuda::gdn_recurrent_decode(args, b.num_seqs(), dims, stream_);
  else cuda::gdn_chunked_prefill(args, cu_seqlens_.data(), b.num_seqs(), nullptr, nullptr, 0, dims, stream_);
  cuda::gated_rms_norm(go_.data(), z_.data(), dev(g.norm), go_.data(), T, Hv, c.linear_value_head_dim,
                       float(c.rms_norm_eps), counts_.data(), stream_);
  gemm(g.out_proj, go_.data(), y_.data(), T);
}

// FFN with its residual add: h += MoE(x) (routed experts + gated shared expert, residual fused into
// the combine) or h += MLP(x).
void CudaExecutor::ffn(size_t l, int64_t T, size_t moe_index) {
  const LayerWeights& L = w_.layers[l];
  const ModelConfig& c = cfg_;
  const int32_t* num_rows = counts_.data();
  if (c.layer_is_moe[l]) {
    const MoeWeights& m = L.moe;
    const bf16* shared_out = nullptr;
    if (c.shared_expert_intermediate_size > 0) {
      const int64_t Is = c.shared_expert_intermediate_size;
      gemm(m.shared_gate_up, x_.data(), gu_.data(), T);
      cuda::swiglu(gu_.data(), ffn_act_.data(), T, Is, num_rows, stream_);
      gemm(m.shared_down, ffn_act_.data(), y_.data(), T);
      shared_out = y_.data();
    }
    const size_t pairs = size_t(T * c.num_experts_per_tok);
    // The step's shape: grids and expert-GEMM tiles for this step's T rows (the workspace is bound for
    // max_rows; a decode step runs the decode tiles).
    cuda::MoeShape step_shape = moe_shape_;
    step_shape.capacity = int(T);
    cuda::moe_forward(x_.data(), dev(m.router.w), dev(m.gate_up), dev(m.down), shared_out,
                      shared_out ? dev(m.shared_expert_gate.w) : nullptr, h_.data(), num_rows, step_shape,
                      c.norm_topk_prob, moe_ws_, h_.data(), stream_,
                      routing_.replay ? replay_ids_.data() + moe_index * pairs : nullptr);
    if (routing_.capture)
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(routing_.capture->layers[moe_index].data(), moe_ws_.ids,
                                         pairs * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  } else {
    const MlpWeights& m = L.mlp;
    gemm(m.gate_up, x_.data(), gu_.data(), T);
    cuda::swiglu(gu_.data(), ffn_act_.data(), T, m.down.in, num_rows, stream_);
    gemm(m.down, ffn_act_.data(), y_.data(), T);
    cuda::residual_add(h_.data(), y_.data(), T, c.hidden_size, num_rows, stream_);
  }
}

}  // namespace

std::unique_ptr<Executor> make_cuda_executor(const std::string& dir, LoadFormat format, uint64_t seed,
                                             const CudaExecutorOptions& opt) {
  MOEFOLD_CHECK(cuda_available(), "--device cuda: no usable CUDA device");
  ModelConfig cfg = ModelConfig::from_dir(dir);
  auto exec = std::make_unique<CudaExecutor>(cfg, opt);
  std::unique_ptr<WeightSource> src = format == LoadFormat::Dummy
                                          ? dummy_source(seed, cfg.family == Family::Qwen3_5Moe, opt.dummy_on_device)
                                          : checkpoint_source(dir);
  ModelWeights w = load_weights(cfg, *src, [&](Param& p) { exec->place(p); });
  exec->finish_load(std::move(w));
  return exec;
}

}  // namespace moefold
