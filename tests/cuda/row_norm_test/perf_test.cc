// A/B timings of the norm and RoPE kernels: main's (legacy_kernels.cu, A) against today's (B), order
// A B B A, at 1, 64, 256 and 32768 rows of the Qwen3.6-35B-A3B shapes (hidden 2048, q_norm 16 x 256 in
// the fused q_proj rows, k_norm 2 x 256, DeltaNet output norm 32 x 128, RoPE 16 + 2 heads rot 64).
// Each time is the median over 20 replays of a CUDA graph of n back-to-back launches (PDL edges, as
// in a decode step), divided by n; inputs random (device-generated), never zeros. Prints PERF lines,
// then one table (A, B, A/B, the A-A' and B-B' spread); `_rt2` / `_rt4` rows: B at 2 / 4 rows per thread
// (MOEFOLD_NORM_ROWS_PER_THREAD, from 1024 norm rows on). Run with
//   --gtest_also_run_disabled_tests --gtest_filter='RowNormPerf.*'
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "cuda/row_norm_test/legacy_kernels.h"
#include "cuda/row_norm_test/row_norm_test_util.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/dummy_fill.h"
#include "ops/cuda/gated_rms_norm.h"
#include "ops/cuda/rope.h"

using namespace moefold;
using namespace moefold::test;
using namespace moefold::test::rownorm;

namespace {

using Launch = std::function<void(cudaStream_t)>;

/// Median microseconds per launch of f over `reps` replays of a graph of n launches on stream s.
double graph_us(cudaStream_t s, int n, const Launch& f, int reps = 20) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) f(s);
  MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(ge, s));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    MOEFOLD_CUDA_CHECK(cudaEventRecord(a, s));
    MOEFOLD_CUDA_CHECK(cudaGraphLaunch(ge, s));
    MOEFOLD_CUDA_CHECK(cudaEventRecord(b, s));
    MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
    MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(i)], a, b));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3 / n;
}

struct Row {
  std::string kernel;
  int64_t rows;
  double a, b, spread_a, spread_b, bytes;
};

DeviceBuffer<bf16> rand_dev(size_t n, uint64_t seed, float scale) {
  DeviceBuffer<bf16> d(n);
  cuda::dummy_fill_bf16(DummyRecipe{seed, scale}, d.data(), int64_t(n), nullptr);
  return d;
}

}  // namespace

TEST(RowNormPerf, DISABLED_OldVsNew) {
  MOEFOLD_REQUIRE_GPU();
  cudaStream_t s;
  MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<Row> table;
  // rt: MOEFOLD_NORM_ROWS_PER_THREAD while B is captured (0: unset).
  auto ab = [&](const std::string& kernel, int64_t rows, double bytes, const Launch& a, const Launch& b, int rt = 0) {
    const int n = rows >= 4096 ? 10 : 100;
    auto bt = [&] {
      if (rt) setenv("MOEFOLD_NORM_ROWS_PER_THREAD", std::to_string(rt).c_str(), 1);
      const double t = graph_us(s, n, b);
      unsetenv("MOEFOLD_NORM_ROWS_PER_THREAD");
      return t;
    };
    const double a1 = graph_us(s, n, a), b1 = bt(), b2 = bt(), a2 = graph_us(s, n, a);
    Row r{kernel, rows, (a1 + a2) / 2, (b1 + b2) / 2, std::abs(a1 - a2), std::abs(b1 - b2), bytes};
    perf_line(kernel + "_main", fmt::format("rows={}", rows), r.a, fmt::format("TB/s={:.2f}", bytes / r.a * 1e-6));
    perf_line(kernel + "_new", fmt::format("rows={}", rows), r.b, fmt::format("TB/s={:.2f}", bytes / r.b * 1e-6));
    table.push_back(r);
  };
  const int64_t H = 2048, Hq = 16, Hkv = 2, D = 256, Hv = 32, Dv = 128, kMax = 32768;
  auto h = rand_dev(size_t(kMax * H), 1, 4.0f), y = rand_dev(size_t(kMax * H), 2, 1.0f);
  auto x = rand_dev(size_t(kMax * H), 3, 1.0f), w = rand_dev(size_t(H), 4, 0.5f);
  auto qg = rand_dev(size_t(kMax * Hq * 2 * D), 5, 2.0f), kb = rand_dev(size_t(kMax * Hkv * D), 6, 2.0f);
  auto gx = rand_dev(size_t(kMax * Hv * Dv), 7, 2.0f), gz = rand_dev(size_t(kMax * Hv * Dv), 8, 3.0f);
  auto gy = rand_dev(size_t(kMax * Hv * Dv), 9, 1.0f);
  std::vector<int32_t> pos(static_cast<size_t>(kMax));
  for (int64_t t = 0; t < kMax; ++t) pos[size_t(t)] = int32_t(t);
  auto dpos = cuda::to_device(pos);
  cuda::RopeFreqs freqs(64, cpu::rope_inv_freq(64, 1e7));
  const auto zc = cpu::NormKind::ZeroCentred;
  device_sync();
  for (int64_t T : {1, 64, 256, 32768}) {
    auto live = dev_count(T);
    const int32_t* L = live.data();
    const cuda::HeadRows qr{Hq, 2 * Hq * D, 2 * D}, kr{Hkv};
    for (int rt : {0, 2, 4}) {  // rows per thread: the default (1), 2, 4 (from 1024 norm rows on)
      if (rt && T < 1024) continue;
      const std::string sfx = rt ? fmt::format("_rt{}", rt) : "";
      ab("rms_norm" + sfx, T, double(T * H) * 4, [&](cudaStream_t st) {
        legacy::rms_norm(h.data(), w.data(), x.data(), T, H, 1e-6f, true, L, st);
      }, [&](cudaStream_t st) { cuda::rms_norm(h.data(), w.data(), x.data(), T, H, 1e-6f, zc, L, st); }, rt);
      ab("add_rms_norm" + sfx, T, double(T * H) * 8, [&](cudaStream_t st) {
        legacy::add_rms_norm(h.data(), y.data(), w.data(), x.data(), T, H, 1e-6f, true, L, st);
      }, [&](cudaStream_t st) { cuda::add_rms_norm(h.data(), y.data(), w.data(), x.data(), T, H, 1e-6f, zc, L, st); }, rt);
      ab("q_norm_16x256" + sfx, T, double(T * Hq * D) * 4, [&](cudaStream_t st) {
        legacy::rms_norm(qg.data(), w.data(), qg.data(), T, D, 1e-6f, true, L, st, qr);
      }, [&](cudaStream_t st) { cuda::rms_norm(qg.data(), w.data(), qg.data(), T, D, 1e-6f, zc, L, st, qr); }, rt);
    }
    ab("k_norm_2x256", T, double(T * Hkv * D) * 4, [&](cudaStream_t st) {
      legacy::rms_norm(kb.data(), w.data(), kb.data(), T, D, 1e-6f, true, L, st, kr);
    }, [&](cudaStream_t st) { cuda::rms_norm(kb.data(), w.data(), kb.data(), T, D, 1e-6f, zc, L, st, kr); });
    ab("gated_rms_norm_32x128", T, double(T * Hv * Dv) * 6, [&](cudaStream_t st) {
      legacy::gated_rms_norm(gx.data(), gz.data(), w.data(), gy.data(), T, Hv, Dv, 1e-6f, L, st);
    }, [&](cudaStream_t st) { cuda::gated_rms_norm(gx.data(), gz.data(), w.data(), gy.data(), T, Hv, Dv, 1e-6f, L, st); });
    ab("rope_16+2x256_rot64", T, double(T * (Hq + Hkv) * 64) * 4, [&](cudaStream_t st) {
      legacy::apply_rope(qg.data(), qr, kb.data(), kr, dpos.data(), T, D, freqs, L, st);
    }, [&](cudaStream_t st) { cuda::apply_rope(qg.data(), qr, kb.data(), kr, dpos.data(), T, D, freqs, L, st); });
  }
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
  std::printf("| kernel (A = main, B = new) | rows | A us | B us | A/B | spread A/B us | B TB/s |\n|---|---|---|---|---|---|---|\n");
  for (const Row& r : table)
    std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.2f/%.2f | %.2f |\n", r.kernel.c_str(), (long long)r.rows, r.a, r.b,
                r.a / r.b, r.spread_a, r.spread_b, r.bytes / r.b * 1e-6);
  std::fflush(stdout);
}
