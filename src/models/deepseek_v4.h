// DeepSeek-V4 / V4-Flash on the CPU (fp32), equal to transformers 5.17's DeepseekV4ForCausalLM.
// The math, step by step, is in docs/deepseek_v4.md. Per token the residual is hc_mult streams
// X [hc, H] (embedding copied into each); per layer
//   (pre, post, comb, c) = mHC_attn(X);  X = post * Attn(RMSNorm(c)) + comb^T X
//   (pre, post, comb, c) = mHC_ffn(X);   X = post * MoE(RMSNorm(c)) + comb^T X
// logits = head(RMSNorm(HyperHead(X))). Attention per layer by compress ratio: 0 sliding window,
// 4 window + indexer-selected 4:1 overlapping compressed entries (CSA), 128 window + all visible
// 128:1 compressed entries (HCA). Each sequence carries a Dsv4Cache (the window, the compressors'
// unfinished windows, the CSA overlap halves and the compressed entries), so a prompt fed in chunks
// of any size or token by token gives the same logits as the whole forward.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/deepseek_v4_config.h"
#include "models/weights.h"

namespace moefold {

/// One compressor (main or indexer): projections to `width` = (overlap ? 2 : 1) * dim, position bias
/// ape [ratio, width], RMSNorm weight [dim].
struct Dsv4CompressorWeights {
  Linear wkv, wgate;
  Param ape, norm;
};

struct Dsv4LayerWeights {
  Param attn_norm, ffn_norm;                                  ///< [H]
  Param hc_attn_fn, hc_attn_base, hc_attn_scale;              ///< [(2+hc)hc, hc H], [(2+hc)hc], [3]
  Param hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  Linear wq_a, wq_b, wkv, wo_a, wo_b;  ///< wo_a [g o_lora, heads D / g] (grouped), wo_b [H, g o_lora]
  Param q_norm, kv_norm, attn_sink;    ///< [q_lora], [D], [heads]
  Dsv4CompressorWeights comp;          ///< ratio > 0
  Dsv4CompressorWeights index_comp;    ///< ratio 4: the indexer's own compressor at index_head_dim
  Linear index_wq_b, index_weights_proj;  ///< [ih * ihd, q_lora], [ih, H]
  Linear gate;                            ///< router [E, H]
  Param gate_bias;                        ///< [E] correction bias (non-hash layers)
  std::vector<int32_t> tid2eid;           ///< [vocab, k] (hash layers)
  Param gate_up, down;                    ///< experts [E, 2I, H] (w1 | w3), [E, H, I] (w2)
  Linear shared_gate_up, shared_down;     ///< [2I, H], [H, I]
};

struct Dsv4Weights {
  Param embed, head, norm;                           ///< [V, H], [V, H], [H]
  Param hc_head_fn, hc_head_base, hc_head_scale;     ///< [hc, hc H], [hc], [1]
  std::vector<Dsv4LayerWeights> layers;
};

/// Per-layer per-sequence state.
struct Dsv4CompressorState {
  std::vector<float> buf_kv, buf_gate;    ///< raw projections of the unfinished window [r < ratio, width]
  std::vector<float> prev_kv, prev_gate;  ///< CSA: the last finished window's first halves [ratio, dim]
  std::vector<float> entries;             ///< finished entries [n, dim] (normalised, rotated)
  int64_t n_entries = 0;
};
struct Dsv4LayerCache {
  std::vector<float> window;  ///< K=V of the last <= sliding_window tokens [n, D], oldest first
  Dsv4CompressorState comp, index_comp;
};
struct Dsv4Cache {
  int64_t len = 0;  ///< tokens seen
  std::vector<Dsv4LayerCache> layers;
};

class DeepseekV4Model {
 public:
  DeepseekV4Model(DeepseekV4Config cfg, Dsv4Weights w);
  const DeepseekV4Config& config() const { return cfg_; }
  Dsv4Cache new_cache() const;

  /// Feeds `tokens` (positions cache.len ..) through the model, advancing `cache`, and returns fp32
  /// logits [tokens.size(), vocab]. Throws Error for a token id outside the vocabulary.
  std::vector<float> forward(Dsv4Cache& cache, std::span<const int32_t> tokens) const;
  /// Several sequences in one step: chunk i continues caches[i]; returns each chunk's logits.
  std::vector<std::vector<float>> forward_batch(std::span<Dsv4Cache*> caches,
                                                std::span<const std::vector<int32_t>> chunks) const;

 private:
  void attention(size_t l, Dsv4LayerCache& c, int64_t start, const float* x, int64_t T, float* out) const;
  void compress(const Dsv4CompressorWeights& w, Dsv4CompressorState& st, int64_t ratio, int64_t dim, bool overlap,
                const float* x, int64_t T) const;
  void moe(size_t l, const float* x, const int32_t* tokens, int64_t T, float* out) const;

  DeepseekV4Config cfg_;
  Dsv4Weights w_;
  std::vector<double> inv_main_, inv_compress_;
};

/// Loads the model in `dir` (config.json and DeepSeek-native safetensors: bf16/f32/f16, FP8 e4m3 with
/// 128x128 block `.scale` (E8M0 or fp32), FP4 experts packed two per byte (I8/U8, low nibble first)
/// with per-32 E8M0 `.scale`) or, with `dummy`, seeded random weights in that layout. Throws Error
/// naming the tensor on a missing, mis-shaped or unexpected tensor, and before allocating when the
/// fp32 weights would not fit in memory.
std::unique_ptr<DeepseekV4Model> load_deepseek_v4(const std::string& dir, bool dummy, uint64_t seed = 0);

/// Parameter counts of a deepseek_v4 config (no allocation): total, active per token (routed experts
/// counted k / E, embedding excluded), routed experts, embedding.
struct Dsv4ParamCounts {
  int64_t total = 0, active_per_token = 0, routed_expert = 0, embedding = 0;
};
Dsv4ParamCounts count_deepseek_v4_params(const DeepseekV4Config& cfg);

}  // namespace moefold
