#include "models/cuda/cuda_executor.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <span>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/profiler.h"
#include "models/cuda/cuda_tp_rank.h"
#include "models/cuda/device_sampler.h"
#include "models/cuda/step_metadata.h"
#include "models/weight_loader.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/causal_conv1d.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_graph.h"
#include "ops/cuda/device_buffer.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/dummy_fill.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gated_delta_net.h"
#include "ops/cuda/gated_rms_norm.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/fp8_gemv.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/invariant_gemm.h"
#include "ops/cuda/moe_fp8.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/qk_norm_rope.h"
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

/// Calls fn on every dense projection of a layer (empty ones included: check l.w.device).
template <class F>
void for_each_linear(const LayerWeights& L, F&& fn) {
  for (const Linear* l : {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj, &L.gdn.in_proj_qkv,
                          &L.gdn.in_proj_z, &L.gdn.in_proj_b, &L.gdn.in_proj_a, &L.gdn.out_proj,
                          &L.moe.shared_gate_up, &L.moe.shared_down, &L.mlp.gate_up, &L.mlp.down})
    fn(*l);
}

/// The host facts of one step that size its launches: grids, GEMM rows, the block-table stride, the
/// lm_head rows. A CUDA graph is captured for one StepDims and replayed for every step mapped to it
/// (the live rows and sequences are then read from device memory by every kernel).
struct StepDims {
  int64_t rows = 0;          ///< T: rows the launches cover (a graph's bucket)
  int32_t seqs = 0;          ///< S: sequences the launches cover
  bool decode = false;       ///< one row per sequence, each with cached context
  int max_q_len = 0;         ///< most rows of one sequence
  int32_t table_stride = 0;  ///< block-table entries per sequence
  int64_t logits_rows = 0;   ///< rows of the first lm_head pass (0: none)
  /// A mixed step (eager; CudaExecutorOptions::split_mixed_steps): sequences [0, prefill_seqs) own
  /// rows [0, prefill_rows) and take the prefill kernels; sequences [prefill_seqs, seqs) decode one
  /// row each (rows prefill_rows + i) and take the decode kernels. 0: one form for every sequence.
  int32_t prefill_seqs = 0;
  int64_t prefill_rows = 0;
};

/// Device step counts (counts_): live rows, live sequences, the out-of-range flag, logits rows, and in a
/// mixed step its prefill and decode sequences.
constexpr size_t kNumCounts = 6;

class CudaExecutor : public Executor {
 public:
  CudaExecutor(ModelConfig cfg, const CudaExecutorOptions& opt) : cfg_(std::move(cfg)), opt_(opt) {
    MOEFOLD_CUDA_CHECK(cudaSetDevice(opt.device));
    MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&aux_stream_, cudaStreamNonBlocking));
    MOEFOLD_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    MOEFOLD_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  }
  ~CudaExecutor() override {
    if (kv_fp8_ && kv_saturated_.data()) {  // FP8 KV stores that saturated: said, never silent
      unsigned long long n = 0;
      if (cudaMemcpy(&n, kv_saturated_.data(), sizeof(n), cudaMemcpyDeviceToHost) == cudaSuccess && n > 0)
        std::fprintf(stderr, "moefold: warning: FP8 KV cache: %llu K/V elements exceeded 448 x their scale and were "
                             "saturated to +-448\n", n);
    }
    if (oob_host_) cudaFreeHost(oob_host_);
    if (fork_) cudaEventDestroy(fork_);
    if (join_) cudaEventDestroy(join_);
    if (aux_stream_) cudaStreamDestroy(aux_stream_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  /// Makes this executor one rank of a tensor-parallel group (before finish_load; cuda_tp_rank.h).
  void set_shard(const CudaShard& s) {
    shard_ = std::make_unique<CudaShard>(s);
    follower_ = s.shard.rank != 0;
  }

  /// Uploads one finished Param as bf16 and drops its host copy (small ones are kept: the fp32
  /// DeltaNet parameters are uploaded again as fp32 from them).
  void place(Param& p) {
    if (p.fp8) {  // block-scaled FP8 (checkpoint or --quantization fp8): stays FP8 on the GPU
      fp8_store_.emplace_back(p.fp8->q.size());
      fp8_store_.back().upload(p.fp8->q);
      scale_store_.push_back(cuda::to_device(p.fp8->scale));
      p.device = fp8_store_.back().data();
      p.device_scale = scale_store_.back().data();
      p.fp8.reset();
      p.host.clear();
      p.host.shrink_to_fit();
      return;
    }
    if (p.dummy && p.fp8_cols > 0) {  // dummy + --quantization fp8: quantised here (fp8_quantize's bits)
      fp8_store_.emplace_back(size_t(p.numel));
      const int64_t rows = p.numel / p.fp8_cols, kb = (p.fp8_cols + 127) / 128;
      scale_store_.emplace_back(size_t(rows * kb));
      cuda::fp8_quantize_dummy(*p.dummy, p.numel / (p.fp8_rows * p.fp8_cols), p.fp8_rows, p.fp8_cols,
                               fp8_store_.back().data(), scale_store_.back().data(), nullptr);
      p.device = fp8_store_.back().data();
      p.device_scale = scale_store_.back().data();
      return;
    }
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

  /// Per layer: the fused input projection (attention q|k|v or DeltaNet qkv|z|b|a), `rows` output
  /// columns: the FP8 parts' rows first (w8 [rows8, H] e4m3, s8 their scale rows, b8 their biases or null;
  /// parts8 each part's rows), then the bf16 parts' (w [rows - rows8, H], b); both null when the parts
  /// could not be fused (the layer then runs one GEMM per projection).
  struct Fused {
    const bf16* w = nullptr;
    const bf16* b = nullptr;
    int64_t rows = 0;
    const uint8_t* w8 = nullptr;
    const float* s8 = nullptr;
    const bf16* b8 = nullptr;
    int64_t rows8 = 0;
    std::vector<int64_t> parts8;
    bool any() const { return w || w8; }
  };
  /// One device weight [sum of rows, in] made of `parts` stacked in order (all with the same `in` and
  /// either all with or all without a bias: nullptr otherwise); the parts' own device copies are freed.
  /// One GEMM then computes every projection of the same input.
  const bf16* fuse_rows(std::span<const Linear* const> parts, const bf16** bias) {
    if (!fusable(parts, false)) return nullptr;
    const bf16* w = stack_rows(parts, weights_store_, parts.front()->in, [](const Linear& l) { return l.w.device; });
    *bias = parts.front()->b.empty() ? nullptr
                                     : stack_rows(parts, weights_store_, 1, [](const Linear& l) { return l.b.device; });
    return w;
  }

  /// One array of `store` made of the parts' arrays src(part) ([part.out, per_row] elements each)
  /// stacked in order; the parts' own arrays are freed from `store`.
  template <class T, class Src>
  const T* stack_rows(std::span<const Linear* const> parts, std::vector<DeviceBuffer<T>>& store, int64_t per_row,
                      Src src) {
    int64_t rows = 0;
    for (const Linear* l : parts) rows += l->out;
    DeviceBuffer<T> out(size_t(rows * per_row));
    int64_t r0 = 0;
    for (const Linear* l : parts) {
      MOEFOLD_CUDA_CHECK(cudaMemcpy(out.data() + r0 * per_row, src(*l), size_t(l->out * per_row) * sizeof(T),
                                    cudaMemcpyDeviceToDevice));
      r0 += l->out;
    }
    for (const Linear* l : parts)
      for (auto& buf : store)
        if (static_cast<const void*>(buf.data()) == src(*l)) buf = DeviceBuffer<T>();
    store.push_back(std::move(out));
    return store.back().data();
  }

  /// Whether `parts` (non-empty) can be stacked: the same `in`, all with or all without a bias, on the
  /// device, and all block-scaled FP8 (fp8) or all bf16 (!fp8).
  static bool fusable(std::span<const Linear* const> parts, bool fp8) {
    if (parts.empty()) return false;
    const int64_t in = parts.front()->in;
    const bool biased = !parts.front()->b.empty();
    for (const Linear* l : parts)
      if (l->in != in || l->b.empty() == biased || !l->w.device || (l->w.device_scale != nullptr) != fp8) return false;
    return true;
  }

  /// fuse_rows for FP8 parts: the stacked e4m3 rows (returned), their per-row block scales (*scale: the
  /// format keeps a scale row per weight row, so stacking is exact) and biases (*bias, or null); the
  /// parts' own device copies are freed.
  const uint8_t* fuse_rows_fp8(std::span<const Linear* const> parts, const float** scale, const bf16** bias) {
    if (!fusable(parts, true)) return nullptr;
    const int64_t in = parts.front()->in;
    const uint8_t* q = stack_rows(parts, fp8_store_, in, [](const Linear& l) { return l.w.device; });
    *scale = stack_rows(parts, scale_store_, (in + 127) / 128, [](const Linear& l) { return l.w.device_scale; });
    *bias = parts.front()->b.empty() ? nullptr
                                     : stack_rows(parts, weights_store_, 1, [](const Linear& l) { return l.b.device; });
    return q;
  }

  /// The fused input projection of `parts` (one input): all bf16 as one weight, or a leading run of FP8
  /// parts as one FP8 weight and the bf16 rest (the DeltaNet's in_proj_b / in_proj_a, which FP8
  /// releases keep in bf16) as one bf16 weight. Leaves f empty where the parts do not allow it (the layer
  /// then runs one GEMM per projection). MOEFOLD_FP8_FUSE=0 keeps FP8 parts unfused (A/B runs).
  void fuse_projection(std::initializer_list<Linear*> parts, Fused& f) {
    std::vector<const Linear*> p8, p16;
    for (const Linear* l : parts) {
      if (l->w.device_scale && !p16.empty()) return;  // FP8 after bf16: no single split
      (l->w.device_scale ? p8 : p16).push_back(l);
    }
    const char* env = std::getenv("MOEFOLD_FP8_FUSE");
    if (!p8.empty() && env && std::string_view(env) == "0") return;
    if (!p8.empty() && !fusable(p8, true)) return;
    if (!p16.empty() && (!fusable(p16, false) || p16.front()->in != parts.begin()[0]->in)) return;
    if (!p8.empty()) {
      f.w8 = fuse_rows_fp8(p8, &f.s8, &f.b8);
      for (const Linear* l : p8) {
        f.parts8.push_back(l->out);
        f.rows8 += l->out;
      }
    }
    if (!p16.empty()) f.w = fuse_rows(p16, &f.b);
    f.rows = f.rows8;
    for (const Linear* l : p16) f.rows += l->out;
  }

  /// y[T, f.rows] (row stride f.rows) = x . the fused projection's rows: the FP8 part as fp8_gemv (its
  /// outputs' bits depend on K only: those of the separate projections), or, past fp8_gemv's rows, each
  /// FP8 part dequantised and run alone as the unfused path does (the bf16 GEMMs' order depends on N);
  /// and the bf16 part, which in a decode-sized step runs on aux_stream_ beside the FP8 GEMV (the same
  /// kernels and bits; MOEFOLD_FP8_FUSE_AUX=0 keeps it on stream_).
  void fused_gemm(const Fused& f, const bf16* x, bf16* y, int64_t T) {
    const int64_t H = cfg_.hidden_size, W = f.rows;
    static const bool aux_on = [] {
      const char* v = std::getenv("MOEFOLD_FP8_FUSE_AUX");
      return !(v && std::string_view(v) == "0");
    }();
    const bool gemv8 = f.w8 && T <= cuda::kFp8GemvMaxRows && cuda::fp8_gemv_supported(H, x, 0, f.w8);
    // (only beside fp8_gemv: the dequantised path's GEMMs share the decode GEMM's workspace)
    const bool aux = aux_on && f.w && gemv8 && opt_.batch_invariant && decode_gemm_fits(x, f.w, H, 0);
    if (aux) {  // the bf16 rows first on the side stream, so its few blocks start before the FP8 GEMV's
      MOEFOLD_CUDA_CHECK(cudaEventRecord(fork_, stream_));
      MOEFOLD_CUDA_CHECK(cudaStreamWaitEvent(aux_stream_, fork_, 0));
      dense(x, f.w, f.b, y + f.rows8, T, H, W - f.rows8, 0, W, 0, aux_stream_);
      MOEFOLD_CUDA_CHECK(cudaEventRecord(join_, aux_stream_));
    }
    if (f.w8) {
      if (gemv8) {
        cuda::fp8_gemv(x, f.w8, f.s8, f.b8, y, T, H, f.rows8, counts_.data(), stream_, 0, W);
      } else {
        int64_t r0 = 0;
        for (int64_t out : f.parts8) {
          dense_dequantised(f.w8 + r0 * H, f.s8 + r0 * ((H + 127) / 128), f.b8 ? f.b8 + r0 : nullptr, x, y + r0, T, H,
                            out, W);
          r0 += out;
        }
      }
    }
    if (aux) MOEFOLD_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
    else if (f.w) dense(x, f.w, f.b, y + f.rows8, T, H, W - f.rows8, 0, W);
  }

  void finish_load(ModelWeights w) {
    w_ = std::move(w);
    const ModelConfig& c = cfg_;
    bool fp8_experts = false;
    for (const LayerWeights& L : w_.layers) fp8_experts = fp8_experts || L.moe.gate_up.device_scale;
    fp8_prefill_experts_ = fp8_experts && !shard_ && c.num_experts > 0 &&
                           cuda::moe_fp8_prefill_runs({int(opt_.max_rows), int(c.num_experts),
                                                       int(c.num_experts_per_tok), int(c.hidden_size),
                                                       int(c.moe_intermediate_size)});
    // Projections of one input as one GEMM: attention q|k|v, DeltaNet qkv|z|b|a.
    fused_.resize(w_.layers.size());
    for (size_t l = 0; l < w_.layers.size(); ++l) {
      LayerWeights& L = w_.layers[l];
      Fused& f = fused_[l];
      if (c.layer_types[l] == LayerType::FullAttention) {
        fuse_projection({&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj}, f);
      } else {
        DeltaNetWeights& g = L.gdn;
        fuse_projection({&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a}, f);
      }
      if (!f.any()) continue;
      fused_cols_ = std::max(fused_cols_, f.rows);
      for (Linear* part : {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.gdn.in_proj_qkv, &L.gdn.in_proj_z,
                           &L.gdn.in_proj_b, &L.gdn.in_proj_a}) {
        part->w.device = part->b.device = nullptr;  // freed: only the fused copy remains
        part->w.device_scale = nullptr;
      }
    }
    // Scratch for dequantised FP8 weights (steps the FP8 kernels do not take), allocated here so that no
    // graph capture allocates.
    size_t scratch = 0;
    for (const LayerWeights& L : w_.layers) {
      for_each_linear(L, [&](const Linear& l) {
        if (l.w.device_scale) scratch = std::max(scratch, size_t(l.out * l.in));
      });
      for (int64_t out : fused_[size_t(&L - w_.layers.data())].parts8) scratch = std::max(scratch, size_t(out * c.hidden_size));
      if (L.moe.gate_up.device_scale && opt_.max_rows > cuda::kMoeFp8MaxRows && !fp8_prefill_experts_)
        scratch = std::max(scratch, size_t(3 * c.num_experts * c.moe_intermediate_size * c.hidden_size));
    }
    // An FP8 lm_head dequantised for a logits pass of more than kFp8GemvMaxRows rows (launch_head).
    const Param& lmp = w_.lm_head_param();
    if (lmp.device_scale && opt_.max_logits_rows > cuda::kFp8GemvMaxRows)
      scratch = std::max(scratch, size_t(lmp.numel));
    if (scratch) fp8_scratch(scratch);
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
    slot_mapping_ = DeviceBuffer<int32_t>(cap);
    // Activations (zero-filled once: GEMM inputs of padding rows stay finite).
    auto act = [&](int64_t cols) {
      DeviceBuffer<bf16> b(size_t(cap * std::max<int64_t>(cols, 1)));
      b.fill_bytes(0);
      return b;
    };
    h_ = act(H);
    x_ = act(H);
    y_ = act(H);
    if (fused_cols_ > 0) proj_ = act(fused_cols_);
    bool unfused_attn = false, unfused_gdn = false;
    for (size_t l = 0; l < fused_.size(); ++l)
      if (!fused_[l].any()) (c.layer_types[l] == LayerType::FullAttention ? unfused_attn : unfused_gdn) = true;
    if (c.num_layers_of(LayerType::FullAttention)) {
      if (unfused_attn) {
        qg_ = act(c.q_proj_rows());
        k_ = act(c.num_kv_heads * c.head_dim);
        v_ = act(c.num_kv_heads * c.head_dim);
      }
      o_ = act(c.num_heads * c.head_dim);
    }
    if (c.num_layers_of(LayerType::LinearAttention)) {
      if (unfused_gdn) {
        mixed_ = act(c.conv_dim());
        z_ = act(c.value_dim());
        gb_ = act(c.linear_num_value_heads);
        ga_ = act(c.linear_num_value_heads);
      }
      conv_ = act(c.conv_dim());
      go_ = act(c.value_dim());
    }
    // The decode GEMM's split partials: one workspace for every dense weight (calls are serialised
    // on stream_), zero-filled once.
    size_t dgemm_bytes = cuda::decode_gemm_workspace_bytes(cuda::kDecodeGemmMaxRows, c.vocab_size, H);
    for (size_t l = 0; l < w_.layers.size(); ++l) {
      auto need = [&](int64_t out, int64_t in) {
        if (in >= 8 && in % 8 == 0)
          dgemm_bytes = std::max(dgemm_bytes, cuda::decode_gemm_workspace_bytes(cuda::kDecodeGemmMaxRows, out, in));
      };
      const LayerWeights& L = w_.layers[l];
      if (fused_[l].any()) need(fused_[l].rows, H);
      for_each_linear(L, [&](const Linear& lin) { if (lin.w.device) need(lin.out, lin.in); });
    }
    dgemm_ws_ = DeviceBuffer<uint8_t>(std::max<size_t>(dgemm_bytes, 16));
    dgemm_ws_.fill_bytes(0);
    int64_t ffn = 0;
    for (int64_t l = 0; l < c.num_layers; ++l)
      ffn = std::max(ffn, c.layer_is_moe[size_t(l)] ? c.shared_expert_intermediate_size : c.intermediate_size);
    if (ffn > 0) {
      gu_ = act(2 * ffn);
      ffn_act_ = act(ffn);
    }
    if (shard_) tp_ = std::make_unique<CudaTpRank>(*shard_, c, cap, opt_.max_logits_rows, stream_);
    if (c.num_experts > 0 && !tp_) {  // (a rank of a tensor-parallel group has its own MoE workspaces)
      moe_shape_ = {int(cap), int(c.num_experts), int(c.num_experts_per_tok), int(H), int(c.moe_intermediate_size)};
      const size_t bytes = cuda::moe_workspace_bytes(moe_shape_);
      moe_ws_mem_ = DeviceBuffer<uint8_t>(bytes);
      moe_ws_ = cuda::moe_workspace_bind(moe_ws_mem_.data(), bytes, moe_shape_);
      if (fp8_prefill_experts_) {
        const size_t fb = cuda::moe_fp8_prefill_scratch_bytes(moe_shape_);
        moe_fp8_mem_ = DeviceBuffer<uint8_t>(fb);
        moe_fp8_mem_.fill_bytes(0);  // down's A tiles by TMA read rows past the live pairs (discarded)
        moe_fp8_ = cuda::moe_fp8_prefill_scratch_bind(moe_fp8_mem_.data(), fb, moe_shape_);
      }
    }
    hr_ = DeviceBuffer<bf16>(size_t(opt_.max_logits_rows) * size_t(H));
    hr_.fill_bytes(0);  // the lm_head reads a graph bucket's padding rows too
    logits_ = DeviceBuffer<float>(size_t(opt_.max_logits_rows) * size_t(c.vocab_size));
    // KV cache and state pool: the state pool first, then the KV pages, sized from free memory when
    // num_blocks <= 0 (everything else is allocated by now).
    MOEFOLD_CHECK(opt_.num_snapshot_slots >= 0, "num_snapshot_slots must be >= 0, got {}", opt_.num_snapshot_slots);
    const int64_t pool_slots = S + opt_.num_snapshot_slots;  // live sequences, then snapshots
    snapshots_ = DeviceBuffer<int32_t>(size_t(3 * kMaxStepSnapshots + 1));
    for (int64_t l = 0; l < c.num_layers; ++l)
      if (c.layer_types[size_t(l)] == LayerType::LinearAttention) {
        conv_state_.emplace_back(size_t(pool_slots) * size_t(c.conv_dim() * (c.linear_conv_kernel_dim - 1)));
        rec_state_.emplace_back(size_t(pool_slots) * size_t(c.linear_num_value_heads * c.linear_key_head_dim *
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
      const double per_block = double(c.kv_bytes_per_token(kv_elem_bytes(kv_elem_for(opt_.kv_cache_dtype, true)))) *
                               opt_.block_size;
      const int64_t blocks = per_block > 0 ? int64_t(budget / per_block) : 1;
      MOEFOLD_CHECK(blocks >= 1, "no GPU memory left for the KV cache ({:.1f} GiB free of {:.1f} GiB)",
                    double(free_b) / 1073741824.0, double(total_b) / 1073741824.0);
      opt_.num_blocks = int32_t(std::min<int64_t>(blocks, 1 << 24));
    }
    if (opt_.max_blocks_per_seq <= 0 || opt_.max_blocks_per_seq > opt_.num_blocks) opt_.max_blocks_per_seq = opt_.num_blocks;
    meta_.reserve({cap, S, opt_.max_blocks_per_seq}, int64_t(kNumCounts));
    bind_metadata();
    if (c.num_layers_of(LayerType::FullAttention)) {
      decode_ws_bytes_ = cuda::attention_decode_workspace_bytes(S, attention_shape(),
                                                                int64_t(opt_.max_blocks_per_seq) * opt_.block_size);
      decode_ws_ = DeviceBuffer<uint8_t>(std::max<size_t>(decode_ws_bytes_, 1));
    }
    kv_elems_ = int64_t(opt_.num_blocks) * opt_.block_size * c.num_kv_heads * c.head_dim;
    kv_fp8_ = opt_.kv_cache_dtype == KvCacheDtype::Fp8E4m3;
    std::vector<float> scales;  // [layer][k | v][Hkv]: the checkpoint's, else 1
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const bool attn = c.layer_types[size_t(l)] == LayerType::FullAttention;
      k_cache_.emplace_back(), v_cache_.emplace_back(), k_cache8_.emplace_back(), v_cache8_.emplace_back();
      if (attn && kv_fp8_) {
        k_cache8_.back() = DeviceBuffer<uint8_t>(size_t(kv_elems_));
        v_cache8_.back() = DeviceBuffer<uint8_t>(size_t(kv_elems_));
      } else if (attn) {
        k_cache_.back() = DeviceBuffer<bf16>(size_t(kv_elems_));
        v_cache_.back() = DeviceBuffer<bf16>(size_t(kv_elems_));
      }
      const AttentionWeights& aw = w_.layers[size_t(l)].attn;
      for (const std::vector<float>* s : {&aw.k_scale, &aw.v_scale})
        for (int64_t h = 0; h < c.num_kv_heads; ++h) scales.push_back(s->empty() ? 1.0f : (*s)[size_t(h)]);
    }
    if (kv_fp8_) {
      kv_scales_ = DeviceBuffer<float>(std::max<size_t>(scales.size(), 1));
      kv_scales_.upload(scales);
      kv_saturated_ = DeviceBuffer<unsigned long long>(1);
      kv_saturated_.fill_bytes(0);
    }
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    if (!opt_.enforce_eager) setup_graphs();
  }

  /// Decode-step CUDA graphs: buckets within the executor's limits and KV-length classes (block-table
  /// strides for 4k, 32k and 256k tokens, capped by max_blocks_per_seq; a step with a longer context
  /// runs eagerly). Every bucket of the shortest class is captured now; other classes when first used.
  void setup_graphs() {
    // With batch invariance, buckets stay within the decode GEMM's 256 rows (the invariant GEMMs above
    // that give the same bits, but graphs of such buckets have not been checked against eager steps).
    const int32_t most = opt_.batch_invariant ? int32_t(cuda::kDecodeGemmMaxRows) : INT32_MAX;
    for (int32_t n : opt_.cuda_graph_sizes)
      if (n >= 1 && n <= opt_.num_slots && n <= opt_.max_rows && n <= opt_.max_logits_rows && n <= most)
        graph_buckets_.push_back(n);
    std::sort(graph_buckets_.begin(), graph_buckets_.end());
    graph_buckets_.erase(std::unique(graph_buckets_.begin(), graph_buckets_.end()), graph_buckets_.end());
    const int32_t mb = opt_.max_blocks_per_seq, bs = opt_.block_size;
    for (int64_t kv : {int64_t(4096), int64_t(32768), int64_t(262144)}) {
      const int32_t stride = int32_t((kv + bs - 1) / bs);
      if (stride < mb) table_strides_.push_back(stride);
      else {
        table_strides_.push_back(mb);
        break;
      }
    }
    if (graph_buckets_.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    size_t free0 = 0, free1 = 0, total = 0;
    MOEFOLD_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    const bool log = opt_.log_graphs;
    opt_.log_graphs = false;
    size_t nodes = 0;
    for (int32_t n : graph_buckets_) {
      StepDims d;
      d.rows = d.seqs = d.logits_rows = n;
      d.decode = true;
      d.max_q_len = 1;
      d.table_stride = table_strides_.front();
      nodes += capture(d).num_nodes();
    }
    opt_.log_graphs = log;
    MOEFOLD_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (log)
      fmt::print(stderr, "moefold: captured {} decode CUDA graphs (batch sizes {}; {} nodes) in {:.0f} ms, {:.1f} MiB\n",
                 graph_buckets_.size(), fmt::join(graph_buckets_, ","), nodes, ms,
                 double(int64_t(free0) - int64_t(free1)) / 1048576.0);
  }

  const ModelConfig& config() const override { return cfg_; }
  std::string device() const override { return "cuda:" + std::to_string(opt_.device); }
  int32_t num_kv_blocks() const override { return opt_.num_blocks; }

  void reset_slot(int32_t s) override {
    MOEFOLD_CHECK(s >= 0 && s < num_state_slots(), "state slot {} outside [0, {})", s, num_state_slots());
    for (size_t l = 0; l < conv_state_.size(); ++l) {
      if (conv_state_[l].empty()) continue;
      const size_t ce = conv_elems(l), re = rec_elems(l);
      cuda::fill_device_bytes(conv_state_[l].data() + size_t(s) * ce, 0, ce * sizeof(bf16), stream_);
      cuda::fill_device_bytes(rec_state_[l].data() + size_t(s) * re, 0, re * sizeof(float), stream_);
    }
  }
  int32_t num_state_slots() const override { return opt_.num_slots + opt_.num_snapshot_slots; }
  void copy_slot(int32_t src, int32_t dst) override {
    MOEFOLD_CHECK(src >= 0 && src < num_state_slots() && dst >= 0 && dst < num_state_slots(),
                  "state slot copy {} -> {} outside [0, {})", src, dst, num_state_slots());
    if (src == dst) return;
    for (size_t l = 0; l < conv_state_.size(); ++l) {
      if (conv_state_[l].empty()) continue;
      const size_t ce = conv_elems(l), re = rec_elems(l);
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(conv_state_[l].data() + size_t(dst) * ce, conv_state_[l].data() + size_t(src) * ce,
                                         ce * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(rec_state_[l].data() + size_t(dst) * re, rec_state_[l].data() + size_t(src) * re,
                                         re * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  int64_t state_slot_bytes() const override {
    int64_t b = 0;
    for (size_t l = 0; l < conv_state_.size(); ++l)
      if (!conv_state_[l].empty()) b += int64_t(conv_elems(l) * sizeof(bf16) + rec_elems(l) * sizeof(float));
    return b;
  }

  void forward(const ForwardBatch& b, std::vector<float>& logits) override;
  void forward_sample(const ForwardBatch& b, std::span<const RowSampling> rows, std::span<const int32_t> masked,
                      std::vector<SampleResult>& out) override;
  void set_routing(RoutingControl routing) override { routing_ = routing; }

 private:
  size_t conv_elems(size_t l) const { return conv_state_[l].size() / size_t(num_state_slots()); }
  size_t rec_elems(size_t l) const { return rec_state_[l].size() / size_t(num_state_slots()); }
  /// Copies the conv inputs before each snapshot row into the snapshot slots (layer l; `mixed` rows
  /// `stride` elements apart), as the conv prefill would leave them after that row.
  void snapshot_conv(size_t l, const bf16* mixed, int64_t stride);
  cuda::AttentionShape attention_shape() const {
    cuda::AttentionShape sh;
    sh.num_heads = int(cfg_.num_heads);
    sh.num_kv_heads = int(cfg_.num_kv_heads);
    sh.head_dim = int(cfg_.head_dim);
    sh.block_size = opt_.block_size;
    sh.batch_invariant = opt_.batch_invariant;
    if (cfg_.attn_output_gate) {  // q_proj output per head: [query D | gate D], read in place
      sh.q_token_stride = 2 * cfg_.num_heads * cfg_.head_dim;
      sh.q_head_stride = 2 * cfg_.head_dim;
      sh.gate_token_stride = sh.q_token_stride;
      sh.gate_head_stride = sh.q_head_stride;
    }
    return sh;
  }
  void gemm(const Linear& l, const bf16* x, bf16* y, int64_t T) {
    const bf16* b = l.b.empty() ? nullptr : dev(l.b);
    if (!l.w.device_scale) return dense(x, dev(l.w), b, y, T, l.in, l.out);
    // FP8 weight: the FP8 GEMV for decode-sized steps, else a bf16 copy and the bf16 GEMMs (prefill).
    const auto* w8 = static_cast<const uint8_t*>(l.w.device);
    const auto* sc = static_cast<const float*>(l.w.device_scale);
    if (T <= cuda::kFp8GemvMaxRows && cuda::fp8_gemv_supported(l.in, x, 0, w8))
      return cuda::fp8_gemv(x, w8, sc, b, y, T, l.in, l.out, counts_.data(), stream_);
    dense_dequantised(w8, sc, b, x, y, T, l.in, l.out);
  }
  /// y[T, out] (row stride y_stride, 0 = out) = x . w^T for a block-scaled FP8 weight w8 / sc [out, in]
  /// through a bf16 copy in fp8_scratch_ and the bf16 GEMMs (the steps fp8_gemv does not take).
  void dense_dequantised(const uint8_t* w8, const float* sc, const bf16* b, const bf16* x, bf16* y, int64_t T,
                         int64_t in, int64_t out, int64_t y_stride = 0) {
    cuda::fp8_dequantize_bf16(w8, sc, out, in, fp8_scratch(size_t(out * in)), stream_);
    dense(x, fp8_scratch_.data(), b, y, T, in, out, 0, y_stride);
  }
  /// bf16 scratch of at least n elements for dequantised FP8 weights (prefill steps, never captured).
  bf16* fp8_scratch(size_t n) {
    if (fp8_scratch_.size() < n) fp8_scratch_ = DeviceBuffer<bf16>(n);
    return fp8_scratch_.data();
  }
  /// y[T, out] = x[T, in] . w^T (+ b) over the step's live rows (counts_[live_index] on the device):
  /// with batch_invariant (default), every row count runs the decode GEMM's reduction order, which
  /// depends only on the weight's shape (the decode GEMM up to 256 rows, the prefill GEMM above, see
  /// invariant_gemm.h); otherwise up to 16 rows run the GEMV, the rest cuBLASLt.
  /// On `on` (null: stream_); only the decode GEMM and the GEMV may run off stream_ (they share no state
  /// with what runs beside them: the decode GEMM's workspace is used by one GEMM at a time).
  void dense(const bf16* x, const bf16* w, const bf16* b, bf16* y, int64_t T, int64_t in, int64_t out,
             int64_t x_stride = 0, int64_t y_stride = 0, int live_index = 0, cudaStream_t on = nullptr) {
    const int32_t* live = counts_.data() + live_index;
    cudaStream_t st = on ? on : stream_;
    if (opt_.batch_invariant && decode_gemm_fits(x, w, in, x_stride))  // decode GEMM, or its arithmetic above 256 rows
      cuda::invariant_gemm_bf16(x, w, b, y, T, in, out, live, dgemm_ws_.data(), st, x_stride, y_stride);
    else if (!opt_.batch_invariant && T <= kGemvRows)
      cuda::gemv_bf16(x, w, b, y, T, in, out, live, st, x_stride, y_stride);
    else
      cuda::gemm_bf16(x, w, b, y, T, in, out, stream_, false, x_stride, y_stride);
  }
  static constexpr int64_t kGemvRows = 16;
  /// Whether this MoE layer's shared expert runs inside the streaming expert kernels at `step`
  /// (moe_forward_shared, switched by cuda::moe_shared_stream_enabled()): only where the separate chain
  /// would be batch-invariant dense GEMMs of bf16 weights without bias beside the bf16 routed experts
  /// on one GPU, so both give the same bits.
  bool shared_expert_fusable(const MoeWeights& m, const cuda::MoeShape& step) const {
    const int64_t Is = cfg_.shared_expert_intermediate_size;
    const Linear &gu = m.shared_gate_up, &dn = m.shared_down;
    return cuda::moe_shared_stream_enabled() && Is > 0 && !tp_ && opt_.batch_invariant && !m.gate_up.device_scale &&
           !gu.w.device_scale && !dn.w.device_scale && gu.b.empty() && dn.b.empty() && gu.out == 2 * Is &&
           gu.in == cfg_.hidden_size && dn.in == Is && dn.out == cfg_.hidden_size &&
           decode_gemm_fits(x_.data(), dev(gu.w), gu.in, 0) && decode_gemm_fits(ffn_act_.data(), dev(dn.w), dn.in, 0) &&
           cuda::moe_shared_fusable(step, int(Is));
  }
  /// Whether this MoE layer's FP8 shared expert runs inside the one-token FP8 stream kernels
  /// (moe_fp8_forward_shared; MOEFOLD_MOE_SHARED_STREAM's switch too): FP8 routed and shared weights
  /// without bias on one GPU, a one-row step, and the dense chain it replaces (fp8_gemv, swiglu, fp8_gemv)
  /// is what gemm() would run, so both give the same bits.
  bool fp8_shared_expert_fusable(const MoeWeights& m, const cuda::MoeShape& step) const {
    const int64_t Is = cfg_.shared_expert_intermediate_size;
    const Linear &gu = m.shared_gate_up, &dn = m.shared_down;
    if (!cuda::moe_shared_stream_enabled() || Is <= 0 || tp_ || step.capacity != 1 || !m.gate_up.device_scale ||
        !gu.w.device_scale || !dn.w.device_scale || !gu.b.empty() || !dn.b.empty() || gu.out != 2 * Is ||
        gu.in != cfg_.hidden_size || dn.in != Is || dn.out != cfg_.hidden_size ||
        !cuda::fp8_gemv_supported(gu.in, x_.data(), 0, gu.w.device) ||
        !cuda::fp8_gemv_supported(dn.in, ffn_act_.data(), 0, dn.w.device))
      return false;
    cuda::MoeShape s = step;
    s.expert_tiles = cuda::kMoeExpertGemv;
    return cuda::moe_fp8_shared_fusable(s, int(Is));
  }
  /// The decode GEMM's preconditions (decode_gemm.h): K a multiple of 8, 16-byte rows of x and w.
  static bool decode_gemm_fits(const void* x, const void* w, int64_t in, int64_t x_stride) {
    auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    return in >= 8 && in % 8 == 0 && (x_stride ? x_stride : in) % 8 == 0 && al(x) && al(w);
  }
  /// Validates the step, uploads it (padded to `d`) and runs it, as a graph replay when one serves
  /// it. Leaves the logits of the first min(R, max_logits_rows) rows in logits_; returns true when
  /// that is all R of them.
  bool run_step(const ForwardBatch& b);
  /// The host facts of a step as eager execution runs it.
  StepDims eager_dims(const ForwardBatch& b) const;
  /// With split_mixed_steps, a mixed step's batch with its prefill sequences first and its decode
  /// sequences (one row after cached context) after them, each group in its original order; logits
  /// rows keep their output order, snapshots name the moved sequences. Sets *prefill_seqs (0 unless
  /// the step is mixed). Returns `b` itself when it is not mixed or already in that order, else
  /// perm_batch_, with row_perm_[new row] = the row in `b` (empty when `b` is returned).
  const ForwardBatch& order_mixed(const ForwardBatch& b, int32_t* prefill_seqs);
  /// Puts the MoE routing captured in a reordered step back into the caller's row order (after the
  /// step's stream has been synchronised).
  void restore_capture_order();
  /// The graph that runs `b` (captured now if needed), with the dims it was captured for; nullptr
  /// when the step runs eagerly.
  cuda::CapturedGraph* graph_for(const ForwardBatch& b, StepDims& d);
  /// Captures the graph of a decode step of dims `d` (warm-up run first, outside the capture).
  cuda::CapturedGraph& capture(const StepDims& d);
  /// Points the metadata views (ids_, counts_, ...) at meta_'s current layout.
  void bind_metadata();
  /// Uploads the batch, padded to `d` (sequences beyond the batch have no rows and context -1).
  void upload_batch(const ForwardBatch& b, const StepDims& d);
  /// Every launch of a step with dims d: embedding, layers and (when d.logits_rows > 0) the first
  /// lm_head pass. Pure device work over the uploaded batch: capturable in a CUDA graph.
  void launch_step(const StepDims& d);
  /// lm_head pass over logits rows [r0, r0 + n): logits_[0 .. n) (live count: counts_[3] when r0 == 0).
  void launch_head(int64_t rows, int64_t r0, int64_t n, bool live_from_device);
  void attention(size_t l, const StepDims& d);
  void deltanet(size_t l, const StepDims& d);
  /// FFN of layer l with its residual add into h. Returns whether it also wrote x = RMSNorm_in(h) of layer
  /// l + 1 (the combine's or the residual add's epilogue), so that the next layer skips its input norm.
  bool ffn(size_t l, int64_t T, size_t moe_index);

  ModelConfig cfg_;
  CudaExecutorOptions opt_;
  cudaStream_t stream_ = nullptr;
  // A second stream for a small GEMM that may run beside the one on stream_ (fused_gemm), forked from and
  // joined back into stream_ by the two events (inside a graph capture, they become the graph's edges).
  cudaStream_t aux_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  ModelWeights w_;
  std::vector<DeviceBuffer<bf16>> weights_store_;
  std::vector<DeviceBuffer<uint8_t>> fp8_store_;   // e4m3 weights (Param::device_scale set)
  std::vector<DeviceBuffer<float>> scale_store_;   // their per-row block scales
  DeviceBuffer<bf16> fp8_scratch_;                 // dequantised FP8 weights of a prefill step
  std::vector<DeviceBuffer<float>> fp32_store_;
  std::vector<const float*> a_log_, dt_bias_;
  std::vector<Fused> fused_;
  int64_t fused_cols_ = 0;
  DeviceBuffer<bf16> proj_;  // [max_rows, fused_cols_]: the fused projections' output
  DeviceBuffer<uint8_t> dgemm_ws_;  // the decode GEMM's split partials and tile counters
  std::unique_ptr<DeviceSampler> sampler_;  // created on the first forward_sample
  int32_t* oob_host_ = nullptr;              // pinned: the step's out-of-range flag
  std::unique_ptr<cuda::RopeFreqs> freqs_;
  DeviceBuffer<int32_t> slot_mapping_;
  // The step's int32 inputs: views into meta_'s arena for the current step's layout (bind_metadata).
  struct MetaView {
    int32_t* p = nullptr;
    int32_t* data() const { return p; }
  };
  MetaView ids_, positions_, logits_rows_, cu_seqlens_, context_lens_, state_slots_, block_tables_, counts_;
  cuda::StepMetadata meta_;
  DeviceBuffer<bf16> h_, x_, y_, qg_, k_, v_, o_, mixed_, conv_, z_, gb_, ga_, go_, gu_, ffn_act_, hr_;
  DeviceBuffer<float> logits_;
  DeviceBuffer<uint8_t> decode_ws_, moe_ws_mem_;
  size_t decode_ws_bytes_ = 0;
  int64_t kv_elems_ = 0;
  cuda::MoeShape moe_shape_;
  cuda::MoeWorkspace moe_ws_;
  DeviceBuffer<uint8_t> moe_fp8_mem_;  // the W8A8 prefill experts' quantised activations
  cuda::MoeFp8PrefillScratch moe_fp8_;
  /// Whether steps of more than kMoeFp8MaxRows rows run the FP8 experts as W8A8 (moe_fp8_prefill_forward;
  /// set at load by cuda::moe_fp8_prefill_runs for a single device) rather than the bf16 chain over
  /// dequantised copies. Every row of such a step (decode rows beside a prefill chunk too) gets W8A8
  /// experts, while smaller steps run W8A16: batch invariance holds on each side of that bound (docs/fp8.md).
  bool fp8_prefill_experts_ = false;
  std::vector<DeviceBuffer<bf16>> k_cache_, v_cache_, conv_state_;
  bool kv_fp8_ = false;                                 // --kv-cache-dtype fp8: k_cache8_ / v_cache8_
  std::vector<DeviceBuffer<uint8_t>> k_cache8_, v_cache8_;
  DeviceBuffer<float> kv_scales_;                       // [layer][k | v][Hkv]
  DeviceBuffer<unsigned long long> kv_saturated_;       // FP8 elements saturated on store
  std::vector<DeviceBuffer<float>> rec_state_;
  DeviceBuffer<int32_t> snapshots_;   // [kMaxStepSnapshots] cuda::GdnSnapshot, then the live count
  std::vector<StateSnapshot> step_snapshots_;  // the current step's (host), with row offsets below
  std::vector<int32_t> step_snapshot_rows_;    // per snapshot: the step row where its state is taken
  std::vector<int32_t> snap_host_;             // the snapshot table as uploaded
  RoutingControl routing_;
  std::unique_ptr<CudaShard> shard_;  // set: one rank of a tensor-parallel group (cuda_tp_rank.h)
  std::unique_ptr<CudaTpRank> tp_;    // its collectives (made in finish_load)
  bool follower_ = false;             // a rank other than 0: no logits download, no sampling
  DeviceBuffer<int32_t> replay_ids_;  // [MoE layers, T, k] of the current step when replaying
  // CUDA graphs of decode steps, by (bucket rows, block-table stride); padded host copies of the batch.
  std::map<std::pair<int64_t, int32_t>, std::unique_ptr<cuda::CapturedGraph>> graphs_;
  std::vector<int32_t> graph_buckets_;       // sorted, each <= the executor's limits
  std::vector<int32_t> table_strides_;       // block-table strides of the KV-length classes, ascending
  // A mixed step reordered by order_mixed: the batch uploaded, its row order, host staging.
  ForwardBatch perm_batch_;
  std::vector<int32_t> row_perm_, row_new_, seq_new_, perm_ids_;
  std::vector<uint8_t> seq_decode_;
};

StepDims CudaExecutor::eager_dims(const ForwardBatch& b) const {
  StepDims d;
  d.rows = b.num_rows();
  d.seqs = b.num_seqs();
  d.decode = true;
  for (int32_t s = 0; s < d.seqs; ++s) {
    const int n = b.cu_seqlens[size_t(s + 1)] - b.cu_seqlens[size_t(s)];
    d.max_q_len = std::max(d.max_q_len, n);
    d.decode = d.decode && b.decode_rows(s) && b.context_lens[size_t(s)] > 0;
  }
  d.table_stride = b.max_blocks_per_seq;
  d.logits_rows = std::min<int64_t>(int64_t(b.logits_rows.size()), opt_.max_logits_rows);
  return d;
}

const ForwardBatch& CudaExecutor::order_mixed(const ForwardBatch& b, int32_t* prefill_seqs) {
  row_perm_.clear();
  *prefill_seqs = 0;
  const int32_t S = b.num_seqs(), T = b.num_rows();
  if (!opt_.split_mixed_steps) return b;
  // The decode form exactly as a pure decode step takes it (eager_dims): one generated row after
  // cached context. Everything else (prompt rows, a first row without context) takes the prefill form.
  seq_decode_.assign(size_t(S), 0);
  int32_t nd = 0;
  for (int32_t s = 0; s < S; ++s) nd += seq_decode_[size_t(s)] = b.decode_rows(s) && b.context_lens[size_t(s)] > 0;
  if (nd == 0 || nd == S) return b;
  const int32_t Sp = S - nd;
  *prefill_seqs = Sp;
  bool ordered = true;
  for (int32_t s = 0; s < S; ++s) ordered = ordered && bool(seq_decode_[size_t(s)]) == (s >= Sp);
  if (ordered) return b;
  ForwardBatch& p = perm_batch_;
  const int32_t mb = b.max_blocks_per_seq;
  p.token_ids.clear();
  p.positions.clear();
  p.cu_seqlens.assign(1, 0);
  p.context_lens.clear();
  p.block_tables.clear();
  p.max_blocks_per_seq = mb;
  p.state_slots.clear();
  p.prefill.clear();
  row_new_.assign(size_t(T), -1);
  seq_new_.assign(size_t(S), -1);
  for (int pass = 0; pass < 2; ++pass)  // prefill sequences, then decode ones
    for (int32_t s = 0; s < S; ++s) {
      if (bool(seq_decode_[size_t(s)]) != (pass == 1)) continue;
      seq_new_[size_t(s)] = p.num_seqs();
      for (int32_t r = b.cu_seqlens[size_t(s)]; r < b.cu_seqlens[size_t(s + 1)]; ++r) {
        row_new_[size_t(r)] = p.num_rows();
        row_perm_.push_back(r);
        p.token_ids.push_back(b.token_ids[size_t(r)]);
        p.positions.push_back(b.positions[size_t(r)]);
      }
      p.cu_seqlens.push_back(p.num_rows());
      p.context_lens.push_back(b.context_lens[size_t(s)]);
      p.state_slots.push_back(b.state_slots[size_t(s)]);
      if (!b.prefill.empty()) p.prefill.push_back(b.prefill[size_t(s)]);
      p.block_tables.insert(p.block_tables.end(), b.block_table(s), b.block_table(s) + mb);
    }
  p.logits_rows.clear();
  for (int32_t r : b.logits_rows) p.logits_rows.push_back(row_new_[size_t(r)]);
  p.snapshots = b.snapshots;
  for (StateSnapshot& sn : p.snapshots) sn.seq = sn.seq >= 0 && sn.seq < S ? seq_new_[size_t(sn.seq)] : sn.seq;
  return p;
}

void CudaExecutor::restore_capture_order() {
  if (row_perm_.empty() || !routing_.capture) return;
  const size_t k = size_t(cfg_.num_experts_per_tok);
  for (std::vector<int32_t>& layer : routing_.capture->layers) {
    perm_ids_ = layer;
    for (size_t r = 0; r < row_perm_.size(); ++r)
      std::copy_n(perm_ids_.begin() + r * k, k, layer.begin() + size_t(row_perm_[r]) * k);
  }
}

cuda::CapturedGraph* CudaExecutor::graph_for(const ForwardBatch& b, StepDims& d) {
  // Graphs serve decode steps whose logits fit one lm_head pass; profiling (per-launch events),
  // routing capture (a copy to the host per layer) and replay (a per-step upload) run eagerly.
  if (graph_buckets_.empty() || !d.decode || routing_.capture || routing_.replay || prof::timing_active())
    return nullptr;
  if (int64_t(b.logits_rows.size()) != d.rows) return nullptr;
  const auto bucket = std::lower_bound(graph_buckets_.begin(), graph_buckets_.end(), int32_t(d.rows));
  const auto stride = std::lower_bound(table_strides_.begin(), table_strides_.end(), b.max_blocks_per_seq);
  if (bucket == graph_buckets_.end() || stride == table_strides_.end()) return nullptr;
  StepDims g;
  g.rows = *bucket;
  g.seqs = *bucket;
  g.decode = true;
  g.max_q_len = 1;
  g.table_stride = *stride;
  g.logits_rows = *bucket;
  auto it = graphs_.find({g.rows, g.table_stride});
  cuda::CapturedGraph* graph = nullptr;
  if (it != graphs_.end()) {
    graph = it->second.get();  // null: its capture failed earlier, this shape runs eagerly
  } else {
    try {
      graph = &capture(g);
    } catch (const Error& e) {  // e.g. no memory left to instantiate it: run such steps eagerly
      graphs_[{g.rows, g.table_stride}] = nullptr;
      fmt::print(stderr, "moefold: decode graph rows={} kv_tokens={} not captured ({}); such steps run eagerly\n",
                 g.rows, int64_t(g.table_stride) * opt_.block_size, e.what());
    }
  }
  if (graph) d = g;
  return graph;
}

cuda::CapturedGraph& CudaExecutor::capture(const StepDims& d) {
  const auto t0 = std::chrono::steady_clock::now();
  size_t free0 = 0, free1 = 0, total = 0;
  MOEFOLD_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  // An empty step of these dims: no live row or sequence, so the warm-up run (which creates the
  // cuBLASLt plans and workspaces of these shapes outside the capture) computes nothing real.
  ForwardBatch empty;
  empty.max_blocks_per_seq = d.table_stride;
  empty.cu_seqlens = {0};
  upload_batch(empty, d);
  cuda::run_uncounted([&] { launch_step(d); });  // not a model step: --require-kernel must not see it
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  auto graph = cuda::CapturedGraph::capture(stream_, [&] { launch_step(d); });
  MOEFOLD_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (opt_.log_graphs)
    fmt::print(stderr, "moefold: captured decode graph rows={} kv_tokens={} ({} nodes) in {:.1f} ms, {:.1f} MiB\n",
               d.rows, int64_t(d.table_stride) * opt_.block_size, graph->num_nodes(), ms,
               double(int64_t(free0) - int64_t(free1)) / 1048576.0);
  return *(graphs_[{d.rows, d.table_stride}] = std::move(graph));
}

void CudaExecutor::bind_metadata() {
  using F = cuda::StepMetadata::Field;
  ids_.p = meta_.device(F::Ids);
  positions_.p = meta_.device(F::Positions);
  logits_rows_.p = meta_.device(F::LogitsRows);
  state_slots_.p = meta_.device(F::StateSlots);
  cu_seqlens_.p = meta_.device(F::CuSeqlens);
  context_lens_.p = meta_.device(F::ContextLens);
  block_tables_.p = meta_.device(F::BlockTables);
  counts_.p = meta_.device(F::Counts);
}

void CudaExecutor::upload_batch(const ForwardBatch& b, const StepDims& d) {
  using F = cuda::StepMetadata::Field;
  const int32_t T = b.num_rows(), S = b.num_seqs();
  MOEFOLD_CHECK(T <= d.rows && S <= d.seqs && b.max_blocks_per_seq <= d.table_stride,
                "step of {} rows and {} sequences does not fit its dims {} x {}", T, S, d.rows, d.seqs);
  meta_.begin({d.rows, d.seqs, d.table_stride});
  bind_metadata();
  // Every word of the layout is written: the step's values, then padding that no kernel reads (rows
  // and sequences past the live ones: -1; padded sequences have no rows and context -1).
  auto put = [&](F f, const std::vector<int32_t>& h, int32_t pad) {
    int32_t* dst = meta_.host(f);
    std::copy(h.begin(), h.end(), dst);
    std::fill(dst + h.size(), dst + meta_.size(f), pad);
  };
  put(F::Ids, b.token_ids, -1);
  put(F::Positions, b.positions, -1);
  put(F::StateSlots, b.state_slots, -1);
  put(F::LogitsRows, b.logits_rows, -1);
  put(F::CuSeqlens, b.cu_seqlens, T);
  put(F::ContextLens, b.context_lens, -1);
  int32_t* tables = meta_.host(F::BlockTables);
  std::fill(tables, tables + meta_.size(F::BlockTables), -1);
  for (int32_t s = 0; s < S; ++s)
    std::copy_n(b.block_table(s), b.max_blocks_per_seq, tables + size_t(s) * size_t(d.table_stride));
  const int32_t sp = d.prefill_seqs;
  const int32_t counts[kNumCounts] = {T, S, 0, int32_t(b.logits_rows.size()), sp, sp > 0 ? S - sp : 0};
  std::copy_n(counts, kNumCounts, meta_.host(F::Counts));
  meta_.upload(stream_);
}

bool CudaExecutor::run_step(const ForwardBatch& in) {
  const ModelConfig& c = cfg_;
  const int64_t T = in.num_rows();
  const int32_t S = in.num_seqs();
  MOEFOLD_CHECK(T > 0 && T <= opt_.max_rows, "step has {} rows; this executor holds at most {}", T, opt_.max_rows);
  MOEFOLD_CHECK(S <= opt_.num_slots, "step has {} sequences; this executor holds at most {}", S, opt_.num_slots);
  MOEFOLD_CHECK(in.max_blocks_per_seq <= opt_.max_blocks_per_seq, "block table of {} pages exceeds the limit {}",
                in.max_blocks_per_seq, opt_.max_blocks_per_seq);
  for (int32_t r : in.logits_rows) MOEFOLD_CHECK(r >= 0 && r < T, "logits row {} outside the step's {} rows", r, T);
  step_snapshots_.clear();  // (a graph captured below must see none)
  step_snapshot_rows_.clear();
  int32_t prefill_seqs = 0;
  const ForwardBatch& b = order_mixed(in, &prefill_seqs);
  StepDims d = eager_dims(b);
  if (prefill_seqs > 0) {  // mixed: eager (graph_for takes decode steps only)
    d.prefill_seqs = prefill_seqs;
    d.prefill_rows = b.cu_seqlens[size_t(prefill_seqs)];
  }
  cuda::CapturedGraph* graph = graph_for(b, d);
  upload_batch(b, d);
  if (!b.snapshots.empty()) {
    MOEFOLD_CHECK(!d.decode && !graph, "DeltaNet snapshots requested in a decode step");
    MOEFOLD_CHECK(int32_t(b.snapshots.size()) <= kMaxStepSnapshots, "step asks for {} DeltaNet snapshots; at most {}",
                  b.snapshots.size(), kMaxStepSnapshots);
    snap_host_.assign(size_t(3 * kMaxStepSnapshots + 1), 0);
    for (size_t i = 0; i < b.snapshots.size(); ++i) {
      const StateSnapshot& sn = b.snapshots[i];
      MOEFOLD_CHECK(sn.seq >= 0 && sn.seq < S && sn.chunk >= 0 && sn.dst_slot >= opt_.num_slots &&
                        sn.dst_slot < num_state_slots(),
                    "snapshot {} (sequence {}, chunk {}, slot {}) is out of range", i, sn.seq, sn.chunk, sn.dst_slot);
      const int32_t r0 = b.cu_seqlens[size_t(sn.seq)], n = b.cu_seqlens[size_t(sn.seq + 1)] - r0;
      const int32_t p = kStateSnapshotChunk * (sn.chunk + 1);
      MOEFOLD_CHECK(p <= n && p >= c.linear_conv_kernel_dim - 1, "snapshot after chunk {} past sequence {}'s {} rows",
                    sn.chunk, sn.seq, n);
      step_snapshots_.push_back(sn);
      step_snapshot_rows_.push_back(r0 + p);
      snap_host_[3 * i] = sn.seq;
      snap_host_[3 * i + 1] = sn.chunk;
      snap_host_[3 * i + 2] = sn.dst_slot;
    }
    snap_host_[size_t(3 * kMaxStepSnapshots)] = int32_t(b.snapshots.size());
    snapshots_.upload(snap_host_.data(), snap_host_.size(), 0, stream_, true);
  }
  // Checked on the host: the top-k kernel would keep an id outside [0, E) and moe_plan drop its pair
  // silently (ws.status is not read back).
  prepare_routing(routing_, c, T);
  if (routing_.replay) {
    const auto& r = routing_.replay->layers;
    const size_t pairs = size_t(T * c.num_experts_per_tok);
    if (replay_ids_.size() < r.size() * pairs) replay_ids_ = DeviceBuffer<int32_t>(r.size() * pairs);
    if (row_perm_.empty()) {
      for (size_t i = 0; i < r.size(); ++i) replay_ids_.upload(r[i].data(), pairs, i * pairs, stream_, true);
    } else {  // the reordered rows' experts
      const size_t k = size_t(c.num_experts_per_tok);
      perm_ids_.resize(r.size() * pairs);
      for (size_t i = 0; i < r.size(); ++i)
        for (size_t row = 0; row < row_perm_.size(); ++row)
          std::copy_n(r[i].begin() + size_t(row_perm_[row]) * k, k, perm_ids_.begin() + i * pairs + row * k);
      replay_ids_.upload(perm_ids_.data(), perm_ids_.size(), 0, stream_, true);
    }
  }
  if (graph) graph->replay(stream_);
  else launch_step(d);
  return int64_t(b.logits_rows.size()) <= opt_.max_logits_rows;
}

void CudaExecutor::launch_step(const StepDims& d) {
  const ModelConfig& c = cfg_;
  const int64_t T = d.rows, H = c.hidden_size, V = c.vocab_size;
  size_t moe_index = 0;
  const int32_t* num_rows = counts_.data();

  // h = embed(tokens); x = RMSNorm_in(h) for layer 0
  if (tp_) tp_->embed(dev(w_.embed), ids_.data(), T, num_rows, counts_.data() + 2, h_.data());
  else cuda::embedding_gather(dev(w_.embed), V, H, ids_.data(), h_.data(), T, num_rows, counts_.data() + 2, stream_);
  const cpu::NormKind nk = c.norm_zero_centred ? cpu::NormKind::ZeroCentred : cpu::NormKind::Plain;
  const float eps = float(c.rms_norm_eps);
  if (c.num_layers_of(LayerType::FullAttention))
    cuda::compute_slot_mapping(cu_seqlens_.data(), context_lens_.data(), block_tables_.data(), d.table_stride,
                               opt_.block_size, d.seqs, d.max_q_len, slot_mapping_.data(), stream_);
  bool x_ready = false;  // x already holds RMSNorm_in(h) of layer l (the previous FFN's epilogue wrote it)
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& L = w_.layers[l];
    // h = h + Mixer(RMSNorm_in(h))
    if (!x_ready) cuda::rms_norm(h_.data(), dev(L.input_norm), x_.data(), T, H, eps, nk, num_rows, stream_);
    if (c.layer_types[l] == LayerType::FullAttention) attention(l, d);
    else deltanet(l, d);
    // h = h + FFN(RMSNorm_post(h))
    if (tp_) {  // the row-parallel partials summed over the ranks
      tp_->reduce_into_residual(y_.data(), h_.data(), T, num_rows);
      cuda::rms_norm(h_.data(), dev(L.post_attention_norm), x_.data(), T, H, eps, nk, num_rows, stream_);
    } else {
      cuda::add_rms_norm(h_.data(), y_.data(), dev(L.post_attention_norm), x_.data(), T, H, eps, nk, num_rows, stream_);
    }
    x_ready = ffn(l, T, moe_index);
    moe_index += c.layer_is_moe[l] ? 1 : 0;
  }
  if (d.logits_rows > 0) launch_head(T, 0, d.logits_rows, true);
}

// logits = lm_head(RMSNorm_final(h[logits_rows]))
void CudaExecutor::launch_head(int64_t rows, int64_t r0, int64_t n, bool live_from_device) {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const cpu::NormKind nk = c.norm_zero_centred ? cpu::NormKind::ZeroCentred : cpu::NormKind::Plain;
  const int32_t* live = live_from_device ? counts_.data() + 3 : nullptr;
  cuda::embedding_gather(h_.data(), rows, H, logits_rows_.data() + r0, hr_.data(), n, live,
                         counts_.data() + 2, stream_);
  cuda::rms_norm(hr_.data(), dev(w_.final_norm), hr_.data(), n, H, float(c.rms_norm_eps), nk, live, stream_);
  // A rank of a tensor-parallel group computes its vocabulary rows, then gathers every rank's.
  const int64_t Vh = tp_ ? tp_->vocab_rows() : V;
  float* out = tp_ ? tp_->local_logits() : logits_.data();
  const Param& lmp = w_.lm_head_param();
  if (Vh == 0) {
    // a rank past the end of a small vocabulary: its block is all padding (gather_logits zeroes it)
  } else if (lmp.device_scale) {  // --fp8-lm-head
    const auto* w8 = static_cast<const uint8_t*>(lmp.device);
    const auto* sc = static_cast<const float*>(lmp.device_scale);
    if (n <= cuda::kFp8GemvMaxRows && cuda::fp8_gemv_supported(H, hr_.data(), 0, w8)) {
      cuda::fp8_gemv_f32out(hr_.data(), w8, sc, nullptr, out, n, H, Vh, live, stream_);
    } else {
      cuda::fp8_dequantize_bf16(w8, sc, Vh, H, fp8_scratch(size_t(Vh * H)), stream_);
      cuda::gemm_bf16_f32out(hr_.data(), fp8_scratch_.data(), nullptr, out, n, H, Vh, stream_);
    }
  } else {
    const bf16* lm = dev(lmp);
    if (opt_.batch_invariant && decode_gemm_fits(hr_.data(), lm, H, 0))
      cuda::invariant_gemm_bf16_f32out(hr_.data(), lm, nullptr, out, n, H, Vh, live, dgemm_ws_.data(), stream_);
    else if (!opt_.batch_invariant && n <= kGemvRows)
      cuda::gemv_bf16_f32out(hr_.data(), lm, nullptr, out, n, H, Vh, live, stream_);
    else
      cuda::gemm_bf16_f32out(hr_.data(), lm, nullptr, out, n, H, Vh, stream_);
  }
  if (tp_) tp_->gather_logits(n, logits_.data());
}

void CudaExecutor::forward(const ForwardBatch& b, std::vector<float>& logits) {
  const int64_t V = cfg_.vocab_size, R = int64_t(b.logits_rows.size());
  const bool one_pass = run_step(b);
  logits.resize(size_t(R * V));
  if (one_pass) {
    if (R > 0 && !follower_) logits_.download(logits.data(), size_t(R * V), 0, stream_, true);
  } else {  // max_logits_rows rows per pass
    for (int64_t r0 = 0; r0 < R; r0 += opt_.max_logits_rows) {
      const int64_t n = std::min<int64_t>(opt_.max_logits_rows, R - r0);
      if (r0 > 0) launch_head(b.num_rows(), r0, n, false);
      if (!follower_) logits_.download(logits.data() + r0 * V, size_t(n * V), 0, stream_, true);
    }
  }
  int32_t oob = 0;
  MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(&oob, counts_.data() + 2, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  restore_capture_order();
  MOEFOLD_CHECK(oob == 0, "a token id or logits row of this step is out of range");
}

// The step on the GPU, then DeviceSampler on the logits rows, pass by pass (max_logits_rows rows
// each): only token ids and the requested logprobs come back to the host.
void CudaExecutor::forward_sample(const ForwardBatch& b, std::span<const RowSampling> rows,
                                  std::span<const int32_t> masked, std::vector<SampleResult>& out) {
  const int64_t R = int64_t(b.logits_rows.size());
  MOEFOLD_CHECK(int64_t(rows.size()) == R, "forward_sample: {} sampling rows for {} logits rows", rows.size(), R);
  if (!sampler_) sampler_ = std::make_unique<DeviceSampler>(opt_.max_logits_rows, cfg_.vocab_size);
  if (!oob_host_) MOEFOLD_CUDA_CHECK(cudaMallocHost(&oob_host_, sizeof(int32_t)));
  run_step(b);
  MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(oob_host_, counts_.data() + 2, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  out.clear();
  std::vector<SampleResult> part;
  for (int64_t r0 = 0; r0 < R; r0 += opt_.max_logits_rows) {
    const int64_t n = std::min<int64_t>(opt_.max_logits_rows, R - r0);
    if (r0 > 0) launch_head(b.num_rows(), r0, n, false);
    if (follower_) continue;  // rank 0 samples; this rank only took part in the lm_head's all-gather
    sampler_->sample(logits_.data(), rows.subspan(size_t(r0), size_t(n)), masked, part, stream_);  // synchronises
    out.insert(out.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  if (R == 0 || follower_) MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  restore_capture_order();
  MOEFOLD_CHECK(*oob_host_ == 0, "a token id or logits row of this step is out of range");
}

// Gated softmax attention, as Model::attention: [q | gate] = q_proj(x); k, v; q/k RMSNorm per head;
// RoPE; causal paged attention; o * sigmoid(gate) (fused); out = o_proj(o).
void CudaExecutor::attention(size_t l, const StepDims& d) {
  const AttentionWeights& a = w_.layers[l].attn;
  const ModelConfig& c = cfg_;
  const int64_t T = d.rows;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  const int32_t* num_rows = counts_.data();
  const cpu::NormKind nk = c.norm_zero_centred ? cpu::NormKind::ZeroCentred : cpu::NormKind::Plain;
  cuda::AttentionShape sh = attention_shape();
  // [q (| gate) | k | v] per token: one fused GEMM into proj_, read in place with strides, or three.
  bf16 *q = qg_.data(), *k = k_.data(), *v = v_.data();
  int64_t kv_stride = 0;
  const Fused& f = fused_[l];
  if (f.any()) {
    const int64_t W = f.rows;
    fused_gemm(f, x_.data(), proj_.data(), T);
    q = proj_.data();
    k = q + a.q_proj.out;
    v = k + a.k_proj.out;
    kv_stride = W;
    sh.q_token_stride = W;
    sh.q_head_stride = c.attn_output_gate ? 2 * D : D;
    sh.gate_token_stride = sh.q_token_stride;
    sh.gate_head_stride = sh.q_head_stride;
  } else {
    gemm(a.q_proj, x_.data(), qg_.data(), T);
    gemm(a.k_proj, x_.data(), k_.data(), T);
    gemm(a.v_proj, x_.data(), v_.data(), T);
  }
  cuda::HeadRows q_rows{Hq, sh.q_token_stride, sh.q_head_stride}, k_rows{Hkv, kv_stride, kv_stride ? D : 0};
  // q / k norms, RoPE and the bf16 cache write in one launch where the layout allows (the same bits).
  cuda::QkNormRopeArgs qa{q, q_rows, k, k_rows, v, kv_stride, nullptr, nullptr, float(c.rms_norm_eps), nk,
                          nullptr, nullptr, slot_mapping_.data(), positions_.data()};
  if (c.qk_norm && !kv_fp8_) {
    qa.q_norm = dev(a.q_norm);
    qa.k_norm = dev(a.k_norm);
    qa.k_cache = k_cache_[l].data();
    qa.v_cache = v_cache_[l].data();
  }
  const bool fused_prologue = c.qk_norm && !kv_fp8_ && cuda::qk_norm_rope_supported(qa, D, *freqs_);
  // e4m3 pages: the CUDA-core kernels read them, dequantised with the layer's per-KV-head scales (attention.h).
  const float* ks = kv_fp8_ ? kv_scales_.data() + size_t(l) * 2 * size_t(Hkv) : nullptr;
  if (fused_prologue) {
    cuda::qk_norm_rope_kv_write(qa, T, D, *freqs_, num_rows, stream_);
  } else {
    if (c.qk_norm) {
      cuda::rms_norm(q, dev(a.q_norm), q, T, D, float(c.rms_norm_eps), nk, num_rows, stream_, q_rows);
      cuda::rms_norm(k, dev(a.k_norm), k, T, D, float(c.rms_norm_eps), nk, num_rows, stream_, k_rows);
    }
    cuda::apply_rope(q, q_rows, k, k_rows, positions_.data(), T, D, *freqs_, num_rows, stream_);
    if (kv_fp8_)
      cuda::kv_cache_write_fp8(k, kv_stride, v, kv_stride, k_cache8_[l].data(), v_cache8_[l].data(),
                               slot_mapping_.data(), T, int(Hkv), int(D), ks, ks + Hkv, kv_saturated_.data(),
                               num_rows, stream_);
    else
      cuda::kv_cache_write(k, kv_stride, v, kv_stride, k_cache_[l].data(), v_cache_[l].data(), slot_mapping_.data(),
                           T, Hkv * D, num_rows, stream_);
  }
  if (c.attn_output_gate) sh.gate = q + D;
  const int64_t max_kv = int64_t(d.table_stride) * opt_.block_size;
  // Sequences [s0, s0 + n) of the step, their q / gate / output rows from row r0 on.
  auto decode = [&](int32_t s0, int32_t n, int64_t r0) {
    cuda::AttentionShape dsh = sh;
    if (sh.gate) dsh.gate = sh.gate + r0 * (sh.gate_token_stride ? sh.gate_token_stride : Hq * D);
    const bf16* qs = q + r0 * (sh.q_token_stride ? sh.q_token_stride : Hq * D);
    const int32_t* tables = block_tables_.data() + size_t(s0) * size_t(d.table_stride);
    bf16* out = o_.data() + r0 * Hq * D;
    if (kv_fp8_)
      cuda::attention_decode_fp8(qs, k_cache8_[l].data(), v_cache8_[l].data(), ks, ks + Hkv, tables, d.table_stride,
                                 context_lens_.data() + s0, n, max_kv, out, dsh, decode_ws_.data(), decode_ws_bytes_,
                                 stream_);
    else
      cuda::attention_decode(qs, k_cache_[l].data(), v_cache_[l].data(), tables, d.table_stride,
                             context_lens_.data() + s0, n, max_kv, out, dsh, decode_ws_.data(), decode_ws_bytes_,
                             stream_);
  };
  auto prefill = [&](int32_t n) {  // sequences [0, n), rows from 0
    if (kv_fp8_)
      cuda::attention_prefill_fp8(q, k_cache8_[l].data(), v_cache8_[l].data(), ks, ks + Hkv, block_tables_.data(),
                                  d.table_stride, cu_seqlens_.data(), context_lens_.data(), n, d.max_q_len, o_.data(),
                                  sh, stream_);
    else
      cuda::attention_prefill(q, k_cache_[l].data(), v_cache_[l].data(), block_tables_.data(), d.table_stride,
                              cu_seqlens_.data(), context_lens_.data(), n, d.max_q_len, o_.data(), sh, stream_);
  };
  if (d.decode) {
    decode(0, d.seqs, 0);
  } else if (d.prefill_seqs > 0) {  // mixed: prefill sequences [0, Sp), then one decode row per sequence
    prefill(d.prefill_seqs);
    decode(d.prefill_seqs, d.seqs - d.prefill_seqs, d.prefill_rows);
  } else {
    prefill(d.seqs);
  }
  gemm(a.o_proj, o_.data(), y_.data(), T);
}

static_assert(sizeof(cuda::GdnSnapshot) == 3 * sizeof(int32_t), "the snapshot table is uploaded as int32 triples");

void CudaExecutor::snapshot_conv(size_t l, const bf16* mixed, int64_t stride) {
  const int64_t C = cfg_.conv_dim(), K1 = cfg_.linear_conv_kernel_dim - 1;
  const size_t ce = conv_elems(l);
  for (size_t i = 0; i < step_snapshots_.size(); ++i) {
    // Slot layout [C, K-1]: column j holds row (r - K + 1 + j), a strided copy of C elements.
    bf16* dst = conv_state_[l].data() + size_t(step_snapshots_[i].dst_slot) * ce;
    for (int64_t j = 0; j < K1; ++j) {
      const bf16* src = mixed + (int64_t(step_snapshot_rows_[i]) - K1 + j) * stride;
      MOEFOLD_CUDA_CHECK(cudaMemcpy2DAsync(dst + j, size_t(K1) * sizeof(bf16), src, sizeof(bf16), sizeof(bf16),
                                           size_t(C), cudaMemcpyDeviceToDevice, stream_));
    }
  }
}

// Gated DeltaNet, as Model::deltanet: conv1d_silu(in_proj_qkv(x)) with the carried conv state;
// gating, q/k L2 norm and the delta rule (chunked for prefill, recurrent for decode) over the
// sequence's state slot; GatedRMSNorm(o, z); out_proj.
void CudaExecutor::deltanet(size_t l, const StepDims& d) {
  const DeltaNetWeights& g = w_.layers[l].gdn;
  const ModelConfig& c = cfg_;
  const int64_t T = d.rows;
  const int64_t C = c.conv_dim(), K = c.linear_conv_kernel_dim, Hv = c.linear_num_value_heads, kd = c.key_dim();
  const int32_t* num_seqs = counts_.data() + 1;
  // [qkv | z | b | a] per token: one fused GEMM into proj_, read in place with strides, or four.
  const bf16 *mixed = mixed_.data(), *z = z_.data(), *gb = gb_.data(), *ga = ga_.data();
  int64_t W = 0;
  const Fused& f = fused_[l];
  if (f.any()) {
    W = f.rows;
    fused_gemm(f, x_.data(), proj_.data(), T);
    mixed = proj_.data();
    z = mixed + C;
    gb = z + g.in_proj_z.out;
    ga = gb + Hv;
  } else {
    gemm(g.in_proj_qkv, x_.data(), mixed_.data(), T);
    gemm(g.in_proj_z, x_.data(), z_.data(), T);
    gemm(g.in_proj_b, x_.data(), gb_.data(), T);
    gemm(g.in_proj_a, x_.data(), ga_.data(), T);
  }
  // Prefill sequences [0, Sp) over rows [0, Tp), decode sequences [Sp, seqs) one row each from row r0.
  // A mixed step has both: its live counts are counts_[4] and counts_[5], and the decode kernels read
  // their rows, sequences and slots through offset pointers.
  const bool mixed_step = d.prefill_seqs > 0;
  const int32_t Sp = d.decode ? 0 : (mixed_step ? d.prefill_seqs : d.seqs), Sd = d.seqs - Sp;
  const int64_t Tp = mixed_step ? d.prefill_rows : T, r0 = mixed_step ? Tp : 0, xs = W ? W : C, abs = W ? W : Hv;
  const int32_t* prefill_live = mixed_step ? counts_.data() + 4 : num_seqs;
  const int32_t* decode_live = mixed_step ? counts_.data() + 5 : num_seqs;
  const cuda::GdnDims dims{int(c.linear_num_key_heads), int(Hv), int(c.linear_key_head_dim),
                           int(c.linear_value_head_dim)};
  if (d.decode && cuda::gdn_decode_fused_enabled()) {  // conv, delta rule and gated norm in one launch (the same bits)
    const cuda::GdnArgs args{conv_.data(), conv_.data() + kd, conv_.data() + 2 * kd, C, ga, gb, abs,
                             a_log_[l], dt_bias_[l], rec_state_[l].data(), state_slots_.data(), num_seqs,
                             go_.data(), T};
    const cuda::GdnDecodeConv conv{mixed, xs, dev(g.conv1d), conv_state_[l].data(), int(K)};
    const cuda::GdnDecodeGatedNorm norm{z, W ? W : Hv * c.linear_value_head_dim, dev(g.norm), float(c.rms_norm_eps)};
    if (cuda::gdn_decode_fused_supported(args, conv, norm, d.seqs, dims)) {
      cuda::gdn_decode_fused(args, conv, norm, d.seqs, dims, stream_);
      gemm(g.out_proj, go_.data(), y_.data(), T);
      return;
    }
  }
  if (Sp > 0)
    cuda::causal_conv1d_silu_prefill(mixed, dev(g.conv1d), cu_seqlens_.data(), state_slots_.data(), prefill_live,
                                     int(Tp), conv_state_[l].data(), conv_.data(), int(C), int(K), stream_, W);
  if (Sd > 0)
    cuda::causal_conv1d_silu_decode(mixed + r0 * xs, dev(g.conv1d), state_slots_.data() + Sp, decode_live, Sd,
                                    conv_state_[l].data(), conv_.data() + r0 * C, int(C), int(K), stream_, W);
  if (Sp > 0 && !step_snapshots_.empty()) snapshot_conv(l, mixed, xs);
  if (Sp > 0) {
    const cuda::GdnArgs args{conv_.data(), conv_.data() + kd, conv_.data() + 2 * kd, C, ga, gb, abs,
                             a_log_[l], dt_bias_[l], rec_state_[l].data(), state_slots_.data(), prefill_live,
                             go_.data(), Tp};
    if (step_snapshots_.empty())
      cuda::gdn_chunked_prefill(args, cu_seqlens_.data(), Sp, nullptr, nullptr, 0, dims, stream_);
    else
      cuda::gdn_chunked_prefill(args, cu_seqlens_.data(), Sp, reinterpret_cast<const cuda::GdnSnapshot*>(snapshots_.data()),
                                snapshots_.data() + 3 * kMaxStepSnapshots, kMaxStepSnapshots, dims, stream_);
  }
  if (Sd > 0) {
    const bf16* cv = conv_.data() + r0 * C;
    const cuda::GdnArgs args{cv, cv + kd, cv + 2 * kd, C, ga + r0 * abs, gb + r0 * abs, abs, a_log_[l], dt_bias_[l],
                             rec_state_[l].data(), state_slots_.data() + Sp, decode_live,
                             go_.data() + r0 * Hv * c.linear_value_head_dim, T};
    cuda::gdn_recurrent_decode(args, Sd, dims, stream_);
  }
  cuda::gated_rms_norm(go_.data(), z, dev(g.norm), go_.data(), T, Hv, c.linear_value_head_dim,
                       float(c.rms_norm_eps), counts_.data(), stream_, W);
  gemm(g.out_proj, go_.data(), y_.data(), T);
}

// FFN with its residual add: h += MoE(x) (routed experts + gated shared expert, residual fused into
// the combine) or h += MLP(x).
bool CudaExecutor::ffn(size_t l, int64_t T, size_t moe_index) {
  const LayerWeights& L = w_.layers[l];
  const ModelConfig& c = cfg_;
  const int32_t* num_rows = counts_.data();
  // x = RMSNorm_in(h) of the next layer, written by this FFN's last kernel (one launch fewer a layer).
  cuda::MoeNextNorm next_norm;
  const cuda::MoeNextNorm* next = nullptr;
  if (l + 1 < w_.layers.size() && !tp_) {
    next_norm = {dev(w_.layers[l + 1].input_norm), x_.data(), float(c.rms_norm_eps), c.norm_zero_centred};
    next = &next_norm;
  }
  if (c.layer_is_moe[l]) {
    const MoeWeights& m = L.moe;
    const size_t pairs = size_t(T * c.num_experts_per_tok);
    // The step's shape: grids and expert-GEMM tiles for this step's T rows (the workspace is bound for
    // max_rows; a decode step runs the decode tiles).
    cuda::MoeShape step_shape = moe_shape_;
    step_shape.capacity = int(T);
    step_shape.batch_invariant = opt_.batch_invariant;
    const int32_t* replay = routing_.replay ? replay_ids_.data() + moe_index * pairs : nullptr;
    const bf16* shared_out = nullptr;
    // The shared expert inside the streaming expert kernels (moe_forward_shared: the same bits as the
    // dense chain below) where this step runs them, else decode GEMM + swiglu + decode GEMM.
    const bool fused_shared = shared_expert_fusable(m, step_shape);
    const bool fused_shared_fp8 = !fused_shared && fp8_shared_expert_fusable(m, step_shape);
    if (c.shared_expert_intermediate_size > 0) {
      shared_out = y_.data();
      if (!fused_shared && !fused_shared_fp8) {
        const int64_t Is = c.shared_expert_intermediate_size;
        gemm(m.shared_gate_up, x_.data(), gu_.data(), T);
        cuda::swiglu(gu_.data(), ffn_act_.data(), T, Is, num_rows, stream_);
        gemm(m.shared_down, ffn_act_.data(), y_.data(), T);
      }
    }
    const bf16* shared_gate = shared_out ? dev(m.shared_expert_gate.w) : nullptr;
    if (fused_shared) {
      const cuda::MoeSharedExpert shared{dev(m.shared_gate_up.w), dev(m.shared_down.w),
                                         int(c.shared_expert_intermediate_size), ffn_act_.data(), y_.data()};
      cuda::moe_forward_shared(x_.data(), dev(m.router.w), dev(m.gate_up), dev(m.down), shared, shared_gate, h_.data(),
                               num_rows, step_shape, c.norm_topk_prob, moe_ws_, h_.data(), stream_, replay, next);
    } else if (fused_shared_fp8) {  // FP8 experts and shared expert, one token: the stream kernels
      const cuda::MoeFp8SharedExpert shared{static_cast<const uint8_t*>(m.shared_gate_up.w.device),
                                            static_cast<const float*>(m.shared_gate_up.w.device_scale),
                                            static_cast<const uint8_t*>(m.shared_down.w.device),
                                            static_cast<const float*>(m.shared_down.w.device_scale),
                                            int(c.shared_expert_intermediate_size), ffn_act_.data(), y_.data()};
      cuda::moe_fp8_forward_shared(x_.data(), dev(m.router.w), static_cast<const uint8_t*>(m.gate_up.device),
                                   static_cast<const float*>(m.gate_up.device_scale),
                                   static_cast<const uint8_t*>(m.down.device),
                                   static_cast<const float*>(m.down.device_scale), shared, shared_gate, h_.data(),
                                   num_rows, step_shape, c.norm_topk_prob, moe_ws_, h_.data(), stream_, replay, next);
    } else if (tp_) {  // this rank's experts and shared-expert part, summed over the ranks into h
      tp_->moe(x_.data(), dev(m.router.w), dev(m.gate_up), dev(m.down), shared_out, shared_gate, h_.data(), T, num_rows,
               c.norm_topk_prob, opt_.batch_invariant, replay);
    } else if (m.gate_up.device_scale && T <= cuda::kMoeFp8MaxRows) {  // FP8 experts, decode sizes
      cuda::moe_fp8_forward(x_.data(), dev(m.router.w), static_cast<const uint8_t*>(m.gate_up.device),
                            static_cast<const float*>(m.gate_up.device_scale), static_cast<const uint8_t*>(m.down.device),
                            static_cast<const float*>(m.down.device_scale), shared_out, shared_gate, h_.data(),
                            num_rows, step_shape, c.norm_topk_prob, moe_ws_, h_.data(), stream_, replay, next);
    } else if (m.gate_up.device_scale && fp8_prefill_experts_) {  // FP8 experts, prefill: W8A8 on wgmma
      cuda::moe_fp8_prefill_forward(x_.data(), dev(m.router.w), static_cast<const uint8_t*>(m.gate_up.device),
                                    static_cast<const float*>(m.gate_up.device_scale),
                                    static_cast<const uint8_t*>(m.down.device),
                                    static_cast<const float*>(m.down.device_scale), shared_out, shared_gate, h_.data(),
                                    num_rows, step_shape, c.norm_topk_prob, moe_ws_, moe_fp8_, h_.data(), stream_,
                                    replay, next);
    } else {
      const bf16 *gate_up = dev(m.gate_up), *down = dev(m.down);
      if (m.gate_up.device_scale) {  // FP8 experts, prefill: bf16 copies of this layer's experts
        const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
        bf16* buf = fp8_scratch(size_t(E * 3 * I * H));
        cuda::fp8_dequantize_bf16(static_cast<const uint8_t*>(m.gate_up.device),
                                  static_cast<const float*>(m.gate_up.device_scale), E * 2 * I, H, buf, stream_);
        cuda::fp8_dequantize_bf16(static_cast<const uint8_t*>(m.down.device),
                                  static_cast<const float*>(m.down.device_scale), E * H, I, buf + E * 2 * I * H, stream_);
        gate_up = buf;
        down = buf + E * 2 * I * H;
      }
      cuda::moe_forward(x_.data(), dev(m.router.w), gate_up, down, shared_out, shared_gate, h_.data(), num_rows,
                        step_shape, c.norm_topk_prob, moe_ws_, h_.data(), stream_, replay, next);
    }
    if (routing_.capture)
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(routing_.capture->layers[moe_index].data(), tp_ ? tp_->route_ids() : moe_ws_.ids,
                                         pairs * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  } else {
    const MlpWeights& m = L.mlp;
    gemm(m.gate_up, x_.data(), gu_.data(), T);
    cuda::swiglu(gu_.data(), ffn_act_.data(), T, m.down.in, num_rows, stream_);
    gemm(m.down, ffn_act_.data(), y_.data(), T);
    if (tp_) tp_->reduce_into_residual(y_.data(), h_.data(), T, num_rows);
    else if (next)
      cuda::add_rms_norm(h_.data(), y_.data(), next->w, x_.data(), T, c.hidden_size, next->eps,
                         c.norm_zero_centred ? cpu::NormKind::ZeroCentred : cpu::NormKind::Plain, num_rows, stream_);
    else cuda::residual_add(h_.data(), y_.data(), T, c.hidden_size, num_rows, stream_);
  }
  return next != nullptr;
}

}  // namespace

std::unique_ptr<Executor> make_cuda_executor(const std::string& dir, LoadFormat format, uint64_t seed,
                                             const CudaExecutorOptions& opt) {
  MOEFOLD_CHECK(cuda_available(), "--device cuda: no usable CUDA device");
  ModelConfig cfg = ModelConfig::from_dir(dir);
  MOEFOLD_CHECK(!cfg.mla.enabled(), "--device cuda: {} (MLA with the lightning indexer) has no CUDA kernels yet; use --device cpu",
                family_name(cfg.family));
  check_kv_cache_dtype(cfg, opt.kv_cache_dtype, "cuda");
  MOEFOLD_CHECK(cfg.num_layers_of(LayerType::FullAttention) == 0 || cuda::attention_supports_head_dim(int(cfg.head_dim)),
                "--device cuda: attention head_dim {} is not supported on the GPU (prefill: multiples of 16 up to 256; "
                "decode: 32, 64, 96, 128, 192, 256)", cfg.head_dim);
  auto exec = std::make_unique<CudaExecutor>(cfg, opt);
  std::unique_ptr<WeightSource> src = make_weight_source(dir, cfg, format, seed, opt.quantization, opt.dummy_on_device,
                                                         opt.fp8_lm_head);
  ModelWeights w = load_weights(cfg, *src, [&](Param& p) { exec->place(p); });
  exec->finish_load(std::move(w));
  return exec;
}

std::unique_ptr<Executor> make_cuda_rank_executor(const ModelConfig& local, ModelWeights weights,
                                                  const CudaShard& shard, const CudaExecutorOptions& opt) {
  MOEFOLD_CHECK(cuda_available(), "--device cuda: no usable CUDA device");
  MOEFOLD_CHECK(!local.mla.enabled(), "--device cuda: {} (MLA) has no CUDA kernels yet; use --device cpu",
                family_name(local.family));
  MOEFOLD_CHECK(local.num_layers_of(LayerType::FullAttention) == 0 ||
                    cuda::attention_supports_head_dim(int(local.head_dim)),
                "--device cuda: attention head_dim {} is not supported on the GPU", local.head_dim);
  bool fp8 = false;
  for_each_param(weights, [&](Param& p) { fp8 = fp8 || p.fp8 || p.fp8_cols > 0; });
  MOEFOLD_CHECK(!fp8 && opt.quantization == Quantization::None && !opt.fp8_lm_head,
                "--tensor-parallel-size {} --device cuda: FP8 weights (a checkpoint's, --quantization fp8 or "
                "--fp8-lm-head) are not supported by the sharded CUDA executor yet",
                shard.shard.world);
  auto exec = std::make_unique<CudaExecutor>(local, opt);
  exec->set_shard(shard);
  for_each_param(weights, [&](Param& p) {
    if (!p.empty()) exec->place(p);
  });
  exec->finish_load(std::move(weights));
  return exec;
}

}  // namespace moefold
