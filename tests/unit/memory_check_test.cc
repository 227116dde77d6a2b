// The memory check before loading (issue 11, item 10): a model bigger than the memory left fails with
// both numbers instead of being killed by the kernel. No test allocates the memory it talks about.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "fixture_util.h"
#include "core/error.h"
#include "io/model_config.h"
#include "models/load_model.h"
#include "models/memory_check.h"
#include "runtime/executor.h"

using namespace moefold;
using json = nlohmann::json;

namespace {

const char* kMeminfo = "MemTotal:       131072000 kB\nMemFree:         1000000 kB\nMemAvailable:   100000000 kB\n";

TEST(MemoryCheck, ReadsMemAvailableAndTheCgroupLimit) {
  EXPECT_EQ(available_memory_bytes(kMeminfo, "", ""), int64_t(100000000) * 1024);
  EXPECT_EQ(available_memory_bytes(kMeminfo, "max\n", "123\n"), int64_t(100000000) * 1024);
  // A cgroup limit of 8 GiB with 2 GiB used leaves 6 GiB, below MemAvailable.
  EXPECT_EQ(available_memory_bytes(kMeminfo, "8589934592\n", "2147483648\n"), int64_t(6) << 30);
  // cgroup v1's "no limit" value.
  EXPECT_EQ(available_memory_bytes(kMeminfo, "9223372036854771712\n", "5\n"), int64_t(100000000) * 1024);
  EXPECT_EQ(available_memory_bytes("garbage", "", ""), std::nullopt);
  EXPECT_TRUE(available_memory_bytes().has_value());  // this machine has /proc/meminfo
}

TEST(MemoryCheck, The35BShapeDoesNotFitInLessThanItsWeights) {
  std::ifstream f(moefold::test::kSourceDir.string() + "/fuzz/corpus/config/qwen3_6_35b_a3b.json");
  ModelConfig c = ModelConfig::from_json(json::parse(f));
  const int64_t need = cpu_weight_bytes(c);
  EXPECT_GT(need, int64_t(125) << 30);  // ~35e9 parameters x 4 bytes = 139 GB
  const int64_t avail = int64_t(120) << 30;
  try {
    check_memory_fits(need, avail, "model 'x' (qwen3_5_moe fp32 weights)");
    FAIL() << "a " << need << "-byte model fit in " << avail << " bytes";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("model 'x' (qwen3_5_moe fp32 weights) needs 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(need) + " bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("only 120.0 GiB (" + std::to_string(avail) + " bytes)"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(check_memory_fits(need, need, "x"));
  EXPECT_NO_THROW(check_memory_fits(need, std::nullopt, "x"));
}

TEST(MemoryCheck, ACpuOnlyFamilyIsNotToldToUseTheGpu) {
  try {
    check_memory_fits(int64_t(2) << 30, int64_t(1) << 30, "model 'v4'", /*gpu_runs_it=*/false);
    FAIL() << "2 GiB fit in 1 GiB";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find("--device cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find("CPU backend only"), std::string::npos) << msg;
  }
}

TEST(MemoryCheck, CacheBytesFollowTheConfig) {
  std::ifstream f(moefold::test::kSourceDir.string() + "/tests/fixtures/qwen3_5_moe_text/config.json");
  ModelConfig c = ModelConfig::from_json(json::parse(f));
  EXPECT_EQ(cpu_cache_bytes(c, 10, 16, 3), 10 * 16 * c.kv_bytes_per_token(4) + 3 * c.deltanet_state_bytes_per_seq(4));
  EXPECT_THROW(check_memory_fits(cpu_cache_bytes(c, 1 << 20, 1 << 10, 1), int64_t(1) << 30, "kv"), Error);
}

TEST(MemoryCheck, TheCpuExecutorRefusesAKvCacheBiggerThanMemory) {
  auto model = load_model(moefold::test::kSourceDir.string() + "/tests/fixtures/qwen3_5_moe_text", LoadFormat::Dummy);
  try {
    make_cpu_executor(*model, 1 << 30, 1 << 10, 1);  // 2^40 token slots: far beyond any machine
    FAIL() << "a 2^40-token KV cache was accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("the CPU KV cache (1073741824 blocks of 1024 tokens, fp32)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("of memory is available"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(make_cpu_executor(*model, 4, 16, 1));
}

}  // namespace
