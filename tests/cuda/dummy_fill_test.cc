// Dummy weights generated on the GPU equal the host DummySource's, bit for bit after bf16 rounding:
// the fill kernel against dummy_value on the host, and a whole executor loaded with device-side dummy
// weights against one loaded with host-side dummy weights (same logits, bit for bit).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "fixture_util.h"
#include "models/cuda/cuda_executor.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dummy_fill.h"
#include "runtime/model_runner.h"

using namespace moefold;
namespace fs = std::filesystem;

namespace {

// The sanitizers' case (scripts/gpu/run_tests.sh runs *Small* tests under compute-sanitizer).
TEST(DummyFill, SmallFill) {
  MOEFOLD_REQUIRE_GPU();
  const DummyRecipe r{42, 0.5f};
  cuda::DeviceBuffer<__nv_bfloat16> d(1000 + 8);
  d.fill_bytes(0xFF);
  cuda::dummy_fill_bf16(r, d.data(), 1000, nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = test::host_bits(d);
  size_t mismatches = 0;
  for (int64_t i = 0; i < 1000; ++i) mismatches += got[size_t(i)] != f32_to_bf16(dummy_value(r, i));
  for (size_t i = 1000; i < got.size(); ++i) mismatches += got[i] != 0xFFFF;
  EXPECT_TRUE(test::contract_exact("dummy_fill_bf16", "n=1000,small", mismatches));
}

TEST(DummyFill, MatchesHostValues) {
  MOEFOLD_REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(65537), int64_t(3) << 22}) {
    for (DummyRecipe r : {DummyRecipe{0x1234, 0.0383f}, DummyRecipe{~0ull, 1.7320508f}}) {
      cuda::DeviceBuffer<__nv_bfloat16> d(size_t(n) + 8);
      d.fill_bytes(0xFF);  // poison, including 8 elements past the end
      cuda::dummy_fill_bf16(r, d.data(), n, nullptr);
      MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = test::host_bits(d);
      size_t mismatches = 0;
      for (int64_t i = 0; i < n; ++i) mismatches += got[size_t(i)] != f32_to_bf16(dummy_value(r, i));
      for (size_t i = size_t(n); i < got.size(); ++i) mismatches += got[i] != 0xFFFF;  // nothing past n written
      EXPECT_TRUE(test::contract_exact("dummy_fill_bf16", "n=" + std::to_string(n), mismatches));
    }
  }
}

// A hybrid MoE config large enough that every deferrable role is deferred (embedding, lm_head,
// projections, router, experts all above kDeferMinElements).
TEST(DummyFill, ExecutorLogitsEqualHostDummy) {
  MOEFOLD_REQUIRE_GPU();
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(test::kFixtures / "qwen3_5_moe" / "config.json"));
  auto& t = cfg["text_config"];
  t["hidden_size"] = 512;
  t["num_experts"] = 256;
  t["num_experts_per_tok"] = 8;
  const fs::path dir = fs::temp_directory_path() / ("moefold_dummy_fill_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  auto logits = [&](bool on_device) {
    CudaExecutorOptions o;
    o.num_blocks = 16;
    o.num_slots = 1;
    o.max_rows = 64;
    o.dummy_on_device = on_device;
    ModelRunner r(make_cuda_executor(dir.string(), LoadFormat::Dummy, 7, o), {16, 16, 1});
    std::vector<int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};
    int32_t s = r.add_sequence(ids);
    return r.step({{s, int32_t(ids.size()), true}})[0];
  };
  const std::vector<float> dev = logits(true), host = logits(false);
  size_t mismatches = dev.size() == host.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(dev.size(), host.size()); ++i) mismatches += dev[i] != host[i] || !std::isfinite(dev[i]);
  EXPECT_TRUE(test::contract_exact("executor_dummy_on_device_vs_host", "qwen3_5_moe,H=512,E=256,T=10", mismatches));
  fs::remove_all(dir);
}

}  // namespace
