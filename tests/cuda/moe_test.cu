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

/// CPU reference of rows [0, T): routed experts with the given ids / weights ([T, k]) + sigmoid(gate . x) *
/// shared (+ residual when resf is not empty). x, shared, residual: [T, H] fp32 of the bf16 inputs.
std::vector<float> reference_rows(const MoeWeights& w, int k, int T, const std::vector<float>& xf,
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
  const std::vector<float> ref = reference_rows(w, k, T, xf, shf, resf, g.ids.data(), g.weights.data());
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

  // Live rows equal an unpadded run, bit for bit, on the same expert path (the GEMV of capacities <= 16
  // and the tiles differ in the last bits: moe.h).
  if (pad > 0) {
    ChainRun u = run_chain(w, T, T, xh, shh, resh, moe_expert_config(MoeShape{cap, E, k, H, I}));
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

// ---- fused top-k + plan of small steps (moe_route) ---------------------------------------------------------
// moe_route at capacity <= 16 (one launch) gives the bytes of moe_router_topk then moe_plan: ids, weights,
// counts, offsets, the live pair list, tiles, status; padding rows' logits NaN / huge, stale padding ids and
// replay entries; with replay, an invalid live id is counted in status in both.
void check_route_fused(int E, int k, int T, int cap, bool replay_on, uint64_t seed) {
  const MoeShape shape{cap, E, k, 128, 64};
  ASSERT_TRUE(moe_route_fused(shape));
  std::vector<float> l = crafted_logits(LogitKind::kRandom, cap, E, seed);
  for (size_t i = size_t(T) * E; i < l.size(); ++i) l[i] = i % 3 ? (i % 3 == 1 ? 3.0e38f : -3.0e38f) : NAN;
  std::vector<int32_t> replay(size_t(cap) * k);
  uint64_t st = seed;
  for (auto& e : replay) e = int32_t(splitmix(st) % uint64_t(E));
  if (replay_on && T > 0) replay[0] = E + 1;  // invalid: dropped, counted in status
  const size_t bytes = moe_workspace_bytes(shape);
  DevBuf d_l(l.size() * 4), d_rep(replay.size() * 4), d_rows(4), wa(bytes), wb(bytes);
  upload(d_l.p, l), upload(d_rep.p, replay), upload(d_rows.p, std::vector<int32_t>{T});
  MoeWorkspace a = moe_workspace_bind(wa.p, bytes, shape), b = moe_workspace_bind(wb.p, bytes, shape);
  MOEFOLD_CUDA_CHECK(cudaMemset(wa.p, 0xFF, bytes));
  MOEFOLD_CUDA_CHECK(cudaMemset(wb.p, 0xFF, bytes));
  const int32_t* rp = replay_on ? d_rep.as<int32_t>() : nullptr;
  moe_router_topk(d_l.as<float>(), d_rows.as<int32_t>(), shape, true, a.ids, a.weights, nullptr, rp);
  moe_plan(a.ids, d_rows.as<int32_t>(), shape, a, nullptr);
  moe_route(d_l.as<float>(), d_rows.as<int32_t>(), shape, true, b, nullptr, rp);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const size_t P = size_t(cap) * k;
  auto bytes_of = [&](const MoeWorkspace& w) {
    std::vector<uint8_t> v;
    auto add = [&](const void* p, size_t n) {
      auto h = download<uint8_t>(p, n);
      v.insert(v.end(), h.begin(), h.end());
    };
    add(w.ids, P * 4), add(w.weights, P * 4), add(w.counts, size_t(E) * 4), add(w.offsets, size_t(E + 1) * 4);
    add(w.pairs, P * 4), add(w.num_tiles, 4), add(w.status, 4);
    add(w.tiles, size_t(download<int32_t>(w.num_tiles, 1)[0]) * 8);
    return v;
  };
  const std::vector<uint8_t> ra = bytes_of(a), rb = bytes_of(b);
  size_t mis = ra.size() == rb.size() ? 0 : 1000000;
  for (size_t i = 0; i < std::min(ra.size(), rb.size()); ++i) mis += ra[i] != rb[i];
  const int status = download<int32_t>(b.status, 1)[0];
  EXPECT_EQ(status, replay_on && T > 0 ? 1 : 0);
  EXPECT_EQ(download<int32_t>(b.offsets + E, 1)[0], T * k - status);
  char extra[32];
  std::snprintf(extra, sizeof extra, ",%s", replay_on ? "replay" : "topk");
  EXPECT_TRUE(contract_exact("moe_route_fused_eq_topk_plan", shape_str(E, k, 0, 0, T, cap) + extra, mis));
}

TEST(MoeRoute, SmallFusedEqualsTopkThenPlan) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 600;
  for (auto [E, k] : {std::pair{8, 1}, std::pair{16, 4}, std::pair{64, 8}, std::pair{256, 8}, std::pair{512, 32}})
    for (auto [T, cap] : {std::pair{1, 1}, std::pair{0, 3}, std::pair{3, 7}, std::pair{15, 16}, std::pair{16, 16}})
      for (bool rp : {false, true}) check_route_fused(E, k, T, cap, rp, ++seed);
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

// Every tensor-core expert configuration (tiles of 16 / 64 / 128 rows, the streaming kernels) computes
// the same bits (same per-element mma order), so the choice by capacity never changes results.
TEST(MoeChain, TileConfigsBitIdentical) {
  MOEFOLD_REQUIRE_GPU();
  for (MoeWeights* w : {&small_weights(), &real_weights()})
    for (int T : {1, 5, 16, 100}) {
      std::vector<uint16_t> xh, shh, none;
      rand_bf16(size_t(T) * w->H, 77 + T, 1.0f, xh, nullptr);
      rand_bf16(size_t(T) * w->H, 78 + T, 0.5f, shh, nullptr);
      ChainRun base = run_chain(*w, T, T + 3, xh, shh, none, 0);
      for (int cfg : {1, 2, kMoeExpertStream, -kMoeExpertStream}) {  // -: down without the early start
        moe_detail::set_stream_early_down(cfg >= 0);
        ChainRun r = run_chain(*w, T, T + 3, xh, shh, none, std::abs(cfg));
        moe_detail::set_stream_early_down(true);
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

// ---- small-batch GEMV path: graph replays at changing live counts ---------------------------------------
// The routing of the live rows: the router's top-k, or a replay naming only expert 0 / only expert E-1
// in every slot (k pairs of a row on one expert: with k > 8 or several rows, several 8-pair tiles).
enum class Routing { kTopk, kExpert0, kExpertLast };
const char* routing_name(Routing r) { return r == Routing::kTopk ? "topk" : (r == Routing::kExpert0 ? "expert0" : "expertLast"); }

/// Inputs of up to `rows` live rows (bf16 bits and their fp32 values) and their replayed experts.
struct SmallInputs {
  std::vector<uint16_t> xh, shh, resh;
  std::vector<float> xf, shf, resf;
  std::vector<int32_t> replay;  // [rows, k]; empty for top-k routing
};
SmallInputs small_inputs(const MoeWeights& w, int k, int rows, Routing routing, uint64_t seed) {
  SmallInputs in;
  rand_bf16(size_t(rows) * w.H, seed, 1.0f, in.xh, &in.xf);
  rand_bf16(size_t(rows) * w.H, seed + 1, 0.5f, in.shh, &in.shf);
  rand_bf16(size_t(rows) * w.H, seed + 2, 1.0f, in.resh, &in.resf);
  if (routing != Routing::kTopk) in.replay.assign(size_t(rows) * k, routing == Routing::kExpert0 ? 0 : w.E - 1);
  return in;
}

/// Device buffers and a bound workspace of one capacity; `run` launches the chain (eager, or captured).
struct SmallChain {
  const MoeWeights& w;
  int k, cap;
  MoeShape shape;
  DevBuf x, sh, res, out, rows, replay, ws_mem;
  MoeWorkspace ws;
  SmallChain(const MoeWeights& w_, int k_, int cap_, bool invariant = false)
      : w(w_), k(k_), cap(cap_), shape{cap_, w_.E, k_, w_.H, w_.I, -1, invariant}, x(size_t(cap_) * w_.H * 2),
        sh(size_t(cap_) * w_.H * 2), res(size_t(cap_) * w_.H * 2), out(size_t(cap_) * w_.H * 2), rows(4),
        replay(size_t(cap_) * k_ * 4), ws_mem(moe_workspace_bytes(shape)) {
    ws = moe_workspace_bind(ws_mem.p, ws_mem.bytes, shape);
  }
  void run(bool with_replay, cudaStream_t st) {
    moe_forward(x.as<__nv_bfloat16>(), w.d_router.as<__nv_bfloat16>(), w.d_gate_up.as<__nv_bfloat16>(),
                w.d_down.as<__nv_bfloat16>(), sh.as<__nv_bfloat16>(), w.d_shared_gate.as<__nv_bfloat16>(),
                res.as<__nv_bfloat16>(), rows.as<int32_t>(), shape, true, ws, out.as<__nv_bfloat16>(), st,
                with_replay ? replay.as<int32_t>() : nullptr);
  }
  /// Live rows [0, L) from `in` (rows first .. first + L - 1 of it); padding rows poisoned with `garbage`
  /// bf16 bits, stale ids and replay entries naming real experts; workspace and out poisoned (0xFF).
  void prepare(const SmallInputs& in, int first, int L, uint16_t garbage) {
    const int H = w.H, E = w.E;
    std::vector<uint16_t> hx(size_t(cap) * H, garbage), hs(hx), hr(hx);
    std::copy_n(in.xh.begin() + size_t(first) * H, size_t(L) * H, hx.begin());
    std::copy_n(in.shh.begin() + size_t(first) * H, size_t(L) * H, hs.begin());
    std::copy_n(in.resh.begin() + size_t(first) * H, size_t(L) * H, hr.begin());
    upload(x.p, hx), upload(sh.p, hs), upload(res.p, hr);
    MOEFOLD_CUDA_CHECK(cudaMemset(ws_mem.p, 0xFF, ws_mem.bytes));
    MOEFOLD_CUDA_CHECK(cudaMemset(out.p, 0xFF, out.bytes));
    const std::vector<int32_t> st = stale(L);
    if (!st.empty()) MOEFOLD_CUDA_CHECK(cudaMemcpy(ws.ids + size_t(L) * k, st.data(), st.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> rp(size_t(cap) * k);
    for (size_t i = 0; i < rp.size(); ++i)
      rp[i] = i < size_t(L) * k && !in.replay.empty() ? in.replay[size_t(first) * k + i] : int32_t((i * 5 + 1) % size_t(E));
    upload(replay.p, rp);
    upload(rows.p, std::vector<int32_t>{L});
  }
  std::vector<int32_t> stale(int L) const {
    std::vector<int32_t> st(size_t(cap - L) * k);
    for (size_t i = 0; i < st.size(); ++i) st[i] = int32_t((i * 7 + 3) % size_t(w.E));
    return st;
  }
};

/// One row run alone (capacity 1, its own workspace): out bits, ids and weights of row `t` of `in`.
struct RowResult {
  std::vector<uint16_t> out;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
RowResult run_one_row(const MoeWeights& w, int k, const SmallInputs& in, int t, bool invariant = false) {
  SmallChain c(w, k, 1, invariant);
  c.prepare(in, t, 1, 0x7FC0);
  c.run(!in.replay.empty(), nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  return RowResult{download<uint16_t>(c.out.p, size_t(w.H)), download<int32_t>(c.ws.ids, size_t(k)),
                   download<float>(c.ws.weights, size_t(k))};
}

/// The GEMV-path contract at capacity `cap`: the chain captured once in a graph, replayed at each live
/// count of `lives` (padding poisoned NaN / +huge / -huge in turn). Checks per replay: exactly the live
/// pairs planned (= cpu::moe_plan of the live ids; the replayed experts when replaying), no padding
/// output / logit / id / weight / act / y row written, every live row bit-equal to its one-row run
/// (`alone`, computed at capacity 1), and the output vs the CPU reference.
void check_gemv_replays(const MoeWeights& w, int k, int cap, const std::vector<int>& lives, const SmallInputs& in,
                        const std::vector<RowResult>& alone, Routing routing, bool invariant = false,
                        int cpu_rows = 1 << 30) {
  const int E = w.E, H = w.H, I = w.I;
  SmallChain c(w, k, cap, invariant);
  if (!invariant) ASSERT_EQ(moe_expert_config(c.shape), kMoeExpertGemv);
  if (invariant) ASSERT_NE(moe_expert_config(c.shape), kMoeExpertGemv);
  if (invariant && cap <= kMoeStreamMaxRows) ASSERT_EQ(moe_expert_config(c.shape), kMoeExpertStream);
  const bool with_replay = routing != Routing::kTopk;
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreate(&st));
  c.prepare(in, 0, cap, 0x7FC0);  // eager warm-up (kernel attributes) before the capture
  c.run(with_replay, st);
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  c.run(with_replay, st);
  MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  const uint16_t garbage[3] = {0x7FC0 /*NaN*/, 0x7F7F /*+3.4e38*/, 0xFF7F /*-3.4e38*/};
  for (size_t i = 0; i < lives.size(); ++i) {
    const int L = lives[i];
    const size_t LP = size_t(L) * k, P = size_t(cap) * k;
    c.prepare(in, 0, L, garbage[i % 3]);
    MOEFOLD_CUDA_CHECK(cudaGraphLaunch(exec, st));
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
    char shp[160];
    std::snprintf(shp, sizeof shp, "E=%d,k=%d,H=%d,I=%d,cap=%d,live=%d,%s,experts=%d", E, k, H, I, cap, L,
                  routing_name(routing), moe_expert_config(c.shape));

    // Plan: exactly the live pairs.
    const auto ids = download<int32_t>(c.ws.ids, LP);
    const auto wts = download<float>(c.ws.weights, LP);
    const auto offsets = download<int32_t>(c.ws.offsets, size_t(E) + 1);
    const auto counts = download<int32_t>(c.ws.counts, size_t(E));
    const auto pairs = download<int32_t>(c.ws.pairs, LP);
    const cpu::MoePlan pref = cpu::moe_plan(ids.data(), L, k, E);
    size_t plan_mis = (offsets != pref.offsets) + (pairs != pref.pairs);
    for (int e = 0; e < E; ++e) plan_mis += counts[size_t(e)] != pref.offsets[size_t(e + 1)] - pref.offsets[size_t(e)];
    if (with_replay)
      for (size_t j = 0; j < LP; ++j) plan_mis += ids[j] != in.replay[j];
    EXPECT_EQ(offsets[size_t(E)], L * k) << shp;
    EXPECT_TRUE(contract_exact("moe_gemv_replay_plan", shp, plan_mis));

    // Padding: nothing written (bytes still 0xFF, stale ids intact).
    size_t pad = count_unpoisoned(c.out.as<uint16_t>() + size_t(L) * H, size_t(cap - L) * H * 2) +
                 count_unpoisoned(c.ws.logits + size_t(L) * E, size_t(cap - L) * E * 4) +
                 count_unpoisoned(c.ws.weights + LP, (P - LP) * 4) +
                 count_unpoisoned(c.ws.act + LP * I, (P - LP) * size_t(I) * 2) +
                 count_unpoisoned(c.ws.y + LP * H, (P - LP) * size_t(H) * 2);
    if (P > LP) pad += download<int32_t>(c.ws.ids + LP, P - LP) != c.stale(L);
    EXPECT_TRUE(contract_exact("moe_gemv_replay_padding_untouched", shp, pad));

    // Live rows: bit-equal to the row alone; vs the CPU reference.
    const auto out = download<uint16_t>(c.out.p, size_t(L) * H);
    size_t mis = 0;
    for (int t = 0; t < L; ++t) {
      const RowResult& a = alone[size_t(t)];
      for (int h = 0; h < H; ++h) mis += out[size_t(t) * H + h] != a.out[size_t(h)];
      for (int s = 0; s < k; ++s)
        mis += ids[size_t(t) * k + s] != a.ids[size_t(s)] || std::memcmp(&wts[size_t(t) * k + s], &a.weights[size_t(s)], 4);
    }
    EXPECT_TRUE(contract_exact("moe_gemv_replay_eq_one_row", shp, mis));
    const int LC = std::min(L, cpu_rows);  // rows checked against the CPU (it is slow at the 35B shape)
    const std::vector<float> x_live(in.xf.begin(), in.xf.begin() + ptrdiff_t(LC) * H),
        sh_live(in.shf.begin(), in.shf.begin() + ptrdiff_t(LC) * H), res_live(in.resf.begin(), in.resf.begin() + ptrdiff_t(LC) * H);
    const std::vector<float> ref = reference_rows(w, k, LC, x_live, sh_live, res_live, ids.data(), wts.data());
    const std::vector<uint16_t> out_c(out.begin(), out.begin() + ptrdiff_t(LC) * H);
    EXPECT_TRUE(contract("moe_gemv_replay_vs_cpu", shp, rel_err(from_bf16(out_c), ref), 1e-2));
  }
  MOEFOLD_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MOEFOLD_CUDA_CHECK(cudaGraphDestroy(graph));
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

/// The issue's bucket-16 sequence (and other capacities when `caps` has more) for one shape and routing.
void check_gemv_shape(const MoeWeights& w, int k, Routing routing, uint64_t seed,
                      const std::vector<std::pair<int, std::vector<int>>>& caps, bool invariant = false,
                      int cpu_rows = 1 << 30) {
  int rows = 0;
  for (const auto& c : caps) rows = std::max(rows, c.first);
  const SmallInputs in = small_inputs(w, k, rows, routing, seed);
  std::vector<RowResult> alone;
  for (int t = 0; t < rows; ++t) alone.push_back(run_one_row(w, k, in, t, invariant));
  for (const auto& [cap, lives] : caps) check_gemv_replays(w, k, cap, lives, in, alone, routing, invariant, cpu_rows);
}

const std::vector<int> kBucket16Lives = {1, 2, 3, 7, 15, 16, 3};

MoeWeights& fixture_weights(int E) {  // the fixtures' MoE shape (hidden 128, intermediate 64)
  static std::unique_ptr<MoeWeights> w8 = make_weights(8, 2, 128, 64, 3100), w64 = make_weights(64, 8, 128, 64, 3200),
                                     w256 = make_weights(256, 8, 128, 64, 3300);
  return E == 8 ? *w8 : (E == 64 ? *w64 : *w256);
}

// For compute-sanitizer: one fixture shape, one mid shape with multi-tile experts.
TEST(MoeGemv, SmallGraphReplay) {
  MOEFOLD_REQUIRE_GPU();
  check_gemv_shape(fixture_weights(8), 2, Routing::kTopk, 4000, {{16, {1, 3, 16, 2}}});
  static std::unique_ptr<MoeWeights> w = make_weights(64, 8, 256, 128, 3400);
  check_gemv_shape(*w, 8, Routing::kExpert0, 4010, {{5, {5, 2}}});
}

// E in {8, 64, 256} x k in {1, 2, 8} at the fixtures' H / I, three routings: bucket 16 at the issue's live
// counts, and capacities 1 .. 16 at live counts up to the capacity (rows bit-equal across capacities).
TEST(MoeGemv, GraphReplayFixtureShapes) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 4100;
  for (int E : {8, 64, 256})
    for (int k : {1, 2, 8})
      for (Routing r : {Routing::kTopk, Routing::kExpert0, Routing::kExpertLast})
        check_gemv_shape(fixture_weights(E), k, r, ++seed,
                         {{16, kBucket16Lives}, {1, {1}}, {2, {1, 2}}, {3, {2}}, {8, {8, 5, 1}}, {13, {12}}});
  static std::unique_ptr<MoeWeights> w = make_weights(64, 8, 256, 128, 3400);
  for (int cap : {4, 9, 16}) check_gemv_shape(*w, 8, Routing::kTopk, ++seed, {{cap, {cap, cap - 1, 1}}});
}

// The Qwen3.6-35B-A3B layer shape (E 256, H 2048, I 512) at k 8, 2, 1.
TEST(MoeGemv, GraphReplay35BShape) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = real_weights();
  uint64_t seed = 4200;
  for (Routing r : {Routing::kTopk, Routing::kExpert0, Routing::kExpertLast})
    check_gemv_shape(w, 8, r, ++seed, {{16, kBucket16Lives}, {4, {4, 1}}});
  for (int k : {1, 2}) check_gemv_shape(w, k, Routing::kTopk, ++seed, {{16, kBucket16Lives}});
}

// The GEMV forced at a capacity above 16 (experts with more than 8 pairs: several 8-pair tiles each)
// against the CPU and the padding contract.
TEST(MoeGemv, ForcedAtLargerCapacity) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = fixture_weights(8);
  std::vector<uint16_t> xh, shh, resh;
  std::vector<float> xf, shf, resf;
  const int T = 40, cap = 45;
  rand_bf16(size_t(T) * w.H, 4300, 1.0f, xh, &xf);
  rand_bf16(size_t(T) * w.H, 4301, 0.5f, shh, &shf);
  ChainRun g = run_chain(w, T, cap, xh, shh, resh, kMoeExpertGemv);
  const std::vector<float> ref = reference_rows(w, w.k, T, xf, shf, resf, g.ids.data(), g.weights.data());
  const std::string shp = shape_str(w.E, w.k, w.H, w.I, T, cap) + ",forced_gemv";
  EXPECT_EQ(g.offsets[size_t(w.E)], T * w.k);
  EXPECT_TRUE(contract("moe_gemv_forced", shp, rel_err(from_bf16(g.out), ref), 1e-2));
  EXPECT_TRUE(contract_exact("moe_gemv_forced_padding", shp,
                             g.pad_out_bytes_written + g.pad_logits + g.pad_ids + g.pad_weights + g.pad_act + g.pad_y));
}

// ---- batch-invariant decode path (streaming kernels at capacity 1, tiles above) ------------------------
// The same graph-replay contract with batch_invariant: the one-row runs (capacity 1: the streaming
// kernels) must equal the rows of bucket 16 and of bucket 128 (16-row tiles; the wide plan at 128) bit
// for bit, at the issue's live counts, with the padding poisoned.
const std::vector<int> kBucket128Lives = {1, 9, 33, 64, 113, 114, 127, 128, 2};

// For compute-sanitizer (memcheck / racecheck): the streaming kernels forced, one and several plan tiles
// per expert, with and without the early start of down.
TEST(MoeStream, SanitizeSmall) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  for (bool early : {true, false}) {
    moe_detail::set_stream_early_down(early);
    for (int T : {3, 40}) {
      std::vector<uint16_t> xh, shh, none;
      std::vector<float> xf, shf, resf;
      rand_bf16(size_t(T) * w.H, 950 + T, 1.0f, xh, &xf);
      rand_bf16(size_t(T) * w.H, 951 + T, 0.5f, shh, &shf);
      ChainRun g = run_chain(w, T, T + 2, xh, shh, none, kMoeExpertStream);
      const std::vector<float> ref = reference_rows(w, w.k, T, xf, shf, resf, g.ids.data(), g.weights.data());
      const std::string shp = shape_str(w.E, w.k, w.H, w.I, T, T + 2) + (early ? ",early_down" : ",late_down");
      EXPECT_TRUE(contract("moe_stream_forced", shp, rel_err(from_bf16(g.out), ref), 1e-2));
      EXPECT_TRUE(contract_exact("moe_stream_forced_padding", shp,
                                 g.pad_out_bytes_written + g.pad_logits + g.pad_ids + g.pad_weights + g.pad_act + g.pad_y));
    }
  }
  moe_detail::set_stream_early_down(true);
}

TEST(MoeStream, GraphReplayFixtureShapes) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 5100;
  for (int E : {8, 64, 256})
    for (int k : {1, 2, 8})
      for (Routing r : {Routing::kTopk, Routing::kExpert0, Routing::kExpertLast})
        check_gemv_shape(fixture_weights(E), k, r, ++seed, {{16, kBucket16Lives}, {128, kBucket128Lives}, {3, {2}}},
                         true);
}

TEST(MoeStream, GraphReplay35BShape) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = real_weights();
  uint64_t seed = 5200;
  for (Routing r : {Routing::kTopk, Routing::kExpert0, Routing::kExpertLast})
    check_gemv_shape(w, 8, r, ++seed, {{16, kBucket16Lives}, {128, kBucket128Lives}}, true, 3);
  check_gemv_shape(w, 1, Routing::kTopk, ++seed, {{16, kBucket16Lives}}, true, 3);
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
void fill_device(DevBuf& b, uint64_t seed, float scale) {
  fill_bf16_kernel<<<1024, 256>>>(b.as<__nv_bfloat16>(), b.bytes / 2, seed, scale);
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
}

/// The work `body` enqueues on `st`, captured into an instantiated graph.
cudaGraphExec_t capture_graph(cudaStream_t st, const std::function<void()>& body) {
  cudaGraph_t g;
  cudaGraphExec_t ex;
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  body();
  MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
  MOEFOLD_CUDA_CHECK(cudaGraphDestroy(g));
  return ex;
}

/// Median milliseconds of one replay of gs[i % n] (rotating through the graphs, 3 rounds of warm-up),
/// each timed with CUDA events.
double median_graph_ms(const std::vector<cudaGraphExec_t>& gs, cudaStream_t st, int iters) {
  cudaEvent_t a, b;
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
  for (size_t i = 0; i < 3 * gs.size(); ++i) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(gs[i % gs.size()], st));
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
    MOEFOLD_CUDA_CHECK(cudaGraphLaunch(gs[size_t(i) % gs.size()], st));
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
}

/// Distinct experts with pairs in the plan of `ws` (its counts), averaged over the workspaces.
double mean_touched_experts(const std::vector<MoeWorkspace>& ws, int E) {
  double experts = 0;
  for (const MoeWorkspace& w : ws) {
    auto c = download<int32_t>(w.counts, size_t(E));
    experts += double(std::count_if(c.begin(), c.end(), [](int32_t v) { return v > 0; }));
  }
  return experts / double(ws.size());
}

TEST(MoeBench, RealShape) {
  MOEFOLD_REQUIRE_GPU();
  if (!std::getenv("MOEFOLD_MOE_BENCH")) GTEST_SKIP() << "set MOEFOLD_MOE_BENCH=1 to run the benchmark";
  const int E = 256, k = 8, H = 2048, I = 512;
  DevBuf wr(size_t(E) * H * 2), gu(size_t(E) * 2 * I * H * 2), dn(size_t(E) * H * I * 2), sg(size_t(H) * 2);
  fill_device(wr, 1, 0.08f), fill_device(gu, 2, 0.04f), fill_device(dn, 3, 0.08f), fill_device(sg, 4, 0.04f);
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
      fill_device(*xs.back(), 100 + i, 1.7f);
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
      auto capture = [&](const std::function<void()>& body) { return capture_graph(st, body); };
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
    auto time_graphs = [&](const std::vector<cudaGraphExec_t>& gs, int iters) { return median_graph_ms(gs, st, iters); };
    const int iters = T >= 4096 ? 50 : 200;
    const double t_full = time_graphs(full, iters), t_router = time_graphs(router, iters);
    const double t_gemm = time_graphs(gemms, iters);  // after full: plans are in place
    // Expert weights touched: distinct experts per input set (from the plan's counts), averaged.
    const double experts = mean_touched_experts(ws, E);
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

// Decode capacities 1 .. 256 at the Qwen3.6-35B-A3B shape: the 16-row tensor-core tiles (expert_tiles 0,
// the batch-invariant kernels before the streaming ones) as A, the streaming kernels (4) as B, in the
// order A B B A, plus the non-invariant GEMV (3) at capacities <= 16, the 64-row tiles (1) from 64, and
// the streaming kernels with down waiting for gate_up before its first load (no early PDL start). Per case two PERF lines: the routed
// chain (moe_forward: router, top-k, plan, experts, combine) and the two expert kernels alone, each with
// the GB/s of the expert weights touched (experts with pairs x 3 x H x I bf16) and that rate's fraction
// of the device-to-device copy bandwidth (read + write) measured first in this binary. CUDA graphs, 8
// input sets rotated (other experts each replay: no L2 reuse of weights), median of 100 replays.
TEST(MoePerf, DISABLED_DecodeExperts) {
  MOEFOLD_REQUIRE_GPU();
  const int E = 256, k = 8, H = 2048, I = 512, nsets = 8;
  DevBuf wr(size_t(E) * H * 2), gu(size_t(E) * 2 * I * H * 2), dn(size_t(E) * H * I * 2);
  fill_device(wr, 1, 0.08f), fill_device(gu, 2, 0.04f), fill_device(dn, 3, 0.08f);
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreate(&st));

  // The copy on the stream with events (the profiler's roofline method; a memcpy node in a graph runs on
  // the copy engines at ~2.7 TB/s on the H200, below what kernels reach), bytes read + written.
  const size_t copy_bytes = size_t(1) << 30;
  DevBuf ca(copy_bytes), cb(copy_bytes);
  std::vector<float> cms;
  {
    cudaEvent_t a, b;
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 12; ++i) {
      MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(cb.p, ca.p, copy_bytes, cudaMemcpyDeviceToDevice, st));
      MOEFOLD_CUDA_CHECK(cudaEventRecord(b, st));
      MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      if (i >= 2) cms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  std::sort(cms.begin(), cms.end());
  const double t_copy = double(cms[cms.size() / 2]);
  const double copy_gbs = 2.0 * double(copy_bytes) / (t_copy * 1e-3) / 1e9;  // read + write
  test::perf_line("device_copy", "bytes=1GiB", t_copy * 1e3, fmt::format("GB/s={:.0f}", copy_gbs));

  const char* env = std::getenv("MOEFOLD_MOE_PERF_T");  // e.g. "1,64": a subset of the capacities
  std::vector<int> Ts = {1, 2, 8, 16, 64, 256};
  if (env) {
    Ts.clear();
    for (const char* c = env; *c;) {
      Ts.push_back(std::atoi(c));
      while (*c && *c != ',') ++c;
      if (*c) ++c;
    }
  }
  for (int T : Ts) {
    std::vector<std::unique_ptr<DevBuf>> xs;
    for (int i = 0; i < nsets; ++i) {
      xs.push_back(std::make_unique<DevBuf>(size_t(T) * H * 2));
      fill_device(*xs.back(), 100 + i, 1.7f);
    }
    DevBuf out(size_t(T) * H * 2), rows(4);
    upload(rows.p, std::vector<int32_t>{T});
    std::vector<int> cfgs = {0, kMoeExpertStream, kMoeExpertStream, 0};
    if (T <= kMoeSmallBatchMaxRows) cfgs.push_back(kMoeExpertGemv);
    if (T >= 64) cfgs.push_back(1);  // the 64-row tiles (fewer, fuller CTAs when experts hold several rows)
    cfgs.push_back(-kMoeExpertStream);  // the streaming kernels without the early (PDL) start of down
    for (size_t ci = 0; ci < cfgs.size(); ++ci) {
      const int cfg = std::abs(cfgs[ci]);
      moe_detail::set_stream_early_down(cfgs[ci] >= 0);
      const MoeShape shape{T, E, k, H, I, cfg};
      const size_t bytes = moe_workspace_bytes(shape);
      std::vector<std::unique_ptr<DevBuf>> wsb;
      std::vector<MoeWorkspace> ws;
      for (int i = 0; i < nsets; ++i) {
        wsb.push_back(std::make_unique<DevBuf>(bytes));
        ws.push_back(moe_workspace_bind(wsb.back()->p, bytes, shape));
      }
      auto chain = [&](int i) {
        moe_forward(xs[size_t(i)]->as<__nv_bfloat16>(), wr.as<__nv_bfloat16>(), gu.as<__nv_bfloat16>(),
                    dn.as<__nv_bfloat16>(), nullptr, nullptr, nullptr, rows.as<int32_t>(), shape, true, ws[size_t(i)],
                    out.as<__nv_bfloat16>(), st);
      };
      chain(0);  // eager warm-up before any capture
      MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
      std::vector<cudaGraphExec_t> full, experts;
      for (int i = 0; i < nsets; ++i) {
        full.push_back(capture_graph(st, [&] { chain(i); }));
        experts.push_back(capture_graph(st, [&] {  // on the plan the full chain leaves in ws[i]
          moe_expert_gate_up(xs[size_t(i)]->as<__nv_bfloat16>(), gu.as<__nv_bfloat16>(), shape, ws[size_t(i)], st);
          moe_expert_down(dn.as<__nv_bfloat16>(), shape, ws[size_t(i)], st);
        }));
      }
      const double t_full = median_graph_ms(full, st, 100), t_exp = median_graph_ms(experts, st, 100);
      const double wbytes = mean_touched_experts(ws, E) * 3.0 * I * H * 2;
      const std::string name = cfg == 0 ? "tiles16"
                               : cfg == 1 ? "tiles64"
                               : cfg == kMoeExpertGemv ? "gemv"
                               : cfgs[ci] < 0 ? "stream_no_early_down"
                                              : "stream";
      const std::string order = ci >= 4 ? "" : (ci == 0 || ci == 3 ? ",A" : ",B");
      const std::string shp = fmt::format("E={},k={},H={},I={},T={},experts={:.1f}{}", E, k, H, I, T,
                                          wbytes / (3.0 * I * H * 2), order);
      for (auto [what, t] : {std::pair{"moe_chain", t_full}, std::pair{"moe_experts", t_exp}}) {
        const double gbs = wbytes / (t * 1e-3) / 1e9;
        test::perf_line(std::string(what) + ":" + name, shp, t * 1e3,
                        fmt::format("GB/s={:.0f} copy_frac={:.2f}", gbs, gbs / copy_gbs));
      }
      for (auto& g : full) cudaGraphExecDestroy(g);
      for (auto& g : experts) cudaGraphExecDestroy(g);
      moe_detail::set_stream_early_down(true);
    }
  }
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace moefold::cuda
