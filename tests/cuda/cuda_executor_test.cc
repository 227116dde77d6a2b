// The whole forward on the GPU against the CPU reference, for every family's fixture (made by
// scripts/make_fixtures.py): logits within bf16 tolerance of transformers' reference, greedy tokens
// equal to the CPU backend's wherever the CPU's top-two margin exceeds 0.1, and on the GPU itself
// chunked prefill equal to whole prefill and batched equal to alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cuda/contract.h"
#include "io/npy.h"
#include "models/cuda/cuda_executor.h"
#include "models/load_model.h"
#include "runtime/model_runner.h"
#include "test_util.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(MOEFOLD_SOURCE_DIR) / "tests" / "fixtures";

std::vector<std::string> families() {
  std::vector<std::string> out;
  if (fs::exists(kFixtures))
    for (auto& e : fs::directory_iterator(kFixtures))
      if (fs::exists(e.path() / "reference.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<ModelRunner> gpu_runner(const std::string& fam, int32_t slots = 8) {
  CudaExecutorOptions o;
  o.num_blocks = 256;
  o.block_size = 16;
  o.num_slots = slots;
  o.max_rows = 2048;
  return std::make_unique<ModelRunner>(make_cuda_executor((kFixtures / fam).string(), LoadFormat::Safetensors, 0, o),
                                       RunnerOptions{256, 16, slots});
}

int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

class CudaForward : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaForward, LogitsMatchReferenceAndGreedyMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  const std::string fam = GetParam();
  std::ifstream f(kFixtures / fam / "reference.json");
  json ref = json::parse(f);
  auto cpu_model = load_model((kFixtures / fam).string(), LoadFormat::Safetensors);
  const int64_t V = cpu_model->config().vocab_size;
  for (auto& p : ref["prompts"]) {
    auto ids = p["ids"].get<std::vector<int32_t>>();
    auto expect = read_npy((kFixtures / fam / p["logits"].get<std::string>()).string());
    auto gpu = gpu_runner(fam);
    int32_t s = gpu->add_sequence(ids);
    auto got = gpu->step({{s, int32_t(ids.size()), true}})[0];
    const std::string shape = fam + ",T=" + std::to_string(ids.size());
    EXPECT_TRUE(test::contract("forward_logits_vs_transformers", shape, test::rel_err(got, expect.data), 2e-2));
    // Greedy decode on both backends from the same prompt; compare while the CPU's margin is clear.
    ModelRunner cpu(*cpu_model, {256, 16, 1});
    int32_t c = cpu.add_sequence(ids);
    auto cl = cpu.step({{c, int32_t(ids.size()), false}})[0];
    std::vector<float> gl(got.end() - V, got.end());
    size_t mismatches = 0, compared = 0;
    for (int i = 0; i < 16; ++i) {
      std::vector<float> sorted = cl;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const int32_t ct = argmax(cl.data(), V), gt = argmax(gl.data(), V);
      if (sorted[0] - sorted[1] > 0.1f) {
        ++compared;
        mismatches += ct != gt;
      }
      if (ct != gt) break;  // the sequences diverge; later steps are not comparable
      cpu.append_token(c, ct);
      gpu->append_token(s, gt);
      cl = cpu.step({{c, 1, false}})[0];
      gl = gpu->step({{s, 1, false}})[0];
    }
    EXPECT_TRUE(test::contract_exact("forward_greedy_vs_cpu", shape + ",compared=" + std::to_string(compared), mismatches));
  }
}

TEST_P(CudaForward, ChunkedPrefillAndBatchingInvariants) {
  MOEFOLD_REQUIRE_GPU();
  const std::string fam = GetParam();
  std::ifstream f(kFixtures / fam / "reference.json");
  json ref = json::parse(f);
  std::vector<int32_t> ids;
  for (auto& p : ref["prompts"])
    if (p["ids"].size() > ids.size()) ids = p["ids"].get<std::vector<int32_t>>();
  const int T = int(ids.size());
  auto whole_r = gpu_runner(fam, 1);
  int32_t w = whole_r->add_sequence(ids);
  auto whole = whole_r->step({{w, T, true}})[0];
  for (int split : {1, 63, 64, 65}) {
    auto r = gpu_runner(fam, 1);
    int32_t q = r->add_sequence(ids);
    auto got = r->step({{q, split, true}})[0];
    for (int pos = split; pos < T;) {
      const int n = pos + 3 <= T && pos % 2 ? 3 : 1;  // mix of small prefill chunks and decode rows
      auto part = r->step({{q, n, true}})[0];
      got.insert(got.end(), part.begin(), part.end());
      pos += n;
    }
    EXPECT_TRUE(test::contract("forward_chunked_vs_whole", fam + ",split=" + std::to_string(split),
                               test::rel_err(got, whole), 2e-2));
  }
  // All prompts together vs each alone: greedy tokens equal.
  std::vector<std::vector<int32_t>> prompts;
  for (auto& p : ref["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
  const int64_t V = 0 + whole.size() / size_t(T);
  auto run = [&](ModelRunner& r, const std::vector<size_t>& which) {
    std::map<size_t, std::vector<int32_t>> out;
    std::map<size_t, int32_t> sid;
    std::vector<ModelRunner::Work> work;
    for (size_t i : which) {
      sid[i] = r.add_sequence(prompts[i]);
      work.push_back({sid[i], int32_t(prompts[i].size()), false});
    }
    for (int g = 0; g < 8; ++g) {
      auto logits = r.step(work);
      work.clear();
      for (size_t k = 0; k < which.size(); ++k) {
        out[which[k]].push_back(argmax(logits[k].data(), V));
        r.append_token(sid[which[k]], out[which[k]].back());
        work.push_back({sid[which[k]], 1, false});
      }
    }
    return out;
  };
  std::vector<size_t> all;
  for (size_t i = 0; i < prompts.size(); ++i) all.push_back(i);
  auto together_r = gpu_runner(fam, int32_t(prompts.size()));
  auto together = run(*together_r, all);
  size_t mismatches = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone_r = gpu_runner(fam, 1);
    mismatches += run(*alone_r, {i})[i] != together[i];
  }
  EXPECT_TRUE(test::contract_exact("forward_batched_vs_alone", fam, mismatches));
}

INSTANTIATE_TEST_SUITE_P(Families, CudaForward, ::testing::ValuesIn(families()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaForward);

}  // namespace
