// The FP8 KV cache scales an FP8 checkpoint may carry per attention layer, under the names vLLM reads
// (its maybe_remap_kv_scale_name): `self_attn.k_scale` / `self_attn.v_scale` (llm-compressor /
// compressed-tensors), `self_attn.k_proj.k_scale` / `self_attn.v_proj.v_scale` (ModelOpt), and the
// deprecated `self_attn.kv_scale` (one scale for both). Each is a dequantisation scale (value = e4m3 *
// scale), a scalar (shape [] or [1], the usual per-tensor form) or one per KV head ([num_kv_heads]).
#pragma once
#include <cstdint>
#include <string>

#include "models/weight_loader.h"
#include "models/weights.h"

namespace moefold {

/// Fills a.k_scale and a.v_scale [num_kv_heads] from the checkpoint tensors above `prefix` (e.g.
/// "model.layers.3.self_attn."), leaving both empty when the checkpoint has none (and always for
/// dummy weights). Throws Error for a scale of another shape, a non-finite or non-positive value,
/// or only one of k / v present.
void load_kv_scales(WeightSource& src, const std::string& prefix, int64_t num_kv_heads, AttentionWeights& a);

}  // namespace moefold
