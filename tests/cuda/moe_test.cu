// Contract tests of the CUDA MoE chain (src/ops/cuda/moe.h) against the CPU reference (src/ops/cpu/moe.h):
// router logits, top-k (ids exact, weights to fp32 rounding), the plan (counts, offsets, pair list exact;
// exactly live_rows * k pairs; tile counters), the grouped SwiGLU experts + combine (bf16 tolerance), and
// the padding contract: padding rows hold NaN / huge values and stale ids that name real experts, and
// must change nothing: no padding output, logit, id, weight, act or y row is written (bytes compared),
// and live rows are bit-equal to an unpadded run. Skips without a GPU.
//
// MoeBench.RealShape (runs only with MOEFOLD_MOE_BENCH=1) times the chain at the real Qwen3.5 shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/contract.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/moe.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe.h"
#include "test_util.h"

namespace moefold::cuda {
namespace {

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
size_t count_unpoisoned(const void* p, size_t n) {
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
void rand_bf16(size_t n, uint64_t seed, float std, std::vector<uint16_t>& h, std::vector<float>* f) {
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
std::vector<float> from_bf16(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}

std::string shape_str(int E, int k, int H, int I, int T, int cap) {
  char b[128];
  std::snprintf(b, sizeof b, "E=%d,k=%d,H=%d,I=%d,T=%d,cap=%d", E, k, H, I, T, cap);
  return b;
}

const std::vector<int> kTokenCounts = {1, 2, 7, 16, 17, 64, 113, 114, 128, 4096};

// ---- model weights (bf16 on the device; fp32 copies of the same values for the CPU) -------------------
struct MoeWeights {
  int E, k, H, I;
  std::vector<float> router, gate_up, down, shared_gate;  // fp32 of the bf16 values
  DevBuf d_router, d_gate_up, d_down, d_shared_gate;
};

std::unique_ptr<MoeWeights> make_weights(int E, int k, int H, int I, uint64_t seed) {
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

MoeWeights& real_weights() {  // Qwen3.5-35B-A3B layer shape
  static std::unique_ptr<MoeWeights> w = make_weights(256, 8, 2048, 512, 1000);
  return *w;
}
MoeWeights& small_weights() {  // 16 experts top-4
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
ChainRun run_chain(MoeWeights& w, int T, int cap, const std::vector<uint16_t>& x_live,
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

/// Full contract of one (weights, T) case: padded run vs CPU and vs an unpadded run.
void check_chain(MoeWeights& w, int T, int pad, bool with_residual, uint64_t seed) {
  const int E = w.E, k = w.k, H = w.H, I = w.I;
  const int cap = T + pad;
  std::vector<uint16_t> xh, shh, resh;
  std::vector<float> xf, shf, resf;
  rand_bf16(size_t(T) * H, seed, 1.0f, xh, &xf);
  rand_bf16(size_t(T) * H, seed + 1, 0.5f, shh, &shf);
  if (with_residual) rand_bf16(size_t(T) * H, seed + 2, 1.0f, resh, &resf);
  const std::string shp = shape_str(E, k, H, I, T, cap);

  ChainRun g = run_chain(w, T, cap, xh, shh, resh);

  // Router logits vs CPU fp32 (same bf16-rounded inputs; only the summation order differs).
  std::vector<float> lref(size_t(T) * E);
  cpu::linear(xf.data(), w.router.data(), nullptr, lref.data(), T, H, E);
  EXPECT_TRUE(contract("moe_router_logits", shp, rel_err(g.logits, lref), 1e-5));

  // Top-k on the GPU's own logits: ids exact, weights to fp32 rounding.
  std::vector<int32_t> iref(size_t(T) * k);
  std::vector<float> wref(size_t(T) * k);
  cpu::router_topk(g.logits.data(), T, E, k, true, iref.data(), wref.data());
  size_t id_mis = 0;
  for (size_t i = 0; i < iref.size(); ++i) id_mis += g.ids[i] != iref[i];
  EXPECT_TRUE(contract_exact("moe_router_topk_ids", shp, id_mis));
  EXPECT_TRUE(contract("moe_router_topk_weights", shp, rel_err(g.weights, wref), 1e-6));

  // Plan: exactly T * k pairs, grouped like cpu::moe_plan, tiles as expected, no padding read.
  cpu::MoePlan pref = cpu::moe_plan(g.ids.data(), T, k, E);
  size_t plan_mis = 0;
  for (int e = 0; e <= E; ++e) plan_mis += g.offsets[size_t(e)] != pref.offsets[size_t(e)];
  for (int e = 0; e < E; ++e) plan_mis += g.counts[size_t(e)] != pref.offsets[size_t(e + 1)] - pref.offsets[size_t(e)];
  if (g.pairs.size() == pref.pairs.size()) {
    for (size_t i = 0; i < g.pairs.size(); ++i) plan_mis += g.pairs[i] != pref.pairs[i];
  } else {
    plan_mis += 1000000;
  }
  int tiles_ref = 0;
  for (int e = 0; e < E; ++e)
    tiles_ref += (pref.offsets[size_t(e + 1)] - pref.offsets[size_t(e)] + g.tile_rows - 1) / g.tile_rows;
  EXPECT_EQ(g.offsets[size_t(E)], T * k) << "planned pairs must be exactly live_rows * k";
  EXPECT_EQ(g.num_tiles, tiles_ref);
  EXPECT_EQ(g.status, 0);
  plan_mis += (g.offsets[size_t(E)] != T * k) + (g.num_tiles != tiles_ref) + (g.status != 0);
  EXPECT_TRUE(contract_exact("moe_plan", shp, plan_mis));

  // Output vs CPU: routed experts with the GPU's ids/weights, + sigmoid(gate . x) * shared (+ residual).
  std::vector<float> ref(size_t(T) * H, 0.0f);
  if (with_residual) ref = resf;
  cpu::moe_experts(xf.data(), w.gate_up.data(), w.down.data(), g.ids.data(), g.weights.data(), ref.data(), T, H, I,
                   E, k);
  for (int t = 0; t < T; ++t) {
    double d = 0;
    for (int h = 0; h < H; ++h) d += double(xf[size_t(t) * H + h]) * w.shared_gate[size_t(h)];
    const float s = cpu::sigmoid(float(d));
    for (int h = 0; h < H; ++h) ref[size_t(t) * H + h] += s * shf[size_t(t) * H + h];
  }
  EXPECT_TRUE(contract("moe_forward", shp + (with_residual ? ",residual" : ""), rel_err(from_bf16(g.out), ref), 1e-2));

  // Padding: nothing written, nothing routed, nothing run.
  const size_t pad_written =
      g.pad_out_bytes_written + g.pad_logits + g.pad_ids + g.pad_weights + g.pad_act + g.pad_y;
  EXPECT_EQ(g.pad_out_bytes_written, 0u);
  EXPECT_EQ(g.pad_logits, 0u);
  EXPECT_EQ(g.pad_ids, 0u);
  EXPECT_EQ(g.pad_weights, 0u);
  EXPECT_EQ(g.pad_act, 0u);
  EXPECT_EQ(g.pad_y, 0u);
  EXPECT_TRUE(contract_exact("moe_padding_untouched", shp, pad_written));

  // Live rows equal an unpadded run, bit for bit.
  if (pad > 0) {
    ChainRun u = run_chain(w, T, T, xh, shh, resh);
    size_t mis = 0;
    for (size_t i = 0; i < u.out.size(); ++i) mis += u.out[i] != g.out[i];
    for (size_t i = 0; i < u.ids.size(); ++i) mis += u.ids[i] != g.ids[i];
    EXPECT_TRUE(contract_exact("moe_padded_eq_unpadded", shp, mis));
  }
}

// ---- router top-k on crafted logits -----------------------------------------------------------------------
enum class LogitKind { kRandom, kAllNegative, kTies, kSpecialsLive };

std::vector<float> crafted_logits(LogitKind kind, int T, int E, uint64_t seed) {
  std::vector<float> l;
  switch (kind) {
    case LogitKind::kRandom: l = test::randn(size_t(T) * E, seed, 3.0f); break;
    case LogitKind::kAllNegative: l = test::uniform(size_t(T) * E, seed, -60.0f, -0.5f); break;
    case LogitKind::kTies: {
      auto u = test::uniform(size_t(T) * E, seed, 0.0f, 4.0f);
      const float vals[4] = {-1.0f, 0.0f, 0.5f, 2.0f};
      l.resize(u.size());
      for (size_t i = 0; i < u.size(); ++i) l[i] = vals[std::min(3, int(u[i]))];
      break;
    }
    case LogitKind::kSpecialsLive: {
      l = test::randn(size_t(T) * E, seed, 2.0f);
      for (size_t i = 0; i < l.size(); i += 5) l[i] = NAN;
      for (size_t i = 2; i < l.size(); i += 11) l[i] = -INFINITY;
      if (T > 1)
        for (int e = 0; e < E; ++e) l[size_t(E) + e] = NAN;  // a row of NaN only
      break;
    }
  }
  return l;
}

// Runs moe_router_topk on `logits` ([cap, E]; rows >= T are padding) and, with `replay` ([cap, k]), replays
// those experts; checks against cpu::router_topk on the live rows: ids exact, weights within 1e-6,
// padding rows' outputs unwritten. Contract rows <what>_ids, <what>_weights, <what>_padding.
void expect_topk_matches_cpu(const std::string& what, const std::string& shp, const MoeShape& shape, int T,
                             bool renorm, const std::vector<float>& logits, const std::vector<int32_t>* replay) {
  const int cap = shape.capacity, k = shape.k, E = shape.E, pad = cap - T;
  DevBuf d_l(logits.size() * 4), d_r(replay ? replay->size() * 4 : 4), d_ids(size_t(cap) * k * 4),
      d_w(size_t(cap) * k * 4), d_rows(4);
  upload(d_l.p, logits);
  if (replay) upload(d_r.p, *replay);
  upload(d_rows.p, std::vector<int32_t>{T});
  MOEFOLD_CUDA_CHECK(cudaMemset(d_ids.p, 0xFF, d_ids.bytes));
  MOEFOLD_CUDA_CHECK(cudaMemset(d_w.p, 0xFF, d_w.bytes));
  moe_router_topk(d_l.as<float>(), d_rows.as<int32_t>(), shape, renorm, d_ids.as<int32_t>(), d_w.as<float>(), nullptr,
                  replay ? d_r.as<int32_t>() : nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  auto ids = download<int32_t>(d_ids.p, size_t(T) * k);
  auto wts = download<float>(d_w.p, size_t(T) * k);
  std::vector<int32_t> iref(size_t(T) * k);
  std::vector<float> wref(size_t(T) * k);
  cpu::router_topk(logits.data(), T, E, k, renorm, iref.data(), wref.data(), replay ? replay->data() : nullptr);
  size_t mis = 0;
  for (size_t i = 0; i < ids.size(); ++i) mis += ids[i] != iref[i];
  EXPECT_TRUE(contract_exact(what + "_ids", shp, mis));
  EXPECT_TRUE(contract(what + "_weights", shp, rel_err(wts, wref), 1e-6));
  const size_t pad_w = count_unpoisoned(d_ids.as<int32_t>() + size_t(T) * k, size_t(pad) * k * 4) +
                       count_unpoisoned(d_w.as<float>() + size_t(T) * k, size_t(pad) * k * 4);
  EXPECT_TRUE(contract_exact(what + "_padding", shp, pad_w));
}

void check_topk(int E, int k, int T, int pad, LogitKind kind, bool renorm, uint64_t seed) {
  const int cap = T + pad;
  MoeShape shape{cap, E, k, 128, 64};
  std::vector<float> live = crafted_logits(kind, T, E, seed);
  std::vector<float> l(size_t(cap) * E);
  const float garbage[5] = {NAN, 3.0e38f, -3.0e38f, INFINITY, -INFINITY};
  for (size_t i = 0; i < l.size(); ++i) l[i] = i < live.size() ? live[i] : garbage[i % 5];
  const char* names[4] = {"random", "all_negative", "ties", "nan_inf_live"};
  const std::string shp = shape_str(E, k, 0, 0, T, cap) + "," + names[int(kind)] + (renorm ? ",renorm" : ",raw");
  expect_topk_matches_cpu("moe_router_topk", shp, shape, T, renorm, l, nullptr);
}

TEST(MoeRouter, TopkMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 10;
  for (auto [E, k] : {std::pair{256, 8}, std::pair{16, 4}})
    for (int T : kTokenCounts)
      for (LogitKind kind : {LogitKind::kRandom, LogitKind::kAllNegative, LogitKind::kTies, LogitKind::kSpecialsLive})
        check_topk(E, k, T, T % 2 ? 5 : 0, kind, true, ++seed);
  check_topk(256, 8, 17, 3, LogitKind::kRandom, false, ++seed);
  check_topk(16, 4, 113, 3, LogitKind::kAllNegative, false, ++seed);
}

// Routing replay: given experts (distinct, random, expert 0 and the least likely ones included) instead
// of the top-k; weights must be cpu::router_topk's replay weights; padding rows' replay entries name real
// experts and must not be read or their outputs written.
void check_topk_replay(int E, int k, int T, int pad, bool renorm, uint64_t seed) {
  const int cap = T + pad;
  MoeShape shape{cap, E, k, 128, 64};
  std::vector<float> l = crafted_logits(LogitKind::kRandom, cap, E, seed);
  std::vector<int32_t> replay(size_t(cap) * k);
  uint64_t s = seed;
  for (int t = 0; t < cap; ++t)
    for (int j = 0; j < k; ++j) {
      int32_t e;
      bool dup;
      do {
        e = j == 0 && t % 3 == 0 ? 0 : int32_t(splitmix(s) % uint64_t(E));
        dup = false;
        for (int q = 0; q < j; ++q) dup |= replay[size_t(t) * k + q] == e;
      } while (dup);
      replay[size_t(t) * k + j] = e;
    }
  const std::string shp = shape_str(E, k, 0, 0, T, cap) + (renorm ? ",renorm" : ",raw");
  expect_topk_matches_cpu("moe_router_replay", shp, shape, T, renorm, l, &replay);
}

TEST(MoeRouter, ReplayMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 500;
  for (auto [E, k] : {std::pair{256, 8}, std::pair{16, 4}})
    for (int T : {1, 17, 128})
      for (bool renorm : {true, false}) check_topk_replay(E, k, T, T % 2 ? 5 : 0, renorm, ++seed);
}

// ---- plan on given ids ------------------------------------------------------------------------------------
void check_plan(int E, int k, int T, int pad, int bad_ids, uint64_t seed) {
  const int cap = T + pad;
  MoeShape shape{cap, E, k, 128, 64};
  // Distinct random experts per live row; padding rows hold stale real experts.
  std::vector<int32_t> ids(size_t(cap) * k);
  uint64_t s = seed;
  for (int t = 0; t < cap; ++t) {
    for (int j = 0; j < k; ++j) {
      int32_t e;
      bool dup;
      do {
        e = int32_t(splitmix(s) % uint64_t(E));
        dup = false;
        for (int q = 0; q < j; ++q) dup |= ids[size_t(t) * k + q] == e;
      } while (dup);
      ids[size_t(t) * k + j] = e;
    }
  }
  for (int b = 0; b < bad_ids && T > 0; ++b) ids[size_t(b * 7 % (T * k))] = E + 3 + b;
  const size_t bytes = moe_workspace_bytes(shape);
  DevBuf d_ws(bytes), d_ids(ids.size() * 4), d_rows(4);
  MoeWorkspace ws = moe_workspace_bind(d_ws.p, bytes, shape);
  MOEFOLD_CUDA_CHECK(cudaMemset(d_ws.p, 0xFF, bytes));
  upload(d_ids.p, ids);
  upload(d_rows.p, std::vector<int32_t>{T});
  moe_plan(d_ids.as<int32_t>(), d_rows.as<int32_t>(), shape, ws, nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());

  // Reference over the live, valid pairs only (invalid ones are dropped by the GPU plan).
  const int L = T * k;
  std::vector<int32_t> counts(size_t(E), 0);
  for (int i = 0; i < L; ++i)
    if (ids[size_t(i)] >= 0 && ids[size_t(i)] < E) counts[size_t(ids[size_t(i)])]++;
  std::vector<int32_t> offs(size_t(E) + 1, 0), pairs;
  for (int e = 0; e < E; ++e) offs[size_t(e + 1)] = offs[size_t(e)] + counts[size_t(e)];
  for (int e = 0; e < E; ++e)
    for (int i = 0; i < L; ++i)
      if (ids[size_t(i)] == e) pairs.push_back(i);
  if (bad_ids == 0) {  // and it agrees with cpu::moe_plan
    cpu::MoePlan p = cpu::moe_plan(ids.data(), T, k, E);
    EXPECT_EQ(p.offsets, offs);
    EXPECT_EQ(p.pairs, pairs);
  }
  auto g_off = download<int32_t>(ws.offsets, size_t(E) + 1);
  auto g_cnt = download<int32_t>(ws.counts, size_t(E));
  auto g_pairs = download<int32_t>(ws.pairs, pairs.size());
  const int g_tiles = download<int32_t>(ws.num_tiles, 1)[0], g_status = download<int32_t>(ws.status, 1)[0];
  int tiles_ref = 0;
  for (int e = 0; e < E; ++e) tiles_ref += (counts[size_t(e)] + ws.tile_rows - 1) / ws.tile_rows;
  size_t mis = (g_off != offs) + (g_cnt != counts) + (g_pairs != pairs) + (g_tiles != tiles_ref) +
               (g_status != bad_ids);
  EXPECT_EQ(g_off[size_t(E)], L - bad_ids);
  EXPECT_EQ(g_status, bad_ids);
  char extra[64];
  std::snprintf(extra, sizeof extra, ",bad_ids=%d,tile_rows=%d", bad_ids, ws.tile_rows);
  EXPECT_TRUE(contract_exact("moe_plan", shape_str(E, k, 0, 0, T, cap) + extra, mis));
}

TEST(MoePlan, MatchesCpuAndCountsLivePairsOnly) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 100;
  for (auto [E, k] : {std::pair{256, 8}, std::pair{16, 4}})
    for (int T : kTokenCounts) check_plan(E, k, T, T == 4096 ? 100 : 9, 0, ++seed);
  check_plan(256, 8, 0, 16, 0, ++seed);     // no live rows at all
  check_plan(256, 8, 17, 5, 2, ++seed);     // invalid live ids: counted in status, dropped
  check_plan(256, 8, 1500, 300, 3, ++seed); // same on the device-sort path
}

// ---- the whole chain --------------------------------------------------------------------------------------
TEST(MoeChain, E16k4) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  uint64_t seed = 300;
  for (int T : kTokenCounts) check_chain(w, T, T == 4096 ? 0 : 5 + T % 3, T % 2 == 1, ++seed);
  check_chain(w, 1000, 24, false, ++seed);
}

// The fixtures' shape (hidden 128, intermediate 64: one or two K tiles) in a large bucket with few live
// rows, as the CUDA executor runs it (capacity = the most rows a step may hold).
TEST(MoeChain, TinyShapeLargeCapacityFewLiveRows) {
  MOEFOLD_REQUIRE_GPU();
  static std::unique_ptr<MoeWeights> w = make_weights(16, 4, 128, 64, 2500);
  uint64_t seed = 700;
  for (int T : {1, 2, 7, 63, 64, 65, 130}) check_chain(*w, T, 0, false, ++seed);
  for (int T : {1, 2, 7, 63, 64, 65, 130}) check_chain(*w, T, 2048 - T, T % 2 == 1, ++seed);
  static std::unique_ptr<MoeWeights> w8 = make_weights(8, 2, 128, 64, 2600);
  for (int T : {1, 63, 130}) check_chain(*w8, T, 2048 - T, false, ++seed);
}

TEST(MoeChain, E256k8RealShape) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = real_weights();
  uint64_t seed = 500;
  for (int T : kTokenCounts) check_chain(w, T, T == 4096 ? 0 : 7, T % 2 == 1, ++seed);
  check_chain(w, 1024, 0, false, ++seed);  // the medium tile configuration at the real shape
}

// Every expert tile configuration computes the same bits (same per-element mma order), so the choice by
// capacity never changes results.
TEST(MoeChain, TileConfigsBitIdentical) {
  MOEFOLD_REQUIRE_GPU();
  for (MoeWeights* w : {&small_weights(), &real_weights()}) {
    const int T = 100;
    std::vector<uint16_t> xh, shh, none;
    rand_bf16(size_t(T) * w->H, 77, 1.0f, xh, nullptr);
    rand_bf16(size_t(T) * w->H, 78, 0.5f, shh, nullptr);
    ChainRun base = run_chain(*w, T, T + 3, xh, shh, none, 0);
    for (int cfg : {1, 2}) {
      ChainRun r = run_chain(*w, T, T + 3, xh, shh, none, cfg);
      size_t mis = 0;
      for (size_t i = 0; i < r.out.size(); ++i) mis += r.out[i] != base.out[i];
      mis += (r.pad_out_bytes_written + r.pad_act + r.pad_y) + (r.offsets != base.offsets) + (r.pairs != base.pairs);
      char shp[96];
      std::snprintf(shp, sizeof shp, "E=%d,k=%d,H=%d,T=%d,tiles=%d_vs_0", w->E, w->k, w->H, T, cfg);
      EXPECT_TRUE(contract_exact("moe_tile_configs_bit_identical", shp, mis));
    }
  }
}

// Step shapes: a workspace bound for 4,096 rows serving steps of 1 .. 113 rows (the executor's decode
// steps) gives bit-identical results to a workspace bound for the step itself, with the step's tiles.
TEST(MoeChain, StepShapeInLargeWorkspaceBitIdentical) {
  MOEFOLD_REQUIRE_GPU();
  for (MoeWeights* w : {&small_weights(), &real_weights()})
    for (int T : {1, 16, 113}) {
      std::vector<uint16_t> xh, shh, none;
      rand_bf16(size_t(T) * w->H, 91 + T, 1.0f, xh, nullptr);
      rand_bf16(size_t(T) * w->H, 92 + T, 0.5f, shh, nullptr);
      ChainRun base = run_chain(*w, T, T + 3, xh, shh, none);
      ChainRun r = run_chain(*w, T, T + 3, xh, shh, none, -1, 4096);
      size_t mis = 0;
      for (size_t i = 0; i < r.out.size(); ++i) mis += r.out[i] != base.out[i];
      mis += (r.pad_out_bytes_written + r.pad_act + r.pad_y) + (r.offsets != base.offsets) + (r.pairs != base.pairs) +
             (r.num_tiles != base.num_tiles);
      char shp[96];
      std::snprintf(shp, sizeof shp, "E=%d,k=%d,H=%d,T=%d,bound=4096", w->E, w->k, w->H, T);
      EXPECT_TRUE(contract_exact("moe_step_shape_bit_identical", shp, mis));
    }
}

// Small cases for compute-sanitizer (memcheck / racecheck): every kernel and both plan paths.
TEST(MoeChain, SanitizeSmall) {
  MOEFOLD_REQUIRE_GPU();
  check_chain(small_weights(), 3, 4, true, 900);
}
TEST(MoeChain, Sanitize) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  check_chain(w, 130, 6, false, 901);
  check_chain(w, 1100, 30, false, 902);
}

// ---- micro-benchmark (MOEFOLD_MOE_BENCH=1) ----------------------------------------------------------------
__global__ void fill_bf16_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = __float2bfloat16((float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
  }
}

TEST(MoeBench, RealShape) {
  MOEFOLD_REQUIRE_GPU();
  if (!std::getenv("MOEFOLD_MOE_BENCH")) GTEST_SKIP() << "set MOEFOLD_MOE_BENCH=1 to run the benchmark";
  const int E = 256, k = 8, H = 2048, I = 512;
  DevBuf wr(size_t(E) * H * 2), gu(size_t(E) * 2 * I * H * 2), dn(size_t(E) * H * I * 2), sg(size_t(H) * 2);
  auto fill = [](DevBuf& b, uint64_t seed, float scale) {
    fill_bf16_kernel<<<1024, 256>>>(b.as<__nv_bfloat16>(), b.bytes / 2, seed, scale);
    MOEFOLD_CUDA_CHECK(cudaGetLastError());
  };
  fill(wr, 1, 0.08f), fill(gu, 2, 0.04f), fill(dn, 3, 0.08f), fill(sg, 4, 0.04f);
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreate(&st));
  std::printf("BENCH moe E=%d k=%d H=%d I=%d (bf16 weights; median of graph replays, rotating %d inputs)\n", E, k, H,
              I, 8);
  for (auto [T, cfg] : std::initializer_list<std::pair<int, int>>{{1, -1}, {8, -1}, {64, -1}, {64, 1}, {4096, -1}, {4096, 1}}) {
    MoeShape shape{T, E, k, H, I, cfg};
    const int nsets = 8;
    std::vector<std::unique_ptr<DevBuf>> xs;
    for (int i = 0; i < nsets; ++i) {
      xs.push_back(std::make_unique<DevBuf>(size_t(T) * H * 2));
      fill(*xs.back(), 100 + i, 1.7f);
    }
    DevBuf out(size_t(T) * H * 2), rows(4);
    upload(rows.p, std::vector<int32_t>{T});
    const size_t bytes = moe_workspace_bytes(shape);
    std::vector<std::unique_ptr<DevBuf>> wsb;
    std::vector<MoeWorkspace> ws;
    for (int i = 0; i < nsets; ++i) {
      wsb.push_back(std::make_unique<DevBuf>(bytes));
      ws.push_back(moe_workspace_bind(wsb.back()->p, bytes, shape));
    }
    // Eager warm-up (kernel attributes, CUB) before any capture.
    moe_forward(xs[0]->as<__nv_bfloat16>(), wr.as<__nv_bfloat16>(), gu.as<__nv_bfloat16>(), dn.as<__nv_bfloat16>(),
                nullptr, nullptr, nullptr, rows.as<int32_t>(), shape, true, ws[0], out.as<__nv_bfloat16>(), st);
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
    // Graphs: full chain, router only, grouped GEMMs only; one per input set.
    std::vector<cudaGraphExec_t> full(nsets), router(nsets), gemms(nsets);
    for (int i = 0; i < nsets; ++i) {
      const __nv_bfloat16* x = xs[size_t(i)]->as<__nv_bfloat16>();
      auto capture = [&](auto&& body) {
        cudaGraph_t g;
        cudaGraphExec_t ex;
        MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        body();
        MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &g));
        MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
        MOEFOLD_CUDA_CHECK(cudaGraphDestroy(g));
        return ex;
      };
      full[size_t(i)] = capture([&] {
        moe_forward(x, wr.as<__nv_bfloat16>(), gu.as<__nv_bfloat16>(), dn.as<__nv_bfloat16>(), nullptr, nullptr,
                    nullptr, rows.as<int32_t>(), shape, true, ws[size_t(i)], out.as<__nv_bfloat16>(), st);
      });
      router[size_t(i)] = capture([&] {
        moe_router_logits(x, wr.as<__nv_bfloat16>(), rows.as<int32_t>(), shape, ws[size_t(i)].logits, st);
        moe_router_topk(ws[size_t(i)].logits, rows.as<int32_t>(), shape, true, ws[size_t(i)].ids,
                        ws[size_t(i)].weights, st);
      });
      // The two grouped expert GEMMs alone, on the plan the full chain leaves in the workspace.
      gemms[size_t(i)] = capture([&] {
        moe_expert_gate_up(x, gu.as<__nv_bfloat16>(), shape, ws[size_t(i)], st);
        moe_expert_down(dn.as<__nv_bfloat16>(), shape, ws[size_t(i)], st);
      });
    }
    auto time_graphs = [&](std::vector<cudaGraphExec_t>& gs, int iters) {
      cudaEvent_t a, b;
      MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
      MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
      for (int i = 0; i < 3 * nsets; ++i) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(gs[size_t(i % nsets)], st));
      std::vector<float> ms;
      for (int i = 0; i < iters; ++i) {
        MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
        MOEFOLD_CUDA_CHECK(cudaGraphLaunch(gs[size_t(i % nsets)], st));
        MOEFOLD_CUDA_CHECK(cudaEventRecord(b, st));
        MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      return double(ms[ms.size() / 2]);
    };
    const int iters = T >= 4096 ? 50 : 200;
    const double t_full = time_graphs(full, iters), t_router = time_graphs(router, iters);
    const double t_gemm = time_graphs(gemms, iters);  // after full: plans are in place
    // Expert weights touched: distinct experts per input set (from the plan's counts), averaged.
    double experts = 0;
    for (int i = 0; i < nsets; ++i) {
      auto c = download<int32_t>(ws[size_t(i)].counts, size_t(E));
      experts += double(std::count_if(c.begin(), c.end(), [](int32_t v) { return v > 0; }));
    }
    experts /= nsets;
    const double wbytes = experts * (3.0 * I * H * 2);
    const double flops = double(T) * k * (2.0 * H * 2 * I + 2.0 * I * H);
    const double gbs_full = (wbytes + double(E) * H * 2) / (t_full * 1e-3) / 1e9, gbs = wbytes / (t_gemm * 1e-3) / 1e9;
    const double tfs = flops / (t_gemm * 1e-3) / 1e12;
    std::printf(
        "BENCH moe T=%d tiles=%d experts_touched=%.1f full_ms=%.4f router_ms=%.4f grouped_gemms_ms=%.4f | full: %.0f GB/s | "
        "gemms: %.0f GB/s (%.0f%% of 4200), %.1f TFLOP/s (%.0f%% of 790)\n",
        T, ws[0].tile_rows, experts, t_full, t_router, t_gemm, gbs_full, gbs, gbs / 42.0, tfs, tfs / 7.9);
    for (int i = 0; i < nsets; ++i) {
      cudaGraphExecDestroy(full[size_t(i)]);
      cudaGraphExecDestroy(router[size_t(i)]);
      cudaGraphExecDestroy(gemms[size_t(i)]);
    }
  }
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace moefold::cuda
