// Shared helpers of the moe_test binary (tests/cuda/moe_test/*.cu, one GoogleTest binary of several
// files: router_test.cc, chain_test.cc, decode_paths_test.cc, perf_test.cu).
//
// Contract tests of the CUDA MoE chain (src/ops/cuda/moe.h) against the CPU reference (src/ops/cpu/moe.h):
// router logits, top-k (ids exact, weights to fp32 rounding), the plan (counts, offsets, pair list exact;
// exactly live_rows * k pairs; tile counters), the grouped SwiGLU experts + combine (bf16 tolerance), and
// the padding contract: padding rows hold NaN / huge values and stale ids that name real experts, and
// must change nothing: no padding output, logit, id, weight, act or y row is written (bytes compared),
// and live rows are bit-equal to an unpadded run. Skips without a GPU.
//
// Small-batch GEMV path (capacity <= 16, MoeGemv.*) and the batch-invariant path (MoeStream.*: the
// streaming kernels at capacity 1, tiles above): the routed chain captured once in a CUDA graph per
// bucket and replayed at changing live counts with poisoned padding; exactly the live pairs planned, no
// padding row or pair written, live rows bit-equal to one-row runs (batch invariance), vs the CPU.
//
// MoeBench.RealShape (runs only with MOEFOLD_MOE_BENCH=1) times the chain at the real Qwen3.5 shape;
// MoePerf.DISABLED_DecodeExperts times the decode capacities 1..256 on the expert paths (tiles, streaming, GEMV).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/moe.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_internal.h"
#include "test_util.h"

namespace moefold::cuda::moe_test {

using test::contract;
using test::contract_exact;
using test::rel_err;

// ---- small helpers ----------------------------------------------------------------------------------
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n) { alloc(n); }
  void alloc(size_t n) {
    bytes = n;
    MOEFOLD_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 256)));
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <class T>
void upload(void* dst, const std::vector<T>& v) {
  MOEFOLD_CUDA_CHECK(cudaMemcpy(dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <class T>
std::vector<T> download(const void* src, size_t n) {
  std::vector<T> v(n);
  MOEFOLD_CUDA_CHECK(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
/// Bytes in [p, p + n) of device memory that are not 0xFF (the poison).
inline size_t count_unpoisoned(const void* p, size_t n) {
  if (n == 0) return 0;
  auto h = download<uint8_t>(p, n);
  return size_t(std::count_if(h.begin(), h.end(), [](uint8_t b) { return b != 0xFF; }));
}

// Fast deterministic generator for large weight tensors (splitmix64 -> uniform with the given std).
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// n bf16 values, uniform with standard deviation `std` (never zero in bulk); also the fp32 copy.
inline void rand_bf16(size_t n, uint64_t seed, float std, std::vector<uint16_t>& h, std::vector<float>* f) {
  h.resize(n);
  if (f) f->resize(n);
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  const float a = std * 1.7320508f;
  for (size_t i = 0; i < n; ++i) {
    const float u = float(splitmix(s) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    h[i] = f32_to_bf16((2.0f * u - 1.0f) * a);
    if (f) (*f)[i] = bf16_to_f32(h[i]);
  }
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}

inline std::string shape_str(int E, int k, int H, int I, int T, int cap) {
  char b[128];
  std::snprintf(b, sizeof b, "E=%d,k=%d,H=%d,I=%d,T=%d,cap=%d", E, k, H, I, T, cap);
  return b;
}

inline const std::vector<int> kTokenCounts = {1, 2, 7, 16, 17, 64, 113, 114, 128, 4096};

// ---- model weights (bf16 on the device; fp32 copies of the same values for the CPU) -------------------
struct MoeWeights {
  int E, k, H, I;
  std::vector<float> router, gate_up, down, shared_gate;  // fp32 of the bf16 values
  DevBuf d_router, d_gate_up, d_down, d_shared_gate;
};

inline std::unique_ptr<MoeWeights> make_weights(int E, int k, int H, int I, uint64_t seed) {
  auto w = std::make_unique<MoeWeights>();
  w->E = E, w->k = k, w->H = H, w->I = I;
  std::vector<uint16_t> h;
  rand_bf16(size_t(E) * H, seed + 1, 2.0f / std::sqrt(float(H)), h, &w->router);
  w->d_router.alloc(h.size() * 2);
  upload(w->d_router.p, h);
  rand_bf16(size_t(E) * 2 * I * H, seed + 2, 1.0f / std::sqrt(float(H)), h, &w->gate_up);
  w->d_gate_up.alloc(h.size() * 2);
  upload(w->d_gate_up.p, h);
  rand_bf16(size_t(E) * H * I, seed + 3, 1.0f / std::sqrt(float(I)), h, &w->down);
  w->d_down.alloc(h.size() * 2);
  upload(w->d_down.p, h);
  rand_bf16(size_t(H), seed + 4, 1.0f / std::sqrt(float(H)), h, &w->shared_gate);
  w->d_shared_gate.alloc(h.size() * 2);
  upload(w->d_shared_gate.p, h);
  return w;
}

inline MoeWeights& real_weights() {  // Qwen3.5-35B-A3B layer shape
  static std::unique_ptr<MoeWeights> w = make_weights(256, 8, 2048, 512, 1000);
  return *w;
}
inline MoeWeights& small_weights() {  // 16 experts top-4
  static std::unique_ptr<MoeWeights> w = make_weights(16, 4, 256, 128, 2000);
  return *w;
}

// ---- one run of the chain ---------------------------------------------------------------------------------
struct ChainRun {
  std::vector<uint16_t> out;  // [cap, H] bytes as bf16 bits
  std::vector<float> logits;  // [T, E]
  std::vector<int32_t> ids;   // [T, k]
  std::vector<float> weights; // [T, k]
  std::vector<int32_t> counts, offsets, pairs;
  int num_tiles = -1, status = -1, tile_rows = 0;
  size_t pad_out_bytes_written = 0, pad_logits = 0, pad_ids = 0, pad_weights = 0, pad_act = 0, pad_y = 0;
};

/// Runs moe_forward with `cap` rows of buffers of which T are live. Live inputs: x_live [T, H] bf16 bits,
/// shared [T, H] bits, residual [T, H] bits (empty: not used). Padding rows get NaN / +-huge bf16 values
/// and stale ids naming real experts.
inline ChainRun run_chain(MoeWeights& w, int T, int cap, const std::vector<uint16_t>& x_live,
                   const std::vector<uint16_t>& shared, const std::vector<uint16_t>& residual,
                   int expert_tiles = -1, int bind_cap = 0) {
  const int E = w.E, k = w.k, H = w.H, I = w.I;
  MoeShape shape{cap, E, k, H, I, expert_tiles};
  // bind_cap > cap: the workspace is bound for a larger capacity and `shape` is a step shape.
  const MoeShape bind_shape{std::max(cap, bind_cap), E, k, H, I, expert_tiles};
  std::vector<uint16_t> x(size_t(cap) * H), sh(size_t(cap) * H), res(size_t(cap) * H);
  const uint16_t garbage[4] = {0x7FC0 /*NaN*/, 0x7F7F /*+3.4e38*/, 0xFF7F /*-3.4e38*/, 0x7F80 /*+inf*/};
  for (size_t i = 0; i < x.size(); ++i) {
    const bool live = i < size_t(T) * H;
    x[i] = live ? x_live[i] : garbage[i % 4];
    sh[i] = live ? shared[i] : garbage[(i + 1) % 4];
    res[i] = live && !residual.empty() ? residual[i] : garbage[(i + 2) % 4];
  }
  DevBuf d_x(x.size() * 2), d_sh(sh.size() * 2), d_res(res.size() * 2), d_out(x.size() * 2), d_rows(4);
  upload(d_x.p, x);
  upload(d_sh.p, sh);
  upload(d_res.p, res);
  upload(d_rows.p, std::vector<int32_t>{T});
  const size_t ws_bytes = moe_workspace_bytes(bind_shape);
  DevBuf d_ws(ws_bytes);
  MoeWorkspace ws = moe_workspace_bind(d_ws.p, ws_bytes, bind_shape);
  MOEFOLD_CUDA_CHECK(cudaMemset(d_ws.p, 0xFF, ws_bytes));
  MOEFOLD_CUDA_CHECK(cudaMemset(d_out.p, 0xFF, d_out.bytes));
  // Stale ids in padding rows, naming real experts (the plan must never read them).
  std::vector<int32_t> stale(size_t(cap - T) * k);
  for (size_t i = 0; i < stale.size(); ++i) stale[i] = int32_t((i * 7 + 3) % size_t(E));
  if (!stale.empty())
    MOEFOLD_CUDA_CHECK(cudaMemcpy(ws.ids + size_t(T) * k, stale.data(), stale.size() * 4, cudaMemcpyHostToDevice));

  moe_forward(d_x.as<__nv_bfloat16>(), w.d_router.as<__nv_bfloat16>(), w.d_gate_up.as<__nv_bfloat16>(),
              w.d_down.as<__nv_bfloat16>(), d_sh.as<__nv_bfloat16>(), w.d_shared_gate.as<__nv_bfloat16>(),
              residual.empty() ? nullptr : d_res.as<__nv_bfloat16>(), d_rows.as<int32_t>(), shape, true, ws,
              d_out.as<__nv_bfloat16>(), nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());

  ChainRun r;
  const size_t L = size_t(T) * k, P = size_t(cap) * k;
  r.out = download<uint16_t>(d_out.p, size_t(T) * H);
  r.logits = download<float>(ws.logits, size_t(T) * E);
  r.ids = download<int32_t>(ws.ids, L);
  r.weights = download<float>(ws.weights, L);
  r.counts = download<int32_t>(ws.counts, size_t(E));
  r.offsets = download<int32_t>(ws.offsets, size_t(E) + 1);
  r.pairs = download<int32_t>(ws.pairs, size_t(r.offsets[E] >= 0 ? std::min<size_t>(r.offsets[E], P) : 0));
  r.num_tiles = download<int32_t>(ws.num_tiles, 1)[0];
  r.status = download<int32_t>(ws.status, 1)[0];
  r.tile_rows = ws.tile_rows;
  r.pad_out_bytes_written = count_unpoisoned(d_out.as<uint16_t>() + size_t(T) * H, size_t(cap - T) * H * 2);
  r.pad_logits = count_unpoisoned(ws.logits + size_t(T) * E, size_t(cap - T) * E * 4);
  if (!stale.empty()) {
    auto ids_pad = download<int32_t>(ws.ids + L, P - L);
    r.pad_ids = ids_pad == stale ? 0 : 1;
  }
  r.pad_weights = count_unpoisoned(ws.weights + L, (P - L) * 4);
  r.pad_act = count_unpoisoned(ws.act + L * I, (P - L) * size_t(I) * 2);
  r.pad_y = count_unpoisoned(ws.y + L * H, (P - L) * size_t(H) * 2);
  return r;
}

/// CPU reference of rows [0, T): routed experts with the given ids / weights ([T, k]) + sigmoid(gate . x) *
/// shared (+ residual when resf is not empty). x, shared, residual: [T, H] fp32 of the bf16 inputs.
inline std::vector<float> reference_rows(const MoeWeights& w, int k, int T, const std::vector<float>& xf,
                                  const std::vector<float>& shf, const std::vector<float>& resf,
                                  const int32_t* ids, const float* weights) {
  const int H = w.H;
  std::vector<float> ref(size_t(T) * H, 0.0f);
  for (size_t t = 0; t < size_t(T); ++t) {  // serial: OpenBLAS calls from several threads at once are not safe
    float* r = ref.data() + t * H;
    if (!resf.empty()) std::copy_n(resf.data() + t * H, H, r);
    cpu::moe_experts(xf.data() + t * H, w.gate_up.data(), w.down.data(), ids + t * k, weights + t * k, r, 1, H, w.I,
                     w.E, k);
    double d = 0;
    for (int h = 0; h < H; ++h) d += double(xf[t * H + h]) * w.shared_gate[size_t(h)];
    const float sg = cpu::sigmoid(float(d));
    for (int h = 0; h < H; ++h) r[h] += sg * shf[t * H + h];
  }
  return ref;
}

}  // namespace moefold::cuda::moe_test
