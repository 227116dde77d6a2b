// sampling_test: timings (SamplingPerf.DISABLED_*, run with --gtest_also_run_disabled_tests).
#include "cuda/sampling_test/sampling_test_util.h"

using namespace sampling_test;  // NOLINT(google-build-using-namespace): the helpers above

// ---- timings (run with --gtest_also_run_disabled_tests --gtest_filter='*Perf*') -----------------
TEST(SamplingPerf, DISABLED_Timings) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t V = 248320;
  for (int64_t R : {1, 64}) {
    auto x = make_logits(R, V, 9000);
    auto dx = cuda::to_device(x);
    DeviceBuffer<int32_t> dt(static_cast<size_t>(R));
    double us = time_us([&] { cu::argmax_rows(dx.data(), R, V, 0, dt.data(), nullptr, nullptr, nullptr); });
    perf_line("argmax", fmt::format("rows={},V={}", R, V), us, fmt::format("TB/s={:.2f}", double(R * V) * 4 / us * 1e-6));
    struct P {
      float t;
      int32_t k;
      float p;
      const char* name;
    };
    for (const P& pp : {P{0.8f, 0, 1.0f, "temp"}, P{0.8f, 50, 1.0f, "top_k=50"}, P{0.8f, 0, 0.9f, "top_p=0.9"},
                        P{0.8f, 20, 0.95f, "top_k=20,top_p=0.95"}}) {
      auto dtemp = cuda::to_device(std::vector<float>(size_t(R), pp.t));
      auto dtk = cuda::to_device(std::vector<int32_t>(size_t(R), pp.k));
      auto dtp = cuda::to_device(std::vector<float>(size_t(R), pp.p));
      auto du = cuda::to_device(std::vector<double>(size_t(R), 0.37));
      cu::SampleRowParams sp{dtemp.data(), dtk.data(), dtp.data(), nullptr, du.data()};
      us = time_us([&] { cu::sample_rows(dx.data(), R, V, 0, sp, dt.data(), nullptr, nullptr, nullptr); });
      perf_line("sample", fmt::format("rows={},V={},{}", R, V, pp.name), us, "-");
    }
  }
}

// The whole DeviceSampler call (uploads, kernels, downloads, one synchronisation) per step size.
// The logits are not restored between calls (masking and penalties are idempotent enough for timing).
TEST(SamplingPerf, DISABLED_DeviceSampler) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t V = 248320;
  std::vector<int32_t> mask;
  for (int64_t i = 0; i < 200; ++i) mask.push_back(int32_t(V - 1 - i));
  const std::vector<int32_t> prompt = random_history(V, 1024, 1), output = random_history(V, 256, 2);
  for (int64_t R : {1, 64, 256}) {
    auto dx = cuda::to_device(make_logits(R, V, 9100));
    DeviceSampler ds(R, V);
    struct Case {
      const char* name;
      SamplingParams p;
    };
    SamplingParams greedy;
    greedy.temperature = 0;
    SamplingParams sampled;
    sampled.temperature = 0.8f, sampled.top_k = 50, sampled.top_p = 0.95f, sampled.seed = 1;
    SamplingParams full = sampled;
    full.repetition_penalty = 1.1f, full.frequency_penalty = 0.2f, full.presence_penalty = 0.2f;
    full.logprobs = true, full.top_logprobs = 5;
    for (const Case& c : {Case{"greedy", greedy}, Case{"top_k=50,top_p=0.95", sampled},
                          Case{"+penalties(1024+256),logprobs,top5", full}}) {
      const Sampler s(c.p);
      const std::vector<RowSampling> rows(size_t(R), RowSampling{&s, prompt, output});
      std::vector<SampleResult> out;
      const double us = time_us([&] { ds.sample(dx.data(), rows, mask, out, nullptr); });
      perf_line("device_sampler", fmt::format("rows={},V={},{}", R, V, c.name), us, "-");
    }
  }
}

// The cluster kernel beside the pass-by-pass kernels, in the order A B B A inside this run, with the
// device copy bandwidth measured first (run with --gtest_also_run_disabled_tests
// --gtest_filter='*ClusterVsLegacy*').
TEST(SamplingPerf, DISABLED_ClusterVsLegacy) {
  MOEFOLD_REQUIRE_GPU();
  {
    const size_t bytes = size_t(256) << 20;
    DeviceBuffer<uint8_t> a(bytes), b(bytes);
    const double us = time_us([&] {
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr));
    });
    perf_line("d2d_copy", "bytes=256MiB", us, fmt::format("TB/s={:.2f}(read+write)", 2.0 * double(bytes) / us * 1e-6));
  }
  const int64_t V = 248320;
  std::printf("cluster size %d, %d clusters resident\n", cu::cluster_sampler_size(V),
              cu::cluster_sampler_active_clusters(V));
  auto abba = [](const std::string& name, const std::string& shape, const std::function<void()>& a,
                 const std::function<void()>& b, double bytes) {
    const double a1 = time_us(a), b1 = time_us(b), b2 = time_us(b), a2 = time_us(a);
    perf_line(name + "_legacy", shape, 0.5 * (a1 + a2), fmt::format("A={:.1f},{:.1f}", a1, a2));
    perf_line(name + "_cluster", shape, 0.5 * (b1 + b2),
              fmt::format("B={:.1f},{:.1f} x{:.1f} TB/s={:.2f}", b1, b2, (a1 + a2) / (b1 + b2), bytes / (0.5 * (b1 + b2)) * 1e-6));
  };
  for (int64_t R : {1, 64, 256}) {
    auto dx = cuda::to_device(make_logits(R, V, 9000));
    DeviceBuffer<int32_t> dt(static_cast<size_t>(R));
    const double bytes = double(R * V) * 4;
    abba("argmax", fmt::format("rows={},V={}", R, V),
         [&] { cu::argmax_rows(dx.data(), R, V, 0, dt.data(), nullptr, nullptr, nullptr); },
         [&] { cluster_select(dx.data(), R, V, nullptr, dt.data(), nullptr, nullptr); }, bytes);
    struct P {
      float t;
      int32_t k;
      float p, min_p;
      const char* name;
    };
    for (const P& pp : {P{0.8f, 0, 1.0f, 0.0f, "temp"}, P{0.8f, 50, 1.0f, 0.0f, "top_k=50"},
                        P{0.8f, 0, 0.9f, 0.0f, "top_p=0.9"}, P{0.8f, 20, 0.95f, 0.0f, "top_k=20,top_p=0.95"},
                        P{0.8f, 0, 0.9f, 0.05f, "min_p=0.05,top_p=0.9"}}) {
      auto dtemp = cuda::to_device(std::vector<float>(size_t(R), pp.t));
      auto dtk = cuda::to_device(std::vector<int32_t>(size_t(R), pp.k));
      auto dtp = cuda::to_device(std::vector<float>(size_t(R), pp.p));
      auto dmp = cuda::to_device(std::vector<float>(size_t(R), pp.min_p));
      auto du = cuda::to_device(std::vector<double>(size_t(R), 0.37));
      cu::SampleRowParams sp{dtemp.data(), dtk.data(), dtp.data(), dmp.data(), du.data()};
      abba("sample", fmt::format("rows={},V={},{}", R, V, pp.name),
           [&] { cu::sample_rows(dx.data(), R, V, 0, sp, dt.data(), nullptr, nullptr, nullptr); },
           [&] { cluster_select(dx.data(), R, V, &sp, dt.data(), nullptr, nullptr); }, bytes);
    }
    {  // kernels only, every option: penalties (1024 prompt + 256 output ids per row), logprobs, top-5
      const auto prompt = random_history(V, 1024, 1), output = random_history(V, 256, 2);
      std::map<int32_t, int32_t> cnt;
      for (int32_t t : prompt) cnt[t];
      for (int32_t t : output) ++cnt[t];
      std::vector<int32_t> offsets{0}, toks, counts;
      for (int64_t r = 0; r < R; ++r) {
        for (auto [t, n] : cnt) toks.push_back(t), counts.push_back(n);
        offsets.push_back(int32_t(toks.size()));
      }
      auto doff = cuda::to_device(offsets), dtoks = cuda::to_device(toks), dcnt = cuda::to_device(counts);
      auto drep = cuda::to_device(std::vector<float>(size_t(R), 1.1f));
      auto dfr = cuda::to_device(std::vector<float>(size_t(R), 0.2f));
      auto dpr = cuda::to_device(std::vector<float>(size_t(R), 0.2f));
      DeviceBuffer<float> dsaved(toks.size());
      const cu::PenaltyRows pen{drep.data(), dfr.data(), dpr.data(), doff.data(), dtoks.data(), dcnt.data(), dsaved.data()};
      auto dtemp = cuda::to_device(std::vector<float>(size_t(R), 0.8f));
      auto dtk = cuda::to_device(std::vector<int32_t>(size_t(R), 50));
      auto dtp = cuda::to_device(std::vector<float>(size_t(R), 0.95f));
      auto du = cuda::to_device(std::vector<double>(size_t(R), 0.37));
      auto dn = cuda::to_device(std::vector<int32_t>(size_t(R), 5));
      DeviceBuffer<double> dlse(static_cast<size_t>(R));
      DeviceBuffer<int32_t> dids(size_t(R) * cu::kMaxTopLogprobs);
      DeviceBuffer<float> dtlp(size_t(R) * cu::kMaxTopLogprobs), dlp(static_cast<size_t>(R));
      const cu::SampleRowParams sp{dtemp.data(), dtk.data(), dtp.data(), nullptr, du.data()};
      cu::ClusterSampleArgs ca;
      ca.sample = sp, ca.top_n = dn.data(), ca.lse = dlse.data(), ca.top_ids = dids.data();
      ca.top_logprobs = dtlp.data(), ca.logprob = dlp.data(), ca.penalties = pen, ca.tokens = dt.data();
      abba("sample", fmt::format("rows={},V={},top_k=50,top_p=0.95,+penalties(1024+256),logprobs,top5", R, V),
           [&] {
             cu::raw_logprobs_rows(dx.data(), R, V, 0, dn.data(), dlse.data(), dids.data(), dtlp.data(), nullptr, nullptr);
             cu::apply_penalties_rows(dx.data(), R, V, 0, pen, nullptr, nullptr);
             cu::sample_rows(dx.data(), R, V, 0, sp, dt.data(), nullptr, nullptr, nullptr);
             cu::token_logprobs_rows(dx.data(), R, V, 0, dt.data(), dn.data(), dlse.data(), &pen, dlp.data(), nullptr,
                                     nullptr);
           },
           [&] { cu::sample_rows_cluster(dx.data(), R, V, 0, ca, nullptr, nullptr); }, bytes);
    }
  }
  // The whole DeviceSampler call (uploads, kernels, downloads, one synchronisation).
  std::vector<int32_t> mask;
  for (int64_t i = 0; i < 200; ++i) mask.push_back(int32_t(V - 1 - i));
  const std::vector<int32_t> prompt = random_history(V, 1024, 1), output = random_history(V, 256, 2);
  for (int64_t R : {1, 64, 256}) {
    auto dx = cuda::to_device(make_logits(R, V, 9100));
    DeviceSampler ds(R, V);
    SamplingParams greedy;
    greedy.temperature = 0;
    SamplingParams sampled;
    sampled.temperature = 0.8f, sampled.top_k = 50, sampled.top_p = 0.95f, sampled.seed = 1;
    SamplingParams top_p = sampled;
    top_p.top_k = 0, top_p.top_p = 0.9f;
    SamplingParams full = sampled;
    full.repetition_penalty = 1.1f, full.frequency_penalty = 0.2f, full.presence_penalty = 0.2f;
    full.logprobs = true, full.top_logprobs = 5;
    struct Case {
      const char* name;
      SamplingParams p;
    };
    for (const Case& c : {Case{"greedy", greedy}, Case{"top_k=50,top_p=0.95", sampled}, Case{"top_p=0.9", top_p},
                          Case{"top_k=50,top_p=0.95,+penalties(1024+256),logprobs,top5", full}}) {
      const Sampler s(c.p);
      const std::vector<RowSampling> rows(size_t(R), RowSampling{&s, prompt, output});
      std::vector<SampleResult> out;
      abba("device_sampler", fmt::format("rows={},V={},{}", R, V, c.name),
           [&] {
             ds.set_cluster_kernel(false);
             ds.sample(dx.data(), rows, mask, out, nullptr);
           },
           [&] {
             ds.set_cluster_kernel(true);
             ds.sample(dx.data(), rows, mask, out, nullptr);
           },
           double(R * V) * 4);
    }
  }
}
