// moe_test: MoeBench.RealShape (MOEFOLD_MOE_BENCH=1), MoePerf.DISABLED_DecodeExperts and
// MoePerf.DISABLED_SharedExpertBatch1.
#include "cuda/moe_test/moe_test_util.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/invariant_gemm.h"

namespace moefold::cuda::moe_test {
namespace {

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

/// The device-to-device copy rate on `st` (GB/s, bytes read + written; one PERF line): cudaMemcpyAsync
/// of 1 GiB timed with events, median of 10 after 2 warm-ups (the profiler's roofline method; a memcpy
/// node in a graph runs on the copy engines at ~2.7 TB/s on the H200, below what kernels reach).
double measure_copy_gbs(cudaStream_t st) {
  const size_t copy_bytes = size_t(1) << 30;
  DevBuf ca(copy_bytes), cb(copy_bytes);
  std::vector<float> cms;
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
  std::sort(cms.begin(), cms.end());
  const double t_copy = double(cms[cms.size() / 2]);
  const double copy_gbs = 2.0 * double(copy_bytes) / (t_copy * 1e-3) / 1e9;  // read + write
  test::perf_line("device_copy", "bytes=1GiB", t_copy * 1e3, fmt::format("GB/s={:.0f}", copy_gbs));
  return copy_gbs;
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

  const double copy_gbs = measure_copy_gbs(st);

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

// The batch-1 MoE layer of the 35B shape with its shared expert (Is = I = 512, sigmoid gate, residual):
// A = the separate chain (invariant GEMM gate_up, swiglu_kernel, invariant GEMM down, moe_forward:
// 8 launches), B = moe_forward_shared (5 launches), C = B on the wide streaming configuration (5 warps
// a CTA), in the order A B C C B A; then N = the layer without a shared expert (moe_forward only: the
// floor the fused layer approaches) and Nw = N wide. Each CUDA graph runs 8 layers, each with its own x
// and its own copy of the shared weights (4 graphs rotated: 32 copies, 200 MB, so no L2 reuse), median
// of 100 replays / 8 = us per layer; GB/s of the weights read (the touched experts, the shared expert,
// the router) against the copy measured in this binary. Prints one table last.
TEST(MoePerf, DISABLED_SharedExpertBatch1) {
  MOEFOLD_REQUIRE_GPU();
  const int E = 256, k = 8, H = 2048, I = 512, Is = 512, layers = 8, ngraphs = 4, nl = layers * ngraphs;
  DevBuf wr(size_t(E) * H * 2), gu(size_t(E) * 2 * I * H * 2), dn(size_t(E) * H * I * 2), sg(size_t(H) * 2);
  fill_device(wr, 1, 0.08f), fill_device(gu, 2, 0.04f), fill_device(dn, 3, 0.08f), fill_device(sg, 4, 0.04f);
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreate(&st));
  const double copy_gbs = measure_copy_gbs(st);
  const MoeShape shape{1, E, k, H, I, -1, true};
  ASSERT_TRUE(moe_shared_fusable(shape, Is));
  const size_t ws_bytes = moe_workspace_bytes(shape);
  std::vector<std::unique_ptr<DevBuf>> xs, sgu, sdn, wsb;
  std::vector<MoeWorkspace> ws;
  for (int l = 0; l < nl; ++l) {
    xs.push_back(std::make_unique<DevBuf>(size_t(H) * 2));
    fill_device(*xs.back(), 100 + l, 1.7f);
    sgu.push_back(std::make_unique<DevBuf>(size_t(2) * Is * H * 2));
    fill_device(*sgu.back(), 500 + l, 0.04f);
    sdn.push_back(std::make_unique<DevBuf>(size_t(H) * Is * 2));
    fill_device(*sdn.back(), 900 + l, 0.08f);
    wsb.push_back(std::make_unique<DevBuf>(ws_bytes));
    ws.push_back(moe_workspace_bind(wsb.back()->p, ws_bytes, shape));
  }
  DevBuf h(size_t(H) * 2), gub(size_t(2) * Is * 2), act(size_t(Is) * 2), sout(size_t(H) * 2), rows(4),
      dg_ws(std::max(decode_gemm_workspace_bytes(kDecodeGemmMaxRows, 2 * Is, H),
                     decode_gemm_workspace_bytes(kDecodeGemmMaxRows, H, Is)));
  fill_device(h, 7, 1.0f);
  MOEFOLD_CUDA_CHECK(cudaMemset(dg_ws.p, 0, dg_ws.bytes));
  upload(rows.p, std::vector<int32_t>{1});
  using bf = __nv_bfloat16;
  const int32_t* live = rows.as<int32_t>();
  // One layer l of variant v (0 = A separate, 1 = B fused, 2 = N no shared expert); h += MoE(x).
  auto layer = [&](int v, int l) {
    const bf* x = xs[size_t(l)]->as<bf>();
    if (v == 0) {
      invariant_gemm_bf16(x, sgu[size_t(l)]->as<bf>(), nullptr, gub.as<bf>(), 1, H, 2 * Is, live, dg_ws.p, st);
      swiglu(gub.as<bf>(), act.as<bf>(), 1, Is, live, st);
      invariant_gemm_bf16(act.as<bf>(), sdn[size_t(l)]->as<bf>(), nullptr, sout.as<bf>(), 1, Is, H, live, dg_ws.p, st);
      moe_forward(x, wr.as<bf>(), gu.as<bf>(), dn.as<bf>(), sout.as<bf>(), sg.as<bf>(), h.as<bf>(), live, shape, true,
                  ws[size_t(l)], h.as<bf>(), st);
    } else if (v == 1) {
      const MoeSharedExpert shared{sgu[size_t(l)]->as<bf>(), sdn[size_t(l)]->as<bf>(), Is, act.as<bf>(), sout.as<bf>()};
      moe_forward_shared(x, wr.as<bf>(), gu.as<bf>(), dn.as<bf>(), shared, sg.as<bf>(), h.as<bf>(), live, shape, true,
                         ws[size_t(l)], h.as<bf>(), st);
    } else {
      moe_forward(x, wr.as<bf>(), gu.as<bf>(), dn.as<bf>(), nullptr, nullptr, h.as<bf>(), live, shape, true,
                  ws[size_t(l)], h.as<bf>(), st);
    }
  };
  // Variants: {layer kind, wide streaming configuration}.
  const int kinds[5] = {0, 1, 1, 2, 2};
  const bool wides[5] = {false, false, true, false, true};
  const char* vnames[5] = {"separate", "fused_shared", "fused_shared_wide", "no_shared", "no_shared_wide"};
  std::vector<cudaGraphExec_t> graphs[5];
  for (int v = 0; v < 5; ++v) {
    moe_detail::set_stream_wide(wides[v]);
    layer(kinds[v], 0);  // eager warm-up (kernel attributes) before any capture
    MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int g = 0; g < ngraphs; ++g)
      graphs[v].push_back(capture_graph(st, [&] {
        for (int l = 0; l < layers; ++l) layer(kinds[v], g * layers + l);
      }));
  }
  moe_detail::reset_stream_wide();
  for (auto& g : graphs[0]) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(g, st));  // every layer's plan, for the count
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(st));
  const double experts = mean_touched_experts(ws, E);
  const double routed = experts * 3.0 * I * H * 2, shared_bytes = 3.0 * Is * H * 2, router = double(E) * H * 2;
  struct Row {
    std::string name;
    double us, bytes;
  };
  std::vector<Row> table;
  const int order[8] = {0, 1, 2, 2, 1, 0, 3, 4};
  const char* tags[8] = {"A1", "B1", "C1", "C2", "B2", "A2", "N", "Nw"};
  double sum[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 8; ++i) {
    const int v = order[i];
    const double us = median_graph_ms(graphs[v], st, 100) * 1e3 / layers;
    sum[v] += us;
    const double bytes = routed + router + (kinds[v] == 2 ? 0.0 : shared_bytes);
    table.push_back({std::string(tags[i]) + " " + vnames[v], us, bytes});
    const double gbs = bytes / (us * 1e-6) / 1e9;
    test::perf_line(std::string("moe_layer_b1:") + vnames[v],
                    fmt::format("E={},k={},H={},I={},Is={},experts={:.1f},{}", E, k, H, I, Is, experts, tags[i]), us,
                    fmt::format("GB/s={:.0f} copy_frac={:.2f}", gbs, gbs / copy_gbs));
  }
  for (int v = 0; v < 5; ++v)
    for (auto& g : graphs[v]) cudaGraphExecDestroy(g);
  std::printf("\nbatch-1 MoE layer, 35B shape + shared expert (us per layer, graphs of %d layers; copy %.0f GB/s)\n",
              layers, copy_gbs);
  std::printf("| variant | us/layer | GB/s | of copy |\n|---|---|---|---|\n");
  for (const Row& r : table) {
    const double gbs = r.bytes / (r.us * 1e-6) / 1e9;
    std::printf("| %s | %.2f | %.0f | %.2f |\n", r.name.c_str(), r.us, gbs, gbs / copy_gbs);
  }
  std::printf("fused saves %.2f us a layer (A - B means), wide fused %.2f (A - C); wide routed-only %+.2f (N - Nw)\n",
              (sum[0] - sum[1]) / 2, (sum[0] - sum[2]) / 2, sum[3] - sum[4]);
  std::fflush(stdout);
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace moefold::cuda::moe_test
