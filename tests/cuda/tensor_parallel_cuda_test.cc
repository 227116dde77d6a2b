// Tensor and expert parallelism on the CUDA backend (models/cuda/cuda_tp_executor.h), testable on ONE
// GPU: the ranks run on GPU 0 over the single-device communicator (parallel/device_communicator.h).
//  - DeviceCommunicator*: its collectives give the CPU communicator's bits (rank-order sums).
//  - CudaTensorParallel*: per fixture family (hybrid Qwen3.5-MoE, Qwen3-MoE, dense Qwen3) and layout
//    (TP 2 / 4; MoE families also EP 2 / 4 and TP 4 x EP 2), a prompt's logits and 8 teacher-forced
//    decode steps (the tokens of the fp32 CPU at TP 1, whose routing every other run replays): the
//    sharded GPU within bf16 tolerance of the sharded CPU and of the GPU at TP 1, greedy tokens equal
//    to the GPU at TP 1 wherever its top-two margin exceeds 0.1, and a second sharded GPU run bitwise
//    equal to the first (the rank-order reductions are deterministic).
// The GPU at TP N is not bitwise the GPU at TP 1: each row-parallel block (o_proj, out_proj, the MLP's
// down, the MoE) rounds every rank's partial to bf16 (the MoE's stays fp32) and sums the ranks in fp32,
// where TP 1 rounds one full dot product; the column-parallel GEMMs have fewer output rows, which may
// change the decode GEMM's split; expert parallel keeps each expert's bits but sums the ranks' combines.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "cuda/contract.h"
#include "models/cuda/cuda_executor.h"
#include "models/cuda/cuda_tp_executor.h"
#include "models/load_model.h"
#include "parallel/cpu_communicator.h"
#include "parallel/cpu_parallel_executor.h"
#include "parallel/device_communicator.h"
#include "runtime/model_runner.h"
#include "fixture_util.h"
#include "test_util.h"

using namespace moefold;
using json = nlohmann::json;

namespace {

constexpr int32_t kBlocks = 64, kBlockSize = 16, kSeqs = 2;

// ---- the single-device communicator against the CPU one ------------------------------------------

/// fn(rank, comm, stream) on one thread per rank, each rank with its own stream on GPU 0.
void on_device_ranks(DeviceCommGroup& g, const std::function<void(int, Communicator&, cudaStream_t)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < g.world_size(); ++r)
    ts.emplace_back([&, r] {
      cudaSetDevice(0);
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      g.comm(r).set_stream(s);
      fn(r, g.comm(r), s);
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    });
  for (auto& t : ts) t.join();
}

void on_cpu_ranks(CpuCommGroup& g, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < g.world_size(); ++r) ts.emplace_back([&, r] { fn(r, g.comm(r)); });
  for (auto& t : ts) t.join();
}

float* to_dev(const std::vector<float>& h) {
  float* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), h.size() * sizeof(float));
  cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
  return d;
}
std::vector<float> from_dev(const float* d, size_t n) {
  std::vector<float> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  return h;
}
size_t mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t m = 0;
  for (size_t i = 0; i < a.size(); ++i) m += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return m;
}

class DeviceCommunicator : public ::testing::TestWithParam<int> {};

TEST_P(DeviceCommunicator, CollectivesGiveTheCpuCommunicatorsBits) {
  MOEFOLD_REQUIRE_GPU();
  const int N = GetParam();
  const int64_t n = 1000 + 7 * N;  // not a multiple of anything
  std::vector<std::vector<float>> in(static_cast<size_t>(N)), scat(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) {
    in[size_t(r)] = test::randn(size_t(n), 100 + uint64_t(r), 1.0f + float(r));  // magnitudes differ: order matters
    scat[size_t(r)] = test::randn(size_t(N * n), 200 + uint64_t(r));
  }
  // CPU reference.
  std::vector<std::vector<float>> ar(static_cast<size_t>(N)), rs(static_cast<size_t>(N), std::vector<float>(size_t(n)));
  CpuCommGroup cg(N);
  on_cpu_ranks(cg, [&](int r, Communicator& c) {
    ar[size_t(r)] = in[size_t(r)];
    c.all_reduce_sum(ar[size_t(r)].data(), n);
    c.reduce_scatter_sum(scat[size_t(r)].data(), rs[size_t(r)].data(), n);
  });
  // The same on the GPU, three rounds (buffers and events are reused).
  DeviceCommGroup dg(N, 0);
  size_t bad = 0;
  std::mutex mu;
  on_device_ranks(dg, [&](int r, Communicator& c, cudaStream_t s) {
    float* a = to_dev(in[size_t(r)]);
    float* g = to_dev(std::vector<float>(size_t(N * n), NAN));
    float* x = to_dev(scat[size_t(r)]);
    float* y = to_dev(std::vector<float>(size_t(n), NAN));
    size_t my_bad = 0;
    for (int round = 0; round < 3; ++round) {
      cudaMemcpyAsync(a, in[size_t(r)].data(), size_t(n) * 4, cudaMemcpyHostToDevice, s);
      c.all_reduce_sum(a, n);
      c.all_gather(x, g, n);  // x's first n elements (not in): a different input
      c.reduce_scatter_sum(x, y, n);
      cudaStreamSynchronize(s);
      my_bad += mismatches(from_dev(a, size_t(n)), ar[size_t(r)]);
      std::vector<float> want_g(static_cast<size_t>(N * n));
      for (int q = 0; q < N; ++q) std::copy_n(scat[size_t(q)].begin(), n, want_g.begin() + q * n);
      my_bad += mismatches(from_dev(g, size_t(N * n)), want_g);
      my_bad += mismatches(from_dev(y, size_t(n)), rs[size_t(r)]);
    }
    // all_to_all_v: rank r sends r + q + 1 elements to rank q.
    std::vector<int64_t> sc(static_cast<size_t>(N)), so(static_cast<size_t>(N)), rc(static_cast<size_t>(N)), ro(static_cast<size_t>(N));
    int64_t st = 0, rt = 0;
    for (int q = 0; q < N; ++q) {
      sc[size_t(q)] = r + q + 1, so[size_t(q)] = st, st += sc[size_t(q)];
      rc[size_t(q)] = q + r + 1, ro[size_t(q)] = rt, rt += rc[size_t(q)];
    }
    std::vector<float> send(static_cast<size_t>(st));
    for (int64_t i = 0; i < st; ++i) send[size_t(i)] = float(r * 1000 + i);
    float* ds = to_dev(send);
    float* dr = to_dev(std::vector<float>(size_t(rt), NAN));
    c.all_to_all_v(ds, sc, so, dr, rc, ro);
    cudaStreamSynchronize(s);
    const std::vector<float> got = from_dev(dr, size_t(rt));
    for (int q = 0; q < N; ++q) {
      int64_t q_off = 0;  // where rank q's block for r starts in q's send buffer
      for (int p = 0; p < r; ++p) q_off += q + p + 1;
      for (int64_t i = 0; i < rc[size_t(q)]; ++i) my_bad += got[size_t(ro[size_t(q)] + i)] != float(q * 1000 + q_off + i);
    }
    c.barrier();
    for (float* p : {a, g, x, y, ds, dr}) cudaFree(p);
    std::lock_guard<std::mutex> lock(mu);
    bad += my_bad;
  });
  EXPECT_TRUE(test::contract_exact("device_communicator_vs_cpu_bits", "ranks=" + std::to_string(N), bad));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceCommunicator, ::testing::Values(1, 2, 4));

TEST(DeviceCommunicatorSmall, AbortReleasesTheOtherRanks) {
  MOEFOLD_REQUIRE_GPU();
  DeviceCommGroup g(2, 0);
  std::string seen;
  on_device_ranks(g, [&](int r, Communicator& c, cudaStream_t) {
    if (r == 1) return g.abort("rank 1 failed");
    float* d = to_dev(std::vector<float>(4, 1.0f));
    try {
      c.all_reduce_sum(d, 4);
    } catch (const Error& e) {
      seen = e.what();
    }
    cudaFree(d);
  });
  EXPECT_NE(seen.find("rank 1 failed"), std::string::npos) << seen;
}

// ---- the sharded forward -------------------------------------------------------------------------

struct Layout {
  std::string name;
  ParallelConfig p;
};

std::vector<std::pair<std::string, Layout>> cases() {
  std::vector<std::pair<std::string, Layout>> out;
  for (const std::string fam : {"qwen3_5_moe", "qwen3_moe", "qwen3"}) {
    out.push_back({fam, {"tp2", {2, false, 0}}});
    out.push_back({fam, {"tp4", {4, false, 0}}});
    if (fam == "qwen3") continue;
    out.push_back({fam, {"tp2_ep2", {2, true, 0}}});
    out.push_back({fam, {"tp4_ep4", {4, true, 0}}});
    out.push_back({fam, {"tp4_ep2", {4, true, 2}}});
  }
  return out;
}

const Model& fixture_model(const std::string& fam) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[fam];
  if (!m) m = load_model((test::kFixtures / fam).string(), LoadFormat::Safetensors);
  return *m;
}

CudaExecutorOptions gpu_options() {
  CudaExecutorOptions o;
  o.num_blocks = kBlocks;
  o.block_size = kBlockSize;
  o.num_slots = kSeqs;
  o.max_rows = 256;
  o.max_logits_rows = 256;
  o.enforce_eager = true;  // replayed routing runs eagerly anyway; the single-device ranks always do
  return o;
}

std::unique_ptr<ModelRunner> gpu_tp_runner(const Model& m, const ParallelConfig& p) {
  return std::make_unique<ModelRunner>(
      make_cuda_tp_executor(m, p, single_device_tp_group(p.tensor_parallel_size, 0), gpu_options()),
      RunnerOptions{kBlocks, kBlockSize, kSeqs});
}

std::vector<float> last_row(const std::vector<float>& all, int64_t V) { return {all.end() - V, all.end()}; }

float top2_margin(const std::vector<float>& l) {
  std::vector<float> s = l;
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  return s[0] - s[1];
}

class CudaTensorParallel : public ::testing::TestWithParam<std::pair<std::string, Layout>> {};

TEST_P(CudaTensorParallel, ShardedGpuMatchesShardedCpuAndTp1) {
  MOEFOLD_REQUIRE_GPU();
  const auto& [fam, layout] = GetParam();
  const Model& m = fixture_model(fam);
  const int64_t V = m.config().vocab_size;
  const json ref = test::fixture_reference(fam);
  json prompt = ref["prompts"][0];
  for (auto& p : ref["prompts"])
    if (p["ids"].size() > prompt["ids"].size()) prompt = p;
  const auto ids = prompt["ids"].get<std::vector<int32_t>>();
  const int32_t T = int32_t(ids.size());
  const double hf = prompt.contains("transformers_bf16") ? prompt["transformers_bf16"]["rel_err_pinned"].get<double>() : 0.0;
  const double tol = std::max(2e-2, 1.5 * hf);
  const std::string shape = fam + "," + layout.name + ",T=" + std::to_string(T);
  const RunnerOptions ro{kBlocks, kBlockSize, kSeqs};

  // The fp32 CPU at TP 1 picks the tokens and the routing; everyone else replays that routing.
  RoutedExperts routing;
  ModelRunner cpu1(m, ro);
  cpu1.executor().set_routing({nullptr, &routing});
  ModelRunner cpun(make_cpu_parallel_executor(m, layout.p, kBlocks, kBlockSize, kSeqs), ro);
  ModelRunner gpu1(make_cuda_executor((test::kFixtures / fam).string(), LoadFormat::Safetensors, 0, gpu_options()), ro);
  auto gpun = gpu_tp_runner(m, layout.p);
  auto gpun_again = gpu_tp_runner(m, layout.p);
  std::vector<ModelRunner*> replaying = {&cpun, &gpu1, gpun.get(), gpun_again.get()};
  for (ModelRunner* r : replaying) r->executor().set_routing({&routing, nullptr});

  std::vector<int32_t> seq;
  for (ModelRunner* r : {&cpu1, &cpun, &gpu1, gpun.get(), gpun_again.get()}) seq.push_back(r->add_sequence(ids));
  double err_cpu = 0, err_tp1 = 0;
  size_t greedy_bad = 0, compared = 0, nondeterministic = 0;
  std::vector<float> c1;
  for (int step = 0; step <= 8; ++step) {
    const int32_t n = step == 0 ? T : 1;
    std::vector<std::vector<float>> out;
    size_t i = 0;
    for (ModelRunner* r : {&cpu1, &cpun, &gpu1, gpun.get(), gpun_again.get()}) out.push_back(r->step({{seq[i++], n, step == 0}})[0]);
    c1 = out[0];
    err_cpu = std::max(err_cpu, test::rel_err(out[3], out[1]));
    err_tp1 = std::max(err_tp1, test::rel_err(out[3], out[2]));
    nondeterministic += mismatches(out[3], out[4]);
    const std::vector<float> g1 = last_row(out[2], V), gn = last_row(out[3], V);
    if (top2_margin(g1) > 0.1f) {
      ++compared;
      greedy_bad += test::argmax(g1.data(), V) != test::argmax(gn.data(), V);
    }
    const int32_t next = test::argmax(last_row(c1, V).data(), V);
    i = 0;
    for (ModelRunner* r : {&cpu1, &cpun, &gpu1, gpun.get(), gpun_again.get()}) r->append_token(seq[i++], next);
  }
  EXPECT_TRUE(test::contract("tp_cuda_logits_vs_cpu_sharded_pinned", shape, err_cpu, tol));
  EXPECT_TRUE(test::contract("tp_cuda_logits_vs_cuda_tp1_pinned", shape, err_tp1, tol));
  EXPECT_TRUE(test::contract_exact("tp_cuda_rerun_bitwise", shape, nondeterministic));
  EXPECT_TRUE(test::contract_exact("tp_cuda_greedy_vs_cuda_tp1", shape + ",compared=" + std::to_string(compared),
                                   greedy_bad));
}

std::string case_name(const ::testing::TestParamInfo<std::pair<std::string, Layout>>& info) {
  return info.param.first + "_" + info.param.second.name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTensorParallel, ::testing::ValuesIn(cases()), case_name);

// Two sequences in one step (prefill of one while the other decodes, then both decoding): the sharded
// GPU's rows equal each sequence run alone, bitwise (every kernel and collective is row-independent).
TEST(CudaTensorParallelSmall, BatchedRowsEqualAloneBitwise) {
  MOEFOLD_REQUIRE_GPU();
  const Model& m = fixture_model("qwen3_5_moe");
  const ParallelConfig p{2, true, 0};
  const std::vector<int32_t> a = {1, 7, 42, 99, 3, 120, 17, 5}, b = {4, 8, 15, 16, 23};
  auto alone = [&](const std::vector<int32_t>& ids) {
    auto r = gpu_tp_runner(m, p);
    const int32_t s = r->add_sequence(ids);
    std::vector<float> out = r->step({{s, int32_t(ids.size()), false}})[0];
    r->append_token(s, 9);
    auto d = r->step({{s, 1, false}})[0];
    out.insert(out.end(), d.begin(), d.end());
    return out;
  };
  const std::vector<float> la = alone(a), lb = alone(b);
  auto r = gpu_tp_runner(m, p);
  const int32_t sa = r->add_sequence(a), sb = r->add_sequence(b);
  auto first = r->step({{sa, int32_t(a.size()), false}, {sb, int32_t(b.size()), false}});
  r->append_token(sa, 9);
  r->append_token(sb, 9);
  auto second = r->step({{sa, 1, false}, {sb, 1, false}});
  std::vector<float> ga = first[0], gb = first[1];
  ga.insert(ga.end(), second[0].begin(), second[0].end());
  gb.insert(gb.end(), second[1].begin(), second[1].end());
  EXPECT_TRUE(test::contract_exact("tp_cuda_batched_vs_alone_bitwise", "qwen3_5_moe,tp2_ep2", mismatches(ga, la) + mismatches(gb, lb)));
}

TEST(CudaTensorParallelSmall, Fp8WeightsAndTooFewGpusFailWithAClearError) {
  MOEFOLD_REQUIRE_GPU();
  auto fp8 = load_model((test::kFixtures / "qwen3_5_moe").string(), LoadFormat::Safetensors, 0, Quantization::Fp8);
  std::string msg;
  try {
    make_cuda_tp_executor(*fp8, {2, false, 0}, single_device_tp_group(2, 0), gpu_options());
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("FP8"), std::string::npos) << msg;
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const char* env = std::getenv("MOEFOLD_TP_SINGLE_DEVICE");
  const std::string saved = env ? env : "";
  unsetenv("MOEFOLD_TP_SINGLE_DEVICE");
  msg.clear();
  try {
    make_cuda_tp_executor_from_dir((test::kFixtures / "qwen3").string(), LoadFormat::Safetensors, 0,
                                   {std::min(gpus + 1, 16), false, 0}, gpu_options());
  } catch (const Error& e) {
    msg = e.what();
  }
  if (env) setenv("MOEFOLD_TP_SINGLE_DEVICE", saved.c_str(), 1);
  EXPECT_NE(msg.find("MOEFOLD_TP_SINGLE_DEVICE=1"), std::string::npos) << msg;
}

}  // namespace
