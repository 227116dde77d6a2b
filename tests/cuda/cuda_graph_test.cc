// Decode steps as CUDA graphs (models/cuda/cuda_executor.cc): a graph captured at a bucket and replayed
// with fewer live rows computes exactly what eager execution computes, and each live row's logits are
// bitwise those of the same sequence decoded alone (batch invariance: every kernel's per-row reduction
// order is independent of the rest of the batch and of the bucket). Also: replays count their launches
// in the kernel registry, as eager steps do.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "core/kernel_registry.h"
#include "cuda/contract.h"
#include "models/cuda/cuda_executor.h"
#include "ops/cuda/moe.h"
#include "runtime/model_runner.h"
#include "fixture_util.h"

using namespace moefold;

namespace {

using test::kFixtures;

std::unique_ptr<ModelRunner> runner(const std::string& fam, int32_t slots, bool eager,
                                    std::vector<int32_t> buckets = CudaExecutorOptions::default_cuda_graph_sizes()) {
  CudaExecutorOptions o;
  o.num_blocks = 2048;
  o.block_size = 16;
  o.num_slots = slots;
  o.max_rows = 512;
  o.max_blocks_per_seq = 64;
  o.enforce_eager = eager;
  o.cuda_graph_sizes = std::move(buckets);
  return std::make_unique<ModelRunner>(make_cuda_executor((kFixtures / fam).string(), LoadFormat::Safetensors, 0, o),
                                       RunnerOptions{2048, 16, slots});
}

/// Prompt of sequence i: 3 + (7 i mod 61) tokens, ids from a fixed hash below V.
std::vector<int32_t> prompt_of(int i, int64_t V) {
  std::vector<int32_t> p(size_t(3 + (7 * i) % 61));
  for (size_t t = 0; t < p.size(); ++t) p[t] = int32_t((uint64_t(i) * 1000003u + t * 7919u + 11) % uint64_t(V));
  return p;
}
/// The token fed to sequence i at its k-th decode step (fixed, so the runs compare logits, not sampling).
int32_t token_of(int i, int k, int64_t V) { return int32_t((uint64_t(i) * 131u + uint64_t(k) * 17u + 5) % uint64_t(V)); }

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Decodes `pattern[j]` sequences (the first ones) at step j on `batched` (each sequence prefilled
/// alone first), and the same tokens one sequence per step on `alone`; returns the number of rows whose
/// logits differ in any bit.
size_t live_rows_vs_alone(ModelRunner& batched, ModelRunner& alone, const std::vector<int>& pattern, int64_t V) {
  int nseq = 0;
  for (int n : pattern) nseq = std::max(nseq, n);
  std::vector<int32_t> bs(static_cast<size_t>(nseq)), as(static_cast<size_t>(nseq));
  std::vector<int> decoded(size_t(nseq), 0);
  for (int i = 0; i < nseq; ++i) {
    const auto p = prompt_of(i, V);
    bs[size_t(i)] = batched.add_sequence(p);
    as[size_t(i)] = alone.add_sequence(p);
    batched.step({{bs[size_t(i)], int32_t(p.size()), false}});
    alone.step({{as[size_t(i)], int32_t(p.size()), false}});
  }
  size_t mismatches = 0;
  for (int n : pattern) {
    std::vector<ModelRunner::Work> work;
    for (int i = 0; i < n; ++i) {
      const int32_t tok = token_of(i, decoded[size_t(i)], V);
      batched.append_token(bs[size_t(i)], tok);
      alone.append_token(as[size_t(i)], tok);
      work.push_back({bs[size_t(i)], 1, false});
    }
    auto rows = batched.step(work);
    for (int i = 0; i < n; ++i) {
      auto ref = alone.step({{as[size_t(i)], 1, false}})[0];
      mismatches += !same_bits(rows[size_t(i)], ref);
      ++decoded[size_t(i)];
    }
  }
  return mismatches;
}

class DecodeGraphs : public ::testing::TestWithParam<std::string> {};

// Greedy generation of all fixture prompts together, graphs vs eager: every step's logits bitwise equal.
TEST_P(DecodeGraphs, GraphEqualsEagerBitwise) {
  MOEFOLD_REQUIRE_GPU();
  const std::string fam = GetParam();
  auto ref = test::fixture_reference(fam);
  std::vector<std::vector<int32_t>> prompts;
  for (auto& p : ref["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
  const int32_t n = int32_t(prompts.size());
  auto graph = runner(fam, n, false), eager = runner(fam, n, true);
  const int64_t V = graph->config().vocab_size;
  std::vector<int32_t> gs, es;
  for (auto& p : prompts) {
    gs.push_back(graph->add_sequence(p));
    es.push_back(eager->add_sequence(p));
  }
  std::vector<ModelRunner::Work> gw, ew;
  for (int32_t i = 0; i < n; ++i) {
    gw.push_back({gs[size_t(i)], int32_t(prompts[size_t(i)].size()), false});
    ew.push_back({es[size_t(i)], int32_t(prompts[size_t(i)].size()), false});
  }
  size_t mismatches = 0, compared = 0;
  std::vector<int32_t> live(static_cast<size_t>(n));  // prompt index of each work item
  for (int32_t i = 0; i < n; ++i) live[size_t(i)] = i;
  for (int step = 0; step < 12 && !live.empty(); ++step) {
    auto gl = graph->step(gw);
    auto el = eager->step(ew);
    gw.clear();
    ew.clear();
    std::vector<int32_t> next;
    for (size_t j = 0; j < live.size(); ++j) {
      const int32_t i = live[j];
      mismatches += !same_bits(gl[j], el[j]);
      ++compared;
      const int32_t tok = test::argmax(el[j].data(), V);
      graph->append_token(gs[size_t(i)], tok);
      eager->append_token(es[size_t(i)], tok);
      // Sequences leave one by one, so the live count falls through the buckets.
      if (i < n - step / 3) {
        next.push_back(i);
        gw.push_back({gs[size_t(i)], 1, false});
        ew.push_back({es[size_t(i)], 1, false});
      }
    }
    live = std::move(next);
  }
  EXPECT_TRUE(test::contract_exact("decode_graph_vs_eager", fam + ",rows=" + std::to_string(compared), mismatches));
}

// The live-count sequences: bucket 16 at 1, 2, 3, 7, 15, 16, 3 live rows, bucket 128 around the
// wide expert plan's threshold; each live row bitwise equal to the sequence decoded alone, eagerly.
TEST_P(DecodeGraphs, LiveRowsEqualOneRowEagerRuns) {
  MOEFOLD_REQUIRE_GPU();
  const std::string fam = GetParam();
  {
    auto batched = runner(fam, 16, false, {16});
    auto alone = runner(fam, 16, true);
    const std::vector<int> pattern = {1, 2, 3, 7, 15, 16, 3};
    EXPECT_TRUE(test::contract_exact("decode_graph_live_rows_vs_alone", fam + ",bucket=16",
                                     live_rows_vs_alone(*batched, *alone, pattern, batched->config().vocab_size)));
  }
  {
    auto batched = runner(fam, 128, false, {128});
    auto alone = runner(fam, 128, true);
    const std::vector<int> pattern = {1, 9, 33, 64, 113, 114, 127, 128, 2};
    EXPECT_TRUE(test::contract_exact("decode_graph_live_rows_vs_alone", fam + ",bucket=128",
                                     live_rows_vs_alone(*batched, *alone, pattern, batched->config().vocab_size)));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DecodeGraphs, ::testing::ValuesIn(test::gpu_fixture_families()),
                         [](const auto& info) { return info.param; });

// A graph replay counts the same launches per kernel as the eager step it replaces (so
// --require-kernel and the kernel table's call counts hold with graphs on); small, for the sanitizers.
TEST(DecodeGraphsSmall, ReplayCountsTheEagerLaunches) {
  MOEFOLD_REQUIRE_GPU();
  const std::string fam = "qwen3_5_moe";
  auto graph = runner(fam, 4, false, {4}), eager = runner(fam, 4, true);
  const int64_t V = graph->config().vocab_size;
  auto counts = [] {
    std::map<std::string, int64_t> m;
    for (auto& k : prof::registered_kernels()) m[k.name] = k.launches;
    return m;
  };
  std::map<std::string, int64_t> diffs[2];
  ModelRunner* rs[2] = {graph.get(), eager.get()};
  for (int w = 0; w < 2; ++w) {
    std::vector<ModelRunner::Work> work;
    std::vector<int32_t> ids;
    for (int i = 0; i < 3; ++i) {
      ids.push_back(rs[w]->add_sequence(prompt_of(i, V)));
      rs[w]->step({{ids.back(), int32_t(prompt_of(i, V).size()), false}});
      rs[w]->append_token(ids.back(), token_of(i, 0, V));
      work.push_back({ids.back(), 1, false});
    }
    const auto before = counts();
    rs[w]->step(work);
    for (auto& [name, n] : counts()) {
      const int64_t d = n - (before.count(name) ? before.at(name) : 0);
      if (d) diffs[w][name] = d;
    }
  }
  EXPECT_FALSE(diffs[0].empty());
  size_t mismatches = 0;
  for (auto& [name, n] : diffs[1]) {
    const int64_t g = diffs[0].count(name) ? diffs[0].at(name) : 0;
    if (g != n) {
      ADD_FAILURE() << name << ": eager " << n << " launches, graph replay " << g;
      ++mismatches;
    }
  }
  // The graph's grid covers its KV-length class, so it may run the split-KV combine where this short
  // eager step needed none; nothing else may differ.
  for (auto& [name, n] : diffs[0])
    if (!diffs[1].count(name) && name.find("combine") == std::string::npos) {
      ADD_FAILURE() << name << ": only in the graph (" << n << " launches)";
      ++mismatches;
    }
  EXPECT_TRUE(test::contract_exact("decode_graph_launch_counts", fam, mismatches));
}

// With the fused shared expert (MOEFOLD_MOE_SHARED_STREAM unset or 1) a one-sequence decode step (bucket 1, graph and eager) runs the
// shared expert inside the streaming expert kernels: one moe_stream_kernel:gate_up+shared and one
// :down+shared launch per MoE layer, swiglu_kernel only for dense MLP layers and no plain streaming
// launch (qwen3_5_moe: a shared expert of the routed I). The bits are mixed_step_cuda_test's check. Skips
// when it is switched off (MOEFOLD_MOE_SHARED_STREAM=0).
TEST(DecodeGraphsSmall, SharedExpertFusedAtBucket1) {
  MOEFOLD_REQUIRE_GPU();
  if (!cuda::moe_shared_stream_enabled()) GTEST_SKIP() << "MOEFOLD_MOE_SHARED_STREAM=0";
  const std::string fam = "qwen3_5_moe";
  for (bool eager : {false, true}) {
    auto r = runner(fam, 1, eager, {1});
    const int64_t V = r->config().vocab_size;
    int64_t moe_layers = 0;
    for (bool m : r->config().layer_is_moe) moe_layers += m ? 1 : 0;
    const int64_t dense_layers = int64_t(r->config().layer_is_moe.size()) - moe_layers;  // their MLP's swiglu
    auto counts = [] {
      std::map<std::string, int64_t> m;
      for (auto& k : prof::registered_kernels()) m[k.name] = k.launches;
      return m;
    };
    const int32_t id = r->add_sequence(prompt_of(0, V));
    r->step({{id, int32_t(prompt_of(0, V).size()), false}});
    r->append_token(id, token_of(0, 0, V));
    const auto before = counts();
    r->step({{id, 1, false}});
    const auto after = counts();
    auto diff = [&](const std::string& name) {
      return (after.count(name) ? after.at(name) : 0) - (before.count(name) ? before.at(name) : 0);
    };
    const size_t bad = size_t(diff("moe_stream_kernel:gate_up+shared") != moe_layers) +
                       size_t(diff("moe_stream_kernel:down+shared") != moe_layers) + size_t(diff("swiglu_kernel") != dense_layers) +
                       size_t(diff("moe_stream_kernel:gate_up") != 0);
    EXPECT_GT(moe_layers, 0);
    EXPECT_TRUE(test::contract_exact("decode_shared_expert_fused_launches", fam + (eager ? ",eager" : ",graph"), bad))
        << "gate_up+shared " << diff("moe_stream_kernel:gate_up+shared") << ", swiglu " << diff("swiglu_kernel")
        << ", moe layers " << moe_layers;
  }
}

}  // namespace
