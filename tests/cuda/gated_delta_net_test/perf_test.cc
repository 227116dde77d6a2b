// gated_delta_net_test: timings (GdnPerf.DISABLED_*, run with --gtest_also_run_disabled_tests).
#include "cuda/gated_delta_net_test/gdn_test_util.h"

namespace gdn_test {
namespace {

// Timings of the real shape (not a contract; run with --gtest_also_run_disabled_tests): median of 20
// launches after 3 warm-ups, CUDA events, inputs random.
template <class F>
double median_us(F&& f) {
  cudaEvent_t a, b;
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    MOEFOLD_CUDA_CHECK(cudaEventRecord(a));
    f();
    MOEFOLD_CUDA_CHECK(cudaEventRecord(b));
    MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

}  // namespace
}  // namespace gdn_test

using namespace gdn_test;  // NOLINT(google-build-using-namespace): the helpers above

TEST(GdnPerf, DISABLED_Timing) {
  MOEFOLD_REQUIRE_GPU();
  const GdnDims d = kReal;
  const int C = int(conv_dim(d));
  for (auto [S, len] : {std::pair{1, 4096}, std::pair{8, 512}, std::pair{64, 1}, std::pair{1, 1}}) {
    const int rows = S * len;
    const Problem P(d, rows, 901);
    const int64_t se = P.state_elems();
    std::vector<int32_t> slots(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) slots[size_t(s)] = s;
    DevProblem dp(P);
    Dev<float> dpool(make_pool(S, se, slots, 902));
    Dev<uint16_t> dout(size_t(rows * P.out_row())), dy(size_t(rows) * C), dconv(size_t(S) * C * (kConvK - 1)),
        dw(to_bf16(moefold::test::randn(size_t(C) * kConvK, 903, 0.5f)));
    dconv.poison();
    MOEFOLD_CUDA_CHECK(cudaMemset(dconv.p, 0, dconv.n * 2));
    Dev<int32_t> dcu(cu_of(std::vector<int>(size_t(S), len))), dslots(slots), dns(std::vector<int32_t>{S});
    const auto args = dp.args(0, dpool.p, dslots.p, dns.p, dout.p);
    const double conv_us = median_us([&] {
      moefold::cuda::causal_conv1d_silu_prefill(dp.qkv.bf(), dw.bf(), dcu.p, dslots.p, dns.p, rows, dconv.bf(), dy.bf(),
                                                C, kConvK, nullptr);
    });
    const double pre_us = median_us(
        [&] { moefold::cuda::gdn_chunked_prefill(args, dcu.p, S, nullptr, nullptr, 0, d, nullptr); });
    double dec_us = 0, cdec_us = 0;
    if (len == 1) {
      dec_us = median_us([&] { moefold::cuda::gdn_recurrent_decode(args, S, d, nullptr); });
      cdec_us = median_us([&] {
        moefold::cuda::causal_conv1d_silu_decode(dp.qkv.bf(), dw.bf(), dslots.p, dns.p, S, dconv.bf(), dy.bf(), C,
                                                 kConvK, nullptr);
      });
    }
    std::printf("TIMING %s seqs=%d len=%d conv_prefill_us=%.1f gdn_prefill_us=%.1f gdn_decode_us=%.1f "
                "conv_decode_us=%.1f\n",
                dims_str(d).c_str(), S, len, conv_us, pre_us, dec_us, cdec_us);
  }
}

// The decode step at the 35B shape (Hk 16, Hv 32, dk = dv = 128: 2 MiB of fp32 state per sequence) for
// 1 .. 256 sequences: the former kernel (A) against the automatic choice (B) in the order A B B A, then
// every variant once. Each timing: a CUDA graph of R launches over R disjoint sets of state slots (R *
// batch * 2 MiB >= 256 MiB, so the states come from HBM, not the L2), median of 20 replays / R. The
// floor: the state read and written once (batch * 4 MiB) at the device-to-device copy rate (read + write)
// measured first in this binary.
TEST(GdnPerf, DISABLED_DecodeVariants) {
  MOEFOLD_REQUIRE_GPU();
  const GdnDims d = kReal;
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreate(&st));
  auto graph_us = [&](cudaGraphExec_t ex, int per) {
    for (int i = 0; i < 3; ++i) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(ex, st));
    cudaEvent_t a, b;
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < 20; ++i) {
      MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
      MOEFOLD_CUDA_CHECK(cudaGraphLaunch(ex, st));
      MOEFOLD_CUDA_CHECK(cudaEventRecord(b, st));
      MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return 1e3 * double(ms[ms.size() / 2]) / per;
  };
  auto capture = [&](const std::function<void()>& body) {
    cudaGraph_t g;
    cudaGraphExec_t ex;
    MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    body();
    MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
    MOEFOLD_CUDA_CHECK(cudaGraphDestroy(g));
    return ex;
  };
  const size_t copy_bytes = size_t(1) << 30;
  float *ca = nullptr, *cb = nullptr;
  MOEFOLD_CUDA_CHECK(cudaMalloc(&ca, copy_bytes));
  MOEFOLD_CUDA_CHECK(cudaMalloc(&cb, copy_bytes));
  // The copy on the stream (not a graph node, which runs on the copy engines at ~2.7 TB/s on the H200):
  // the profiler's roofline method, bytes read + written.
  std::vector<float> cms;
  {
    cudaEvent_t a, b;
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 12; ++i) {
      MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice, st));
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
  const double copy_gbs = 2.0 * double(copy_bytes) / (double(cms[cms.size() / 2]) * 1e-3) / 1e9;
  cudaFree(ca);
  cudaFree(cb);
  moefold::test::perf_line("device_copy", "bytes=1GiB", 2.0 * double(copy_bytes) / copy_gbs / 1e3,
                           "GB/s=" + std::to_string(int(copy_gbs)));
  const int64_t se = int64_t(d.num_v_heads) * d.k_dim * d.v_dim;
  for (int S : {1, 2, 8, 16, 64, 256}) {
    const int R = std::max(1, int((int64_t(256) << 20) / (int64_t(S) * se * 4)));
    const Problem P(d, S, 961);
    DevProblem dp(P);
    Dev<float> dpool(size_t(int64_t(R) * S * se));
    MOEFOLD_CUDA_CHECK(cudaMemset(dpool.p, 0, dpool.n * sizeof(float)));
    std::vector<std::unique_ptr<Dev<int32_t>>> dslots;
    for (int r = 0; r < R; ++r) {
      std::vector<int32_t> sl(static_cast<size_t>(S));
      for (int s = 0; s < S; ++s) sl[size_t(s)] = r * S + s;
      dslots.push_back(std::make_unique<Dev<int32_t>>(sl));
    }
    Dev<int32_t> dns(std::vector<int32_t>{S});
    Dev<uint16_t> dout(size_t(S * P.out_row()));
    const double floor_us = double(S) * se * 4 * 2 / copy_gbs / 1e3;
    const int autov = moefold::cuda::detail::gdn_decode_auto_cols(S, d);
    std::vector<std::pair<int, std::string>> runs{{0, "A"}, {-1, "B"}, {-1, "B"}, {0, "A"}, {1, ""}, {2, ""}, {4, ""}};
    for (const auto& [v, tag] : runs) {
      cudaGraphExec_t ex = capture([&] {
        for (int r = 0; r < R; ++r)
          moefold::cuda::detail::gdn_recurrent_decode_variant(dp.args(0, dpool.p, dslots[size_t(r)]->p, dns.p, dout.p), S,
                                                              d, v, st);
      });
      const double us = graph_us(ex, R);
      cudaGraphExecDestroy(ex);
      const std::string name = v == 0 ? "gdn_decode:former" : (v < 0 ? "gdn_decode:auto" : "gdn_decode:cpl" + std::to_string(v));
      char shp[128], met[128];
      std::snprintf(shp, sizeof shp, "%s,seqs=%d,launches=%d%s%s,auto_cpl=%d", dims_str(d).c_str(), S, R,
                    tag.empty() ? "" : ",", tag.c_str(), autov);
      std::snprintf(met, sizeof met, "GB/s=%.0f copy_frac=%.2f floor_us=%.2f",
                    double(S) * se * 8 / (us * 1e-6) / 1e9, floor_us / us, floor_us);
      moefold::test::perf_line(name, shp, us, met);
    }
  }
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

// The causal conv1d prefill at the 35B shape (C = 8192, K = 4; x read in place from the fused
// projection's row of 12,352 bf16 as the CUDA executor does) for 1 x 32768, 8 x 4096 and 64 x 512 tokens:
// the vectorised kernel (A) against the row-tile one at 8 rows per thread (B) in the order A B B A, then
// the row-tile one at 4 and 16 rows and the scalar kernel once. The floor per call: x read and y written
// (rows x C bf16 each), the state read and written (seqs x C x 3 bf16 each), w (C x 4 bf16): 1.074 GB at
// 1 x 32768; each PERF line gives that byte count over the median time (20 launches after 3 warm-ups,
// CUDA events) and its fraction of the device-to-device copy rate (read + write) measured first in this
// binary (the profiler's roofline method). The goal: >= 0.70 of copy.
TEST(GdnPerf, DISABLED_ConvPrefill) {
  MOEFOLD_REQUIRE_GPU();
  const int C = int(conv_dim(kReal)), W = C + 4096 + 64;
  const size_t copy_bytes = size_t(1) << 30;
  double copy_gbs = 0;
  {
    Dev<uint8_t> ca(copy_bytes), cb(copy_bytes);
    const double us = median_us(
        [&] { MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(cb.p, ca.p, copy_bytes, cudaMemcpyDeviceToDevice, nullptr)); });
    copy_gbs = 2.0 * double(copy_bytes) / (us * 1e-6) / 1e9;
    moefold::test::perf_line("device_copy", "bytes=1GiB", us, "GB/s=" + std::to_string(int(copy_gbs)));
  }
  const int max_rows = 32768;
  // x: a random bf16 block tiled over the [max_rows, W] buffer (the values do not change the work).
  std::vector<uint16_t> xh(size_t(max_rows) * W);
  {
    const auto blk = to_bf16(moefold::test::randn(size_t(1) << 20, 981));
    for (size_t i = 0; i < xh.size(); ++i) xh[i] = blk[(i * 7919) % blk.size()];
  }
  Dev<uint16_t> dx(xh), dy(size_t(max_rows) * C), dw(to_bf16(moefold::test::randn(size_t(C) * kConvK, 982, 0.5f)));
  xh = {};
  for (auto [S, len] : {std::pair{1, 32768}, std::pair{8, 4096}, std::pair{64, 512}}) {
    const int rows = S * len;
    std::vector<int32_t> slots(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) slots[size_t(s)] = s;
    Dev<uint16_t> dst(size_t(S) * C * (kConvK - 1));
    MOEFOLD_CUDA_CHECK(cudaMemset(dst.p, 0, dst.n * 2));
    Dev<int32_t> dcu(cu_of(std::vector<int>(size_t(S), len))), dslots(slots), dns(std::vector<int32_t>{S});
    const double bytes = double(rows) * C * 2 * 2 + double(S) * C * (kConvK - 1) * 2 * 2 + double(C) * kConvK * 2;
    const double floor_us = bytes / copy_gbs / 1e3;
    struct Run {
      const char *mode, *rows, *tag;
    };
    for (const Run run : {Run{"vec", "8", ",A"}, Run{"tile", "8", ",B"}, Run{"tile", "8", ",B"}, Run{"vec", "8", ",A"},
                          Run{"tile", "4", ""}, Run{"tile", "16", ""}, Run{"scalar", "8", ""}}) {
      ScopedEnv e0("MOEFOLD_CONV_PREFILL", run.mode), e1("MOEFOLD_CONV_TILE_ROWS", run.rows);
      const std::string kernel = moefold::cuda::detail::causal_conv1d_prefill_kernel_name(dx.p, dy.p, C, kConvK, W);
      const double us = median_us([&] {
        moefold::cuda::causal_conv1d_silu_prefill(dx.bf(), dw.bf(), dcu.p, dslots.p, dns.p, rows, dst.bf(), dy.bf(), C,
                                                  kConvK, nullptr, W);
      });
      char shp[128], met[128];
      std::snprintf(shp, sizeof shp, "C=%d,K=4,x_stride=%d,seqs=%d,len=%d%s", C, W, S, len, run.tag);
      std::snprintf(met, sizeof met, "GB/s=%.0f copy_frac=%.3f floor_us=%.1f", bytes / (us * 1e-6) / 1e9,
                    floor_us / us, floor_us);
      moefold::test::perf_line("conv1d_prefill:" + kernel, shp, us, met);
    }
  }
}
