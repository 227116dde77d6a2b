// The sharded CUDA executor over NCCL (models/cuda/cuda_tp_executor.h), one GPU per rank, against the
// same layout over the single-device communicator on GPU 0 and against the sharded CPU backend. Cases
// at 2, 4 and 8 ranks run when the machine has that many GPUs (skipped otherwise). Built with
// -DMOEFOLD_NCCL_TESTS=ON (it links libnccl); NCCL_NVLS_ENABLE=0 (the communicator sets it).
//  - Bitwise: NCCL's ordered all-reduce (all-gather, then the rank-order sum) adds the same partials
//    in the same order as the single-device communicator, and the NCCL executor's decode steps replay
//    CUDA graphs with the collectives captured (the single-device one runs eagerly): greedy decode with
//    production routing must give the same logits bits on both.
//  - Within bf16 tolerance of the sharded CPU, routing pinned to the fp32 CPU's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "fixture_util.h"
#include "models/cuda/cuda_tp_executor.h"
#include "models/load_model.h"
#include "parallel/cpu_parallel_executor.h"
#include "parallel/nccl_communicator.h"
#include "runtime/model_runner.h"
#include "test_util.h"

namespace moefold {
namespace {

constexpr int32_t kBlocks = 64, kBlockSize = 16, kSeqs = 2;

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

CudaExecutorOptions options() {
  CudaExecutorOptions o;
  o.num_blocks = kBlocks;
  o.block_size = kBlockSize;
  o.num_slots = kSeqs;
  o.max_rows = 256;
  o.max_logits_rows = 256;
  return o;
}

CudaTpGroup nccl_group(int N) {
  std::vector<int> devices(static_cast<size_t>(N));
  std::iota(devices.begin(), devices.end(), 0);
  auto comms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(make_nccl_communicators(devices));
  CudaTpGroup g;
  for (auto& c : *comms) g.comms.push_back(c.get());
  g.devices = devices;
  g.owner = comms;
  return g;
}

size_t mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t m = 0;
  for (size_t i = 0; i < a.size(); ++i) m += std::memcmp(&a[i], &b[i], 4) != 0;
  return m;
}

struct Case {
  std::string fam;
  ParallelConfig p;
  std::string name;
};

class NcclTensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(NcclTensorParallel, EqualsSingleDeviceBitwiseAndCpuWithinTolerance) {
  const Case& c = GetParam();
  const int N = c.p.tensor_parallel_size;
  if (gpus() < N) GTEST_SKIP() << N << " ranks need " << N << " GPUs; " << gpus() << " visible";
  auto m = load_model((test::kFixtures / c.fam).string(), LoadFormat::Safetensors);
  const int64_t V = m->config().vocab_size;
  const RunnerOptions ro{kBlocks, kBlockSize, kSeqs};
  const std::vector<int32_t> ids = {1, 7, 42, 99, 3, 120, 17, 5, 64, 11, 23, 88, 2, 9, 31, 77, 15};
  // Production routing, greedy: NCCL (graphs) vs single device (eager), bitwise.
  ModelRunner nccl(make_cuda_tp_executor(*m, c.p, nccl_group(N), options()), ro);
  ModelRunner single(make_cuda_tp_executor(*m, c.p, single_device_tp_group(N, 0), options()), ro);
  const int32_t a = nccl.add_sequence(ids), b = single.add_sequence(ids);
  size_t bad = 0;
  for (int step = 0; step <= 8; ++step) {
    const int32_t n = step == 0 ? int32_t(ids.size()) : 1;
    const auto la = nccl.step({{a, n, step == 0}})[0], lb = single.step({{b, n, step == 0}})[0];
    bad += mismatches(la, lb);
    const int32_t next = test::argmax(la.data() + la.size() - size_t(V), V);
    nccl.append_token(a, next);
    single.append_token(b, next);
  }
  EXPECT_EQ(bad, 0u) << c.name << ": NCCL (graphs) vs single-device (eager) logits bits";
  // Pinned routing: within bf16 tolerance of the sharded CPU.
  RoutedExperts routing;
  ModelRunner cpu1(*m, ro);
  cpu1.executor().set_routing({nullptr, &routing});
  ModelRunner cpun(make_cpu_parallel_executor(*m, c.p, kBlocks, kBlockSize, kSeqs), ro);
  cpun.executor().set_routing({&routing, nullptr});
  ModelRunner gpu(make_cuda_tp_executor(*m, c.p, nccl_group(N), options()), ro);
  gpu.executor().set_routing({&routing, nullptr});
  const int32_t s1 = cpu1.add_sequence(ids), sn = cpun.add_sequence(ids), sg = gpu.add_sequence(ids);
  cpu1.step({{s1, int32_t(ids.size()), true}});
  const auto want = cpun.step({{sn, int32_t(ids.size()), true}})[0];
  const auto got = gpu.step({{sg, int32_t(ids.size()), true}})[0];
  const double err = test::rel_err(got, want);
  std::printf("CONTRACT kernel=tp_nccl_logits_vs_cpu_sharded_pinned shape=%s rel_err=%.3e tol=2.0e-02 verdict=%s\n",
              c.name.c_str(), err, err <= 2e-2 ? "PASS" : "FAIL");
  EXPECT_LE(err, 2e-2) << c.name;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int N : {2, 4, 8}) {
    out.push_back({"qwen3_5_moe", {N, true, 0}, "qwen3_5_moe_tp" + std::to_string(N) + "_ep" + std::to_string(N)});
    if (N <= 4) out.push_back({"qwen3_5_moe", {N, false, 0}, "qwen3_5_moe_tp" + std::to_string(N)});
    if (N <= 4) out.push_back({"qwen3", {N, false, 0}, "qwen3_tp" + std::to_string(N)});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, NcclTensorParallel, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace moefold
