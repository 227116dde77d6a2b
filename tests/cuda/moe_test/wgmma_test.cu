// moe_test: the wgmma version of the 128-row expert GEMMs (src/ops/cuda/moe_gemm_wgmma.h, the default;
// MOEFOLD_MOE_GEMM=mma selects the tiles; here moe_detail::set_expert_gemm_wgmma chooses).
//
// MoeWgmma.* run the plan and the two expert GEMMs (moe_plan, moe_expert_gate_up, moe_expert_down at
// expert_tiles 2, the 128-row tiles) on ids built for a given expert load (empty experts, 1 row,
// 127/128/129 rows, skewed, the 35B shape at 32k tokens), once with the mma.sync tiles and once with
// the wgmma kernels, into poisoned act / y: the wgmma outputs must equal the tiles' bit for bit, every
// live element must be written, no padding byte (pairs past the live ones) may change, and the outputs
// of sampled pairs must match a CPU fp64 reference within bf16 tolerance (act from x, y from the GPU's
// act). MoeWgmma.ChainContract runs the whole chain (moe_forward) through the wgmma kernels vs the
// CPU and vs the tiles (bitwise) with padded, poisoned inputs.
//
// MoeWgmmaPerf.DISABLED_Prefill35B times both GEMMs at the 35B shape, 32768 tokens, router top-8
// routing and a skewed (Zipf) routing: tiles vs wgmma (both tile widths) in the order A B C C B A, TFLOP/s, and the fraction
// of cuBLASLt's dense GEMM of the same FLOPs (M = tokens * k) measured in the same binary.
#include <numeric>
#include <random>
#include <stdexcept>

#include "core/error.h"
#include "cuda/moe_test/moe_test_util.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/moe_gemm_wgmma.h"

namespace moefold::cuda::moe_test {
namespace {

__global__ void count_diff_kernel(const uint16_t* a, const uint16_t* b, size_t n, unsigned long long* out) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    c += a[i] != b[i];
  if (c) atomicAdd(out, c);
}
__global__ void count_value_kernel(const uint16_t* a, size_t n, uint16_t v, unsigned long long* out) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    c += a[i] == v;
  if (c) atomicAdd(out, c);
}
__global__ void fill_random_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = __float2bfloat16((float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
  }
}

/// bf16 elements (n) at a and b that differ; with b == nullptr, elements of a equal to the 0xFFFF poison.
size_t count_on_device(const void* a, const void* b, size_t n) {
  DevBuf c(8);
  MOEFOLD_CUDA_CHECK(cudaMemset(c.p, 0, 8));
  if (n > 0) {
    if (b)
      count_diff_kernel<<<1024, 256>>>(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
                                       c.as<unsigned long long>());
    else
      count_value_kernel<<<1024, 256>>>(static_cast<const uint16_t*>(a), n, 0xFFFF, c.as<unsigned long long>());
    MOEFOLD_CUDA_CHECK(cudaGetLastError());
  }
  return size_t(download<unsigned long long>(c.p, 1)[0]);
}

/// [T, k] ids realising per-expert pair counts `counts` (sum = T * k, each <= T): every token takes the
/// k experts with the most pairs left (distinct experts per token), ties by the lower index.
std::vector<int32_t> ids_for_counts(std::vector<int> counts, int T, int k) {
  const int E = int(counts.size());
  std::vector<int32_t> ids(size_t(T) * k);
  std::vector<int> order(static_cast<size_t>(E));
  for (int t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return counts[size_t(a)] != counts[size_t(b)] ? counts[size_t(a)] > counts[size_t(b)] : a < b;
    });
    for (int s = 0; s < k; ++s) {
      const int e = order[size_t(s)];
      if (counts[size_t(e)] <= 0) throw std::runtime_error("ids_for_counts: counts not realisable");
      --counts[size_t(e)];
      ids[size_t(t) * k + s] = e;
    }
  }
  return ids;
}

/// [T, k] ids with k distinct experts per token drawn with probability ~ 1 / (rank + 1)^zipf_s (0:
/// uniform), the experts' ranks a random permutation of the expert indices.
std::vector<int32_t> random_ids(int T, int E, int k, double zipf_s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> perm(static_cast<size_t>(E));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<double> w(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) w[size_t(e)] = 1.0 / std::pow(double(e + 1), zipf_s);
  std::discrete_distribution<int> pick(w.begin(), w.end());
  std::vector<int32_t> ids(size_t(T) * k);
  std::vector<char> used(static_cast<size_t>(E));
  for (int t = 0; t < T; ++t) {
    std::fill(used.begin(), used.end(), 0);
    for (int s = 0; s < k;) {
      const int e = perm[size_t(pick(rng))];
      if (used[size_t(e)]) continue;
      used[size_t(e)] = 1;
      ids[size_t(t) * k + s++] = e;
    }
  }
  return ids;
}

/// One plan on the device (ids uploaded, moe_plan run) with inputs x [cap, H] (live rows random,
/// padding rows NaN / huge), and the expert GEMMs of either kind run into poisoned act / y.
struct ExpertCase {
  MoeWeights& w;
  int T, cap, L;  // live rows, capacity, live pairs (T * k)
  MoeShape shape;
  std::vector<uint16_t> x_live;  // [T, H] bits
  DevBuf x, rows, ws_mem;
  MoeWorkspace ws;

  ExpertCase(MoeWeights& weights, const std::vector<int32_t>& ids, int T_, int pad, uint64_t seed)
      : w(weights), T(T_), cap(T_ + pad), L(T_ * weights.k), shape{T_ + pad, weights.E, weights.k, weights.H, weights.I, 2} {
    const int H = w.H, k = w.k;
    rand_bf16(size_t(T) * H, seed, 1.0f, x_live, nullptr);
    std::vector<uint16_t> xh(size_t(cap) * H);
    const uint16_t garbage[4] = {0x7FC0, 0x7F7F, 0xFF7F, 0x7F80};
    for (size_t i = 0; i < xh.size(); ++i) xh[i] = i < x_live.size() ? x_live[i] : garbage[i % 4];
    x.alloc(xh.size() * 2);
    upload(x.p, xh);
    rows.alloc(4);
    upload(rows.p, std::vector<int32_t>{T});
    const size_t bytes = moe_workspace_bytes(shape);
    ws_mem.alloc(bytes);
    MOEFOLD_CUDA_CHECK(cudaMemset(ws_mem.p, 0xFF, bytes));
    ws = moe_workspace_bind(ws_mem.p, bytes, shape);
    std::vector<int32_t> all(size_t(cap) * k);
    for (size_t i = 0; i < all.size(); ++i) all[i] = i < ids.size() ? ids[i] : int32_t((i * 7 + 3) % size_t(w.E));
    upload(ws.ids, all);
    moe_plan(ws.ids, rows.as<int32_t>(), shape, ws, nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  }
  size_t act_elems() const { return size_t(L) * w.I; }
  size_t y_elems() const { return size_t(L) * w.H; }
  /// gate_up then down with the wgmma kernels (tile width tile_n, 0: automatic) or the mma.sync tiles,
  /// act and y poisoned first.
  void run(bool wgmma, int tile_n = 0) {
    const size_t P = size_t(cap) * w.k;
    MOEFOLD_CUDA_CHECK(cudaMemset(ws.act, 0xFF, P * w.I * 2));
    MOEFOLD_CUDA_CHECK(cudaMemset(ws.y, 0xFF, P * w.H * 2));
    moe_detail::set_expert_gemm_wgmma(wgmma, tile_n);
    moe_expert_gate_up(x.as<__nv_bfloat16>(), w.d_gate_up.as<__nv_bfloat16>(), shape, ws, nullptr);
    moe_expert_down(w.d_down.as<__nv_bfloat16>(), shape, ws, nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    moe_detail::set_expert_gemm_wgmma(false);
  }
};

/// ||gpu - ref|| / ||ref|| of act and y at plan positions `positions` (fp64 CPU: act from x and the
/// expert's gate/up rows, y from the GPU's act row and the expert's down rows).
std::pair<double, double> cpu_rel_err(const ExpertCase& c, const std::vector<int>& positions) {
  const MoeWeights& w = c.w;
  const int E = w.E, k = w.k, H = w.H, I = w.I;
  const auto offsets = download<int32_t>(c.ws.offsets, size_t(E) + 1);
  std::vector<float> act_gpu, act_ref, y_gpu, y_ref;
  for (int j : positions) {
    const int e = int(std::upper_bound(offsets.begin(), offsets.end(), j) - offsets.begin()) - 1;
    const int pair = download<int32_t>(c.ws.pairs + j, 1)[0];
    const int t = pair / k;
    const auto a = from_bf16(download<uint16_t>(c.ws.act + size_t(j) * I, size_t(I)));
    const auto y = from_bf16(download<uint16_t>(c.ws.y + size_t(pair) * H, size_t(H)));
    const uint16_t* xr = c.x_live.data() + size_t(t) * H;
    const float* gu = w.gate_up.data() + size_t(e) * 2 * I * H;
    for (int col = 0; col < I; ++col) {
      double g = 0, u = 0;
      for (int h = 0; h < H; ++h) {
        const double xv = bf16_to_f32(xr[h]);
        g += xv * gu[size_t(col) * H + h];
        u += xv * gu[size_t(I + col) * H + h];
      }
      act_ref.push_back(float(g / (1.0 + std::exp(-g)) * u));
      act_gpu.push_back(a[size_t(col)]);
    }
    const float* dn = w.down.data() + size_t(e) * H * I;
    for (int h = 0; h < H; ++h) {
      double s = 0;
      for (int col = 0; col < I; ++col) s += double(a[size_t(col)]) * dn[size_t(h) * I + col];
      y_ref.push_back(float(s));
      y_gpu.push_back(y[size_t(h)]);
    }
  }
  return {rel_err(act_gpu, act_ref), rel_err(y_gpu, y_ref)};
}

/// The full check of one expert load: wgmma == tiles bitwise, all live outputs written, padding
/// untouched, sampled pairs vs the CPU.
void check_load(MoeWeights& w, const std::string& name, const std::vector<int32_t>& ids, int T, int pad,
                uint64_t seed, int cpu_samples, const std::vector<int>& tile_ns = {256, 128}) {
  const std::string shp = name + "," + shape_str(w.E, w.k, w.H, w.I, T, T + pad);
  ExpertCase c(w, ids, T, pad, seed);
  EXPECT_EQ(download<int32_t>(c.ws.offsets + w.E, 1)[0], c.L) << shp;
  c.run(false);
  DevBuf act_ref(c.act_elems() * 2), y_ref(c.y_elems() * 2);
  MOEFOLD_CUDA_CHECK(cudaMemcpy(act_ref.p, c.ws.act, c.act_elems() * 2, cudaMemcpyDeviceToDevice));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(y_ref.p, c.ws.y, c.y_elems() * 2, cudaMemcpyDeviceToDevice));
  const size_t P = size_t(c.cap) * w.k;
  for (int tile_n : tile_ns) {  // the tile widths of the wgmma kernels
    c.run(true, tile_n);
    const std::string s = shp + ",tile_n=" + std::to_string(tile_n);
    EXPECT_TRUE(contract_exact("moe_gemm_wgmma:gate_up_equals_tiles", s, count_on_device(c.ws.act, act_ref.p, c.act_elems())));
    EXPECT_TRUE(contract_exact("moe_gemm_wgmma:down_equals_tiles", s, count_on_device(c.ws.y, y_ref.p, c.y_elems())));
    EXPECT_TRUE(contract_exact("moe_gemm_wgmma:live_written", s,
                               count_on_device(c.ws.act, nullptr, c.act_elems()) + count_on_device(c.ws.y, nullptr, c.y_elems())));
    EXPECT_TRUE(contract_exact("moe_gemm_wgmma:padding_untouched", s,
                               count_unpoisoned(c.ws.act + c.act_elems(), (P - size_t(c.L)) * w.I * 2) +
                                   count_unpoisoned(c.ws.y + c.y_elems(), (P - size_t(c.L)) * w.H * 2)));
  }
  c.run(true);  // the automatic width, for the CPU check
  if (cpu_samples > 0) {
    std::vector<int> pos;  // spread over the plan, first and last included
    for (int i = 0; i < cpu_samples; ++i) pos.push_back(int(int64_t(c.L - 1) * i / std::max(1, cpu_samples - 1)));
    const auto [ea, ey] = cpu_rel_err(c, pos);
    EXPECT_TRUE(contract("moe_gemm_wgmma:gate_up_vs_cpu", shp, ea, 1e-2));
    EXPECT_TRUE(contract("moe_gemm_wgmma:down_vs_cpu", shp, ey, 1e-2));
  }
}

// The automatic tile width: 256 B rows where whole tiles cover the columns, else 128; bad widths throw.
TEST(MoeWgmma, TileWidth) {
  EXPECT_EQ(moe_detail::expert_gemm_wgmma_tile_n(MoeShape{4096, 256, 8, 2048, 512}, true), 256);
  EXPECT_EQ(moe_detail::expert_gemm_wgmma_tile_n(MoeShape{4096, 256, 8, 2048, 512}, false), 256);
  EXPECT_EQ(moe_detail::expert_gemm_wgmma_tile_n(MoeShape{4096, 16, 4, 128, 64}, true), 128);   // fixtures
  EXPECT_EQ(moe_detail::expert_gemm_wgmma_tile_n(MoeShape{4096, 16, 4, 128, 64}, false), 128);
  EXPECT_EQ(moe_detail::expert_gemm_wgmma_tile_n(MoeShape{4096, 16, 4, 384, 192}, false), 128);  // 384 % 256
  EXPECT_THROW(moe_detail::set_expert_gemm_wgmma(true, 192), Error);
  moe_detail::set_expert_gemm_wgmma(false);
}

// The fixtures' shape (H 128, I 64) has no 256-wide tiles: the 128-wide kernels alone, one K chunk of down.
TEST(MoeWgmma, TinyShape) {
  MOEFOLD_REQUIRE_GPU();
  static std::unique_ptr<MoeWeights> w = make_weights(16, 4, 128, 64, 2500);
  const std::vector<int> c = {0, 1, 127, 128, 129, 0, 200, 60, 61, 64, 65, 0, 2, 3, 130, 10};  // sum 980
  check_load(*w, "tiny", ids_for_counts(c, 245, 4), 245, 3, 31, 8, {128});
}

// Small shape (16 experts top-4, H 256, I 128): edge loads.
TEST(MoeWgmma, EdgeLoadsSmallShape) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = small_weights();
  // 0, 1, 127, 128, 129, ... rows: empty experts, single rows, tiles full, one short, one over.
  const std::vector<int> edge = {0, 1, 127, 128, 129, 0, 255, 256, 257, 64, 65, 0, 2, 383, 384, 385};  // sum 2436
  check_load(w, "edge", ids_for_counts(edge, 609, 4), 609, 5, 11, 24);
  check_load(w, "one_token", ids_for_counts({1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0}, 1, 4), 1, 3, 12, 4);
  std::vector<int> skew(16, 0);  // every token on experts 0..2, the rest spread thin
  skew[0] = skew[1] = skew[2] = 1000;
  for (int e = 3; e < 16; ++e) skew[size_t(e)] = 1000 / 13 + (e - 3 < 1000 % 13 ? 1 : 0);
  check_load(w, "skewed", ids_for_counts(skew, 1000, 4), 1000, 0, 13, 16);
  check_load(w, "zipf", random_ids(3000, 16, 4, 1.2, 14), 3000, 7, 15, 16);
}

// The 35B shape (256 experts top-8, H 2048, I 512): edge loads with many empty experts, then 32k tokens.
TEST(MoeWgmma, LoadsRealShape) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = real_weights();
  std::vector<int> edge(256, 0);
  const int fixed[] = {1, 127, 128, 129, 255, 256, 257, 2};  // experts 0..7; 9..17 take 138, 18 takes 3
  for (int e = 0; e < 8; ++e) edge[size_t(e)] = fixed[e];
  for (int e = 9; e < 18; ++e) edge[size_t(e)] = 138;
  edge[18] = 3;  // 1155 + 1242 + 3 = 2400 = 300 * 8; experts 8 and 19..255 empty
  check_load(w, "edge", ids_for_counts(edge, 300, 8), 300, 9, 21, 10);
  check_load(w, "uniform_32k", random_ids(32768, 256, 8, 0.0, 22), 32768, 7, 23, 4);
  check_load(w, "zipf_32k", random_ids(32768, 256, 8, 1.0, 24), 32768, 0, 25, 4);
}

// The whole chain through the wgmma kernels: vs the CPU, vs the tiles bitwise, padding untouched.
TEST(MoeWgmma, ChainContract) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 900;
  for (MoeWeights* w : {&small_weights(), &real_weights()})
    for (int T : {1, 130, 700}) {
      if (w->E == 256 && T == 700) continue;  // CPU reference time
      std::vector<uint16_t> xh, shh, resh;
      std::vector<float> xf, shf, resf;
      rand_bf16(size_t(T) * w->H, ++seed, 1.0f, xh, &xf);
      rand_bf16(size_t(T) * w->H, ++seed, 0.5f, shh, &shf);
      rand_bf16(size_t(T) * w->H, ++seed, 1.0f, resh, &resf);
      const std::string shp = shape_str(w->E, w->k, w->H, w->I, T, T + 5);
      ChainRun tiles = run_chain(*w, T, T + 5, xh, shh, resh, 2);
      moe_detail::set_expert_gemm_wgmma(true);
      ChainRun g = run_chain(*w, T, T + 5, xh, shh, resh, 2);
      moe_detail::set_expert_gemm_wgmma(false);
      const std::vector<float> ref = reference_rows(*w, w->k, T, xf, shf, resf, g.ids.data(), g.weights.data());
      EXPECT_TRUE(contract("moe_forward:wgmma", shp, rel_err(from_bf16(g.out), ref), 1e-2));
      size_t mis = 0;
      for (size_t i = 0; i < g.out.size(); ++i) mis += g.out[i] != tiles.out[i];
      EXPECT_TRUE(contract_exact("moe_forward:wgmma_equals_tiles", shp, mis));
      EXPECT_TRUE(contract_exact("moe_forward:wgmma_padding_untouched", shp,
                                 g.pad_out_bytes_written + g.pad_act + g.pad_y + g.pad_logits + g.pad_weights));
    }
}

// 35B shape, 32768 tokens: tiles (A) vs wgmma 256-wide (B) and 128-wide (C), A B C C B A, per GEMM and
// both, plus cuBLASLt's dense
// GEMM of the same FLOPs (M = 32768 * 8 rows). Routing: the router's top-8 on random inputs, and Zipf(1).
TEST(MoeWgmmaPerf, DISABLED_Prefill35B) {
  MOEFOLD_REQUIRE_GPU();
  MoeWeights& w = real_weights();
  const int T = 32768, E = w.E, k = w.k, H = w.H, I = w.I;
  const int64_t M = int64_t(T) * k;
  const double f_gu = 2.0 * double(M) * H * 2 * I, f_dn = 2.0 * double(M) * I * H;
  // cuBLASLt: y[M, N] = x[M, K] . w[N, K]^T, random bf16 (never zeros).
  DevBuf cx(size_t(M) * H * 2), cw(size_t(H) * H * 2), cy(size_t(M) * H * 2);
  fill_random_kernel<<<1024, 256>>>(cx.as<__nv_bfloat16>(), cx.bytes / 2, 1, 1.0f);
  fill_random_kernel<<<1024, 256>>>(cw.as<__nv_bfloat16>(), cw.bytes / 2, 2, 0.03f);
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
  auto cublas_gu = [&] { gemm_bf16(cx.as<__nv_bfloat16>(), cw.as<__nv_bfloat16>(), nullptr, cy.as<__nv_bfloat16>(), M, H, 2 * I, nullptr); };
  auto cublas_dn = [&] { gemm_bf16(cx.as<__nv_bfloat16>(), cw.as<__nv_bfloat16>(), nullptr, cy.as<__nv_bfloat16>(), M, I, H, nullptr); };
  const double t_cub_gu = test::time_us(cublas_gu, 3, 20), t_cub_dn = test::time_us(cublas_dn, 3, 20);
  std::printf("cublaslt dense: gate_up-equivalent %.1f us (%.1f TFLOP/s), down-equivalent %.1f us (%.1f TFLOP/s)\n",
              t_cub_gu, f_gu / t_cub_gu * 1e-6, t_cub_dn, f_dn / t_cub_dn * 1e-6);

  struct Row {
    std::string routing, variant;
    double us_gu, us_dn;
    size_t diff;
  };
  std::vector<Row> rows;
  for (const char* routing : {"router_top8", "zipf1"}) {
    std::vector<int32_t> ids;
    if (std::string(routing) == "zipf1") {
      ids = random_ids(T, E, k, 1.0, 77);
    } else {  // the router's own top-8 on random x (the ids moe_route writes)
      ExpertCase probe(w, random_ids(T, E, k, 0.0, 5), T, 0, 31);
      DevBuf logits(size_t(T) * E * 4);
      moe_router_logits(probe.x.as<__nv_bfloat16>(), w.d_router.as<__nv_bfloat16>(), probe.rows.as<int32_t>(), probe.shape,
                        logits.as<float>(), nullptr);
      DevBuf wts(size_t(T) * k * 4);
      moe_router_topk(logits.as<float>(), probe.rows.as<int32_t>(), probe.shape, true, probe.ws.ids, wts.as<float>(), nullptr);
      ids = download<int32_t>(probe.ws.ids, size_t(T) * k);
    }
    ExpertCase c(w, ids, T, 0, 31);
    auto counts = download<int32_t>(c.ws.counts, size_t(E));
    const int mx = *std::max_element(counts.begin(), counts.end());
    const int mn = *std::min_element(counts.begin(), counts.end());
    std::printf("routing %s: rows per expert min %d max %d mean %.0f\n", routing, mn, mx, double(M) / E);
    // Variants: 0 = the mma.sync tiles, 1 = wgmma 256-wide tiles, 2 = wgmma 128-wide; order A B C C B A.
    auto gu = [&](int v) {
      moe_detail::set_expert_gemm_wgmma(v != 0, v == 1 ? 256 : 128);
      moe_expert_gate_up(c.x.as<__nv_bfloat16>(), w.d_gate_up.as<__nv_bfloat16>(), c.shape, c.ws, nullptr);
    };
    auto dn = [&](int v) {
      moe_detail::set_expert_gemm_wgmma(v != 0, v == 1 ? 256 : 128);
      moe_expert_down(w.d_down.as<__nv_bfloat16>(), c.shape, c.ws, nullptr);
    };
    const int order[6] = {0, 1, 2, 2, 1, 0};
    double t_gu[3] = {0, 0, 0}, t_dn[3] = {0, 0, 0};
    std::string seq;
    for (int v : order) {
      const double a = test::time_us([&] { gu(v); }, 2, 15), b = test::time_us([&] { dn(v); }, 2, 15);
      t_gu[v] += a / 2, t_dn[v] += b / 2;
      seq += fmt::format(" {}:{:.0f}/{:.0f}", "ABC"[v], a, b);
    }
    std::printf("%s A B C C B A (gate_up/down us):%s\n", routing, seq.c_str());
    // Bits of this routing: tiles vs each wgmma width, act and y.
    c.run(false);
    DevBuf a_ref(c.act_elems() * 2), y_ref(c.y_elems() * 2);
    MOEFOLD_CUDA_CHECK(cudaMemcpy(a_ref.p, c.ws.act, c.act_elems() * 2, cudaMemcpyDeviceToDevice));
    MOEFOLD_CUDA_CHECK(cudaMemcpy(y_ref.p, c.ws.y, c.y_elems() * 2, cudaMemcpyDeviceToDevice));
    rows.push_back({routing, "tiles_mma(A)", t_gu[0], t_dn[0], 0});
    for (int v = 1; v <= 2; ++v) {
      c.run(true, v == 1 ? 256 : 128);
      const size_t diff = count_on_device(c.ws.act, a_ref.p, c.act_elems()) + count_on_device(c.ws.y, y_ref.p, c.y_elems());
      EXPECT_EQ(diff, 0u) << routing << " variant " << v;
      rows.push_back({routing, v == 1 ? "wgmma256(B)" : "wgmma128(C)", t_gu[v], t_dn[v], diff});
    }
  }
  moe_detail::set_expert_gemm_wgmma(false);
  std::printf("%-12s %-13s %9s %8s %7s %9s %8s %7s %9s %8s %7s %s\n", "routing", "variant", "gu_us", "gu_TF/s", "gu/cub",
              "dn_us", "dn_TF/s", "dn/cub", "both_us", "TF/s", "/cub", "bits_vs_tiles");
  for (const Row& r : rows) {
    const double both = r.us_gu + r.us_dn, cub = t_cub_gu + t_cub_dn;
    std::printf("%-12s %-13s %9.1f %8.1f %7.3f %9.1f %8.1f %7.3f %9.1f %8.1f %7.3f %s\n", r.routing.c_str(),
                r.variant.c_str(), r.us_gu, f_gu / r.us_gu * 1e-6, t_cub_gu / r.us_gu, r.us_dn, f_dn / r.us_dn * 1e-6,
                t_cub_dn / r.us_dn, both, (f_gu + f_dn) / both * 1e-6, cub / both,
                r.variant[0] == 't' ? "-" : (r.diff == 0 ? "EQUAL" : "DIFFER"));
    test::perf_line("moe_experts_32k:" + r.variant.substr(0, r.variant.find('(')), r.routing + ",E=256,k=8,H=2048,I=512,T=32768",
                    both, fmt::format("TFLOP/s={:.1f} vs_cublas={:.3f}", (f_gu + f_dn) / both * 1e-6, cub / both));
  }
}

}  // namespace
}  // namespace moefold::cuda::moe_test
