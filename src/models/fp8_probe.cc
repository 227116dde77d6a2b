#include "models/fp8_probe.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_block.h"
#include "ops/cpu/fp8_ideal.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/moe.h"
#include "runtime/model_runner.h"

namespace moefold {

namespace {

/// The CPU chain of moe_stages_cpu, with the activations quantised 1 x 128 before each GEMM (fp8_act).
MoeStageOutputs cpu_stages(const float* x, int64_t T, const std::vector<int32_t>& ids,
                           const std::vector<float>& weights, const MoeWeights& m, const ModelConfig& c, bool fp8_act) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, k = c.num_experts_per_tok;
  MoeStageOutputs o;
  o.act.assign(size_t(T * k * I), 0.0f);
  o.y.assign(size_t(T * k * H), 0.0f);
  o.out.assign(size_t(T * H), 0.0f);
  o.weights = weights;
  std::vector<float> gu(size_t(2 * I)), xa(static_cast<size_t>(H)), aa(static_cast<size_t>(I));
  for (int64_t p = 0; p < T * k; ++p) {
    const int64_t t = p / k, e = ids[size_t(p)];
    std::copy(x + t * H, x + (t + 1) * H, xa.begin());
    if (fp8_act) fp8_fake_quantize_activations(xa.data(), 1, H);
    cpu::linear(xa.data(), m.gate_up.data() + e * 2 * I * H, nullptr, gu.data(), 1, H, 2 * I);
    for (int64_t i = 0; i < I; ++i) {
      const float g = gu[size_t(i)];
      o.act[size_t(p * I + i)] = g / (1.0f + std::exp(-g)) * gu[size_t(I + i)];
    }
    std::copy(o.act.begin() + p * I, o.act.begin() + (p + 1) * I, aa.begin());
    if (fp8_act) fp8_fake_quantize_activations(aa.data(), 1, I);
    cpu::linear(aa.data(), m.down.data() + e * H * I, nullptr, o.y.data() + p * H, 1, I, H);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < k; ++s)
      for (int64_t h = 0; h < H; ++h)
        o.out[size_t(t * H + h)] += weights[size_t(t * k + s)] * o.y[size_t((t * k + s) * H + h)];
  return o;
}

}  // namespace

MoeStageOutputs moe_stages_cpu(const float* x, int64_t T, const std::vector<int32_t>& ids,
                               const std::vector<float>& weights, const MoeWeights& m, const ModelConfig& c) {
  return cpu_stages(x, T, ids, weights, m, c, false);
}

MoeStageOutputs moe_stages_cpu_w8a8(const float* x, int64_t T, const std::vector<int32_t>& ids,
                                    const std::vector<float>& weights, const MoeWeights& m, const ModelConfig& c) {
  return cpu_stages(x, T, ids, weights, m, c, true);
}

ProbeReport probe_moe_layer(const Model& model, const std::vector<int32_t>& prompt, int layer,
                            const MoeStageRunner& tested, const std::string& tested_name) {
  const ModelConfig& c = model.config();
  if (layer < 0)
    for (int64_t l = 0; l < c.num_layers && layer < 0; ++l)
      if (c.layer_is_moe[size_t(l)]) layer = int(l);
  MOEFOLD_CHECK(layer >= 0 && layer < c.num_layers && c.layer_is_moe[size_t(layer)],
                "probe: layer {} is not an MoE layer of this model", layer);
  const MoeWeights& m = model.weights().layers[size_t(layer)].moe;
  MOEFOLD_CHECK(m.gate_up.fp8 && m.down.fp8,
                "probe: the experts of layer {} are not FP8 (use an FP8 checkpoint or --quantization fp8)", layer);
  MOEFOLD_CHECK(!prompt.empty(), "probe: empty prompt");
  const int64_t T = int64_t(prompt.size()), H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok,
                I = c.moe_intermediate_size;
  // Capture the layer's FFN input and the residual stream around it on one prefill.
  std::vector<float> x, h_mid, y_ffn;
  Model& mm = const_cast<Model&>(model);
  mm.set_ffn_tap([&](size_t l, const float* h, const float* xi, const float* y, int64_t rows) {
    if (int(l) != layer) return;
    x.assign(xi, xi + rows * H);
    h_mid.assign(h, h + rows * H);
    y_ffn.assign(y, y + rows * H);
  });
  {
    ModelRunner r(model, {int32_t((T + 15) / 16 + 1), 16, 1});
    const int32_t s = r.add_sequence(prompt);
    r.step({{s, int32_t(T), false}});
  }
  mm.set_ffn_tap({});
  MOEFOLD_CHECK(x.size() == size_t(T * H), "probe: layer {} was not reached", layer);
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));  // what a bf16 engine feeds the experts
  // The CPU router's choice (fp32 logits of the bf16 x).
  std::vector<float> logits(size_t(T * E)), weights(size_t(T * k));
  std::vector<int32_t> ids(size_t(T * k));
  cpu::linear(x.data(), m.router.w.data(), nullptr, logits.data(), T, H, E);
  cpu::router_topk(logits.data(), T, E, k, c.norm_topk_prob, ids.data(), weights.data());
  const MoeStageOutputs got = tested(x.data(), T, ids, weights, m, c);
  const auto ideal = cpu::moe_fp8_ideal(x.data(), T, ids.data(), got.weights.data(), k, *m.gate_up.fp8, *m.down.fp8, E,
                                        H, I, false);
  const auto ideal8 = cpu::moe_fp8_ideal(x.data(), T, ids.data(), got.weights.data(), k, *m.gate_up.fp8, *m.down.fp8,
                                         E, H, I, true);
  ProbeReport rep;
  rep.layer = layer;
  rep.tokens = T;
  rep.tested = tested_name;
  rep.gemms = cpu::rel_err(got.act.data(), ideal.act.data(), ideal.act.size());
  rep.per_slot = cpu::rel_err(got.y.data(), ideal.y.data(), ideal.y.size());
  rep.combine = cpu::rel_err(got.out.data(), ideal.out.data(), ideal.out.size());
  rep.a8_gemms = cpu::rel_err(ideal8.act.data(), ideal.act.data(), ideal.act.size());
  rep.a8_per_slot = cpu::rel_err(ideal8.y.data(), ideal.y.data(), ideal.y.size());
  rep.a8_combine = cpu::rel_err(ideal8.out.data(), ideal.out.data(), ideal.out.size());
  rep.vs_a8_gemms = cpu::rel_err(got.act.data(), ideal8.act.data(), ideal8.act.size());
  rep.vs_a8_per_slot = cpu::rel_err(got.y.data(), ideal8.y.data(), ideal8.y.size());
  rep.vs_a8_combine = cpu::rel_err(got.out.data(), ideal8.out.data(), ideal8.out.size());
  // Layer output: residual + FFN, the routed part swapped for the tested / ideal one (the shared expert
  // is the CPU's in both, y_ffn - routed_cpu).
  const MoeStageOutputs cpu_routed = moe_stages_cpu(x.data(), T, ids, got.weights, m, c);
  std::vector<double> ideal_layer(size_t(T * H)), got_layer(size_t(T * H));
  for (size_t i = 0; i < ideal_layer.size(); ++i) {
    const double base = double(h_mid[i]) + double(y_ffn[i]) - double(cpu_routed.out[i]);
    ideal_layer[i] = base + ideal.out[i];
    got_layer[i] = base + double(got.out[i]);
  }
  rep.layer_out = cpu::rel_err(got_layer.data(), ideal_layer.data(), ideal_layer.size());
  return rep;
}

}  // namespace moefold
