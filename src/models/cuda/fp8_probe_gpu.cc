#include "models/cuda/fp8_probe_gpu.h"

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_buffer.h"
#include "ops/cuda/moe_fp8.h"

namespace moefold {

namespace {

/// Runs the FP8 routed chain on the GPU (w8a8: moe_fp8_prefill_forward, else moe_fp8_forward) with the
/// given experts replayed and downloads its stages.
MoeStageOutputs gpu_stages(const float* x, int64_t T, const std::vector<int32_t>& ids, const MoeWeights& m,
                           const ModelConfig& c, bool w8a8) {
  MOEFOLD_CHECK(m.gate_up.fp8 && m.down.fp8, "probe --device cuda: the experts are not FP8");
  const int E = int(c.num_experts), k = int(c.num_experts_per_tok), H = int(c.hidden_size),
            I = int(c.moe_intermediate_size);
  MOEFOLD_CHECK(T >= 1 && (w8a8 || T <= cuda::kMoeFp8MaxRows),
                "probe --device cuda: {} tokens (1 .. {}; --fp8-activations: any)", T, cuda::kMoeFp8MaxRows);
  using bf16 = __nv_bfloat16;
  auto bf = [](const float* p, size_t n) {
    std::vector<float> v(p, p + n);
    return cuda::to_device_bf16(v);
  };
  auto dx = bf(x, size_t(T * H));
  auto drouter = bf(m.router.w.data(), size_t(E) * H);
  auto gq = cuda::to_device(m.gate_up.fp8->q), dq = cuda::to_device(m.down.fp8->q);
  auto gs = cuda::to_device(m.gate_up.fp8->scale), ds = cuda::to_device(m.down.fp8->scale);
  cuda::MoeShape s{int(T), E, k, H, I};
  MOEFOLD_CHECK(!w8a8 || cuda::moe_fp8_prefill_supported(s),
                "probe --device cuda --fp8-activations: H {} and I {} must be multiples of 128", H, I);
  if (!w8a8) s.expert_tiles = cuda::kMoeExpertGemv;
  cuda::DeviceBuffer<uint8_t> wsb(cuda::moe_workspace_bytes(s));
  cuda::MoeWorkspace ws = cuda::moe_workspace_bind(wsb.data(), wsb.size(), s);
  cuda::DeviceBuffer<bf16> out(size_t(T * H));
  cuda::DeviceBuffer<int32_t> rep = cuda::to_device(ids);
  cuda::DeviceBuffer<int32_t> live = cuda::to_device(std::vector<int32_t>{int32_t(T)});  // the chain reads it
  if (w8a8) {
    cuda::DeviceBuffer<uint8_t> fb(cuda::moe_fp8_prefill_scratch_bytes(s));
    const cuda::MoeFp8PrefillScratch sc = cuda::moe_fp8_prefill_scratch_bind(fb.data(), fb.size(), s);
    cuda::moe_fp8_prefill_forward(dx.data(), drouter.data(), gq.data(), gs.data(), dq.data(), ds.data(), nullptr,
                                  nullptr, nullptr, live.data(), s, c.norm_topk_prob, ws, sc, out.data(), nullptr,
                                  rep.data());
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());  // before fb goes
  } else {
    cuda::moe_fp8_forward(dx.data(), drouter.data(), gq.data(), gs.data(), dq.data(), ds.data(), nullptr, nullptr,
                          nullptr, live.data(), s, c.norm_topk_prob, ws, out.data(), nullptr, rep.data());
  }
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const size_t P = size_t(T) * k;
  std::vector<int32_t> pairs(P);
  std::vector<uint16_t> act(P * I), y(P * H), o(size_t(T * H));
  MoeStageOutputs r;
  r.weights.resize(P);
  MOEFOLD_CUDA_CHECK(cudaMemcpy(pairs.data(), ws.pairs, P * 4, cudaMemcpyDeviceToHost));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(r.weights.data(), ws.weights, P * 4, cudaMemcpyDeviceToHost));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(act.data(), ws.act, act.size() * 2, cudaMemcpyDeviceToHost));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(y.data(), ws.y, y.size() * 2, cudaMemcpyDeviceToHost));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(o.data(), out.data(), o.size() * 2, cudaMemcpyDeviceToHost));
  r.act.resize(P * I);
  for (size_t j = 0; j < P; ++j)
    for (int i = 0; i < I; ++i) r.act[size_t(pairs[j]) * I + i] = bf16_to_f32(act[j * I + i]);
  r.y.resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) r.y[i] = bf16_to_f32(y[i]);
  r.out.resize(o.size());
  for (size_t i = 0; i < o.size(); ++i) r.out[i] = bf16_to_f32(o[i]);
  return r;
}

}  // namespace

// (weights: recomputed on the GPU from its own router logits, the same experts replayed.)
MoeStageOutputs moe_stages_gpu(const float* x, int64_t T, const std::vector<int32_t>& ids,
                               const std::vector<float>& /*weights*/, const MoeWeights& m, const ModelConfig& c) {
  return gpu_stages(x, T, ids, m, c, false);
}

MoeStageOutputs moe_stages_gpu_w8a8(const float* x, int64_t T, const std::vector<int32_t>& ids,
                                    const std::vector<float>& /*weights*/, const MoeWeights& m, const ModelConfig& c) {
  return gpu_stages(x, T, ids, m, c, true);
}

bool cuda_step_runs_w8a8_experts(const ModelConfig& c, int64_t rows) {
  return c.num_experts > 0 && cuda::moe_fp8_prefill_runs({int(rows), int(c.num_experts), int(c.num_experts_per_tok),
                                                          int(c.hidden_size), int(c.moe_intermediate_size)});
}

}  // namespace moefold
