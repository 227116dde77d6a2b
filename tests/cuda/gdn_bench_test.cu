// Timings of the Gated DeltaNet prefill kernels for scripts/gpu/gdn_bench.py (not a contract; disabled by
// default). GDN_BENCH="S:len:Hk:Hv[,...]" lists the shapes (S sequences of len tokens, dk = dv = 128);
// inputs are random on the device. Each kernel is captured once into a CUDA graph and timed as the mean of
// GDN_BENCH_REPS (default 20) replays after 3 warm-ups, between CUDA events. Prints per shape:
//   BENCH kernel=<name> seqs=S len=L hk=Hk hv=Hv us=<time> bytes=<moved>
// for gdn_prefill (the default path), gdn_prefill_scalar (MOEFOLD_GDN_TC=0; only when GDN_BENCH_SCALAR=1)
// gdn_tc_chunk (the split path's chunk-parallel kernels alone, unless MOEFOLD_GDN_TC_SPLIT=0) and
// conv1d_prefill (causal_conv1d_silu_prefill over the q|k|v rows, K = 4). GDN_BENCH_PHASES=1 adds
//   PHASES seqs=S ... <phase>=<cycles per block and chunk> ...
// from one eager launch with the tensor-core kernel's per-phase clock counters on.
#include "ops/cuda/cuda_check.h"  // first: sets up fmt for nvcc

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/contract.h"
#include "ops/cuda/causal_conv1d.h"
#include "ops/cuda/gated_delta_net.h"
#include "ops/cuda/gated_delta_net_tc.h"
#include "ops/cuda/gated_delta_net_tc_rec.cuh"

namespace {

using moefold::cuda::GdnArgs;
using moefold::cuda::GdnDims;

// Uniform in [lo, hi) from a hash of the index (deterministic, no host-side generation).
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 0x9E3779B1u ^ seed;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    p[i] = __float2bfloat16(lo + (hi - lo) * float(x >> 8) * (1.0f / 16777216.0f));
  }
}

template <class T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  MOEFOLD_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

/// Mean microseconds of one replay of a graph capturing f() on `stream`.
template <class F>
double graph_us(cudaStream_t stream, int reps, F&& f) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  f();
  MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t a, b;
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
  MOEFOLD_CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  MOEFOLD_CUDA_CHECK(cudaEventRecord(b, stream));
  MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1e3 * ms / reps;
}

struct Shape {
  int S, len, Hk, Hv;
};

std::vector<Shape> parse_shapes(const char* spec) {
  std::vector<Shape> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    Shape s{};
    if (std::sscanf(item.c_str(), "%d:%d:%d:%d", &s.S, &s.len, &s.Hk, &s.Hv) == 4 && s.S > 0 && s.len > 0 &&
        s.Hk > 0 && s.Hv % s.Hk == 0)
      out.push_back(s);
    else
      ADD_FAILURE() << "GDN_BENCH: bad shape '" << item << "' (want S:len:Hk:Hv)";
  }
  return out;
}

void bench_shape(const Shape& sh, int reps, bool scalar, cudaStream_t stream) {
  const GdnDims d{sh.Hk, sh.Hv, 128, 128};
  const int64_t rows = int64_t(sh.S) * sh.len;
  const int64_t C = 2LL * d.num_k_heads * d.k_dim + int64_t(d.num_v_heads) * d.v_dim;
  const int64_t se = int64_t(d.num_v_heads) * d.k_dim * d.v_dim;
  auto* qkv = dev_alloc<__nv_bfloat16>(size_t(rows * C));
  auto* x = dev_alloc<__nv_bfloat16>(size_t(rows * C));
  auto* ab = dev_alloc<__nv_bfloat16>(size_t(rows * 2 * d.num_v_heads));
  auto* w = dev_alloc<__nv_bfloat16>(size_t(C * 4));
  auto* conv_state = dev_alloc<__nv_bfloat16>(size_t(sh.S * C * 3));
  auto* out = dev_alloc<__nv_bfloat16>(size_t(rows * d.num_v_heads * d.v_dim));
  auto* pool = dev_alloc<float>(size_t(sh.S * se));
  auto* A_log = dev_alloc<float>(size_t(d.num_v_heads));
  auto* dt_bias = dev_alloc<float>(size_t(d.num_v_heads));
  auto* cu = dev_alloc<int32_t>(size_t(sh.S + 1));
  auto* slots = dev_alloc<int32_t>(size_t(sh.S));
  auto* ns = dev_alloc<int32_t>(1);
  fill_bf16<<<1024, 256, 0, stream>>>(qkv, size_t(rows * C), 1u, -1.f, 1.f);
  fill_bf16<<<1024, 256, 0, stream>>>(x, size_t(rows * C), 2u, -1.f, 1.f);
  fill_bf16<<<1024, 256, 0, stream>>>(ab, size_t(rows * 2 * d.num_v_heads), 3u, -2.f, 2.f);
  fill_bf16<<<64, 256, 0, stream>>>(w, size_t(C * 4), 4u, -0.5f, 0.5f);
  MOEFOLD_CUDA_CHECK(cudaMemsetAsync(conv_state, 0, size_t(sh.S * C * 3) * 2, stream));
  MOEFOLD_CUDA_CHECK(cudaMemsetAsync(pool, 0, size_t(sh.S * se) * 4, stream));
  std::vector<float> al(size_t(d.num_v_heads)), db(size_t(d.num_v_heads));
  for (int h = 0; h < d.num_v_heads; ++h) {
    al[size_t(h)] = -3.0f + 4.0f * float(h) / float(d.num_v_heads);
    db[size_t(h)] = -3.0f + 3.5f * float((h * 7) % d.num_v_heads) / float(d.num_v_heads);
  }
  std::vector<int32_t> cuh(size_t(sh.S + 1)), sl(size_t(sh.S));
  for (int s = 0; s <= sh.S; ++s) cuh[size_t(s)] = s * sh.len;
  for (int s = 0; s < sh.S; ++s) sl[size_t(s)] = s;
  const int32_t nsv = sh.S;
  MOEFOLD_CUDA_CHECK(cudaMemcpy(A_log, al.data(), al.size() * 4, cudaMemcpyHostToDevice));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(dt_bias, db.data(), db.size() * 4, cudaMemcpyHostToDevice));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(cu, cuh.data(), cuh.size() * 4, cudaMemcpyHostToDevice));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(slots, sl.data(), sl.size() * 4, cudaMemcpyHostToDevice));
  MOEFOLD_CUDA_CHECK(cudaMemcpy(ns, &nsv, 4, cudaMemcpyHostToDevice));
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream));

  GdnArgs a{};
  a.q = qkv;
  a.k = qkv + int64_t(d.num_k_heads) * d.k_dim;
  a.v = qkv + 2LL * d.num_k_heads * d.k_dim;
  a.row_stride = C;
  a.a = ab;
  a.b = ab + d.num_v_heads;
  a.ab_stride = 2 * d.num_v_heads;
  a.A_log = A_log;
  a.dt_bias = dt_bias;
  a.state_pool = pool;
  a.state_slots = slots;
  a.num_seqs = ns;
  a.out = out;
  a.max_rows = rows;
  // One eager launch first: the split path's scratch is allocated outside the graph capture.
  moefold::cuda::gdn_chunked_prefill(a, cu, sh.S, nullptr, nullptr, 0, d, stream);
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double gdn_bytes = double(rows) * double(C + 2 * d.num_v_heads + d.num_v_heads * d.v_dim) * 2 +
                           double(sh.S) * double(se) * 8;
  auto report = [&](const char* name, double us, double bytes) {
    std::printf("BENCH kernel=%s seqs=%d len=%d hk=%d hv=%d us=%.2f bytes=%.0f\n", name, sh.S, sh.len, sh.Hk, sh.Hv,
                us, bytes);
    std::fflush(stdout);
  };
  report("gdn_prefill", graph_us(stream, reps, [&] {
           moefold::cuda::gdn_chunked_prefill(a, cu, sh.S, nullptr, nullptr, 0, d, stream);
         }),
         gdn_bytes);
  if (const char* sp = std::getenv("MOEFOLD_GDN_TC_SPLIT"); !(sp && sp[0] == '0')) {
    // The split path's chunk-parallel part alone (chunk numbering + records of every chunk, one window).
    namespace tc = moefold::cuda::detail::gdn_tc;
    const int64_t nch = int64_t(sh.S) * ((sh.len + tc::kC - 1) / tc::kC);
    auto* base = dev_alloc<int32_t>(size_t(sh.S + 1));
    auto* recs = dev_alloc<char>(size_t(nch) * size_t(d.num_v_heads) * tc::Rec::kBytes);
    const int group = d.num_v_heads / d.num_k_heads <= 8 ? d.num_v_heads / d.num_k_heads : 1;
    report("gdn_tc_chunk", graph_us(stream, reps, [&] {
             tc::launch_chunk_base(cu, ns, sh.S, base, stream);
             tc::launch_chunk_records(a, cu, base, sh.S, 0, int(nch), d, group, recs, stream);
           }),
           double(rows) * 2.0 * d.num_k_heads * d.k_dim * 2 + double(nch) * d.num_v_heads * tc::Rec::kBytes);
    cudaFree(base);
    cudaFree(recs);
  }
  if (const char* ph = std::getenv("GDN_BENCH_PHASES"); ph && ph[0] == '1') {
    // One eager launch with per-phase cycle counting: where a chunk's time goes (sum over blocks and chunks).
    namespace det = moefold::cuda::detail;
    det::gdn_prefill_tc_profile(true);
    moefold::cuda::gdn_chunked_prefill(a, cu, sh.S, nullptr, nullptr, 0, d, stream);
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(stream));
    det::gdn_prefill_tc_profile(false);
    unsigned long long cyc[det::kGdnTcPhases];
    det::gdn_prefill_tc_profile_read(cyc);
    // Summed over the column blocks of a head: cycles per (value head, sequence, chunk).
    const double blocks = double(d.num_v_heads) * sh.S, chunks = double((sh.len + 63) / 64);
    const char* split_env = std::getenv("MOEFOLD_GDN_TC_SPLIT");
    const bool split = !(split_env && split_env[0] == '0');
    const char* fused_names[] = {"", "wait", "norm+gates", "A+M", "diag+KS", "offdiag", "R", "TR", "O+state"};
    const char* split_names[] = {"", "wait", "KS+QS+R", "TR", "O+state", "-", "-", "-", "-"};
    const char* const* names = split ? split_names : fused_names;
    double total = 0;
    for (int k = 1; k < det::kGdnTcPhases; ++k) total += double(cyc[k]);
    std::printf("PHASES %s seqs=%d len=%d hk=%d hv=%d cycles_per_head_chunk(all column blocks)=%.0f",
                split ? "state-pass" : "fused", sh.S, sh.len, sh.Hk, sh.Hv, total / (blocks * chunks));
    for (int k = 1; k < det::kGdnTcPhases; ++k)
      if (names[k][0] != '-') std::printf(" %s=%.0f", names[k], double(cyc[k]) / (blocks * chunks));
    std::printf("\n");
    std::fflush(stdout);
  }
  if (scalar) {
    setenv("MOEFOLD_GDN_TC", "0", 1);
    report("gdn_prefill_scalar", graph_us(stream, 1, [&] {
             moefold::cuda::gdn_chunked_prefill(a, cu, sh.S, nullptr, nullptr, 0, d, stream);
           }),
           gdn_bytes);
    unsetenv("MOEFOLD_GDN_TC");
  }
  report("conv1d_prefill", graph_us(stream, reps, [&] {
           moefold::cuda::causal_conv1d_silu_prefill(x, w, cu, slots, ns, int(rows), conv_state, qkv, int(C), 4, stream);
         }),
         double(rows) * double(C) * 4);
  for (void* p : {(void*)qkv, (void*)x, (void*)ab, (void*)w, (void*)conv_state, (void*)out, (void*)pool, (void*)A_log,
                  (void*)dt_bias, (void*)cu, (void*)slots, (void*)ns})
    cudaFree(p);
}

TEST(GdnBench, DISABLED_Prefill) {
  MOEFOLD_REQUIRE_GPU();
  const char* spec = std::getenv("GDN_BENCH");
  const char* reps_s = std::getenv("GDN_BENCH_REPS");
  const char* scalar_s = std::getenv("GDN_BENCH_SCALAR");
  const int reps = reps_s ? std::max(1, std::atoi(reps_s)) : 20;
  const bool scalar = scalar_s && scalar_s[0] == '1';
  cudaStream_t stream;
  MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const Shape& sh : parse_shapes(spec ? spec : "1:4096:16:32")) bench_shape(sh, reps, scalar, stream);
  cudaStreamDestroy(stream);
}

}  // namespace
