// Host cost of grammar-constrained decoding per decode step, printed as a table: filling the next-token
// bitmask (xgrammar) for every constrained row of a step, sequentially as the scheduler's worker thread
// does (fill_next_token_bitmasks: one thread, and the default thread count for batch 64), and applying it to fp32 logits on the CPU (apply_token_bitmask), at batch 1 and 64, for the real
// SmolLM2 tokenizer (49,152 ids) and a JSON schema, any JSON object, and a regex. Rows follow random
// walks over their allowed tokens (seeded), so the states are varied and the numbers are per step
// averaged over 64 steps. The smoke test runs one short configuration in CI; the full table is
//   build/tests/grammar_mask_bench_test --gtest_also_run_disabled_tests --gtest_filter='*Table*'
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "fixture_util.h"
#include "runtime/grammar_constraint.h"
#include "runtime/sampler.h"
#include "text/tokenizer.h"

using namespace moefold;

namespace {

struct Result {
  double fill_us_per_step = 0;   // all rows' bitmasks of one step
  double apply_us_per_step = 0;  // all rows' CPU masked-logits step
};

Result run(const GrammarCompiler& gc, const ConstraintSpec& spec, int batch, int steps, int threads) {
  const int64_t V = gc.vocab_size(), W = bitmask_words(V);
  const auto compiled = gc.compile(spec);
  std::vector<GrammarMatcher> rows;
  for (int b = 0; b < batch; ++b) rows.emplace_back(compiled);
  std::vector<GrammarMatcher*> ptrs;
  for (auto& r : rows) ptrs.push_back(&r);
  std::vector<uint32_t> masks(size_t(batch * W));
  std::vector<float> logits(size_t(V), 0.5f);
  std::vector<int32_t> allowed;
  double fill = 0, apply = 0;
  using clock = std::chrono::steady_clock;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = clock::now();
    fill_next_token_bitmasks(ptrs, masks, threads);  // what the scheduler's mask worker runs
    const auto t1 = clock::now();
    for (int b = 0; b < batch; ++b) apply_token_bitmask(logits, {masks.data() + size_t(b * W), size_t(W)});
    const auto t2 = clock::now();
    fill += std::chrono::duration<double, std::micro>(t1 - t0).count();
    apply += std::chrono::duration<double, std::micro>(t2 - t1).count();
    for (int b = 0; b < batch; ++b) {  // advance each row by a random allowed non-stop token (restart when done)
      GrammarMatcher& m = rows[size_t(b)];
      const std::span<const uint32_t> mask(masks.data() + size_t(b * W), size_t(W));
      allowed.clear();
      for (int32_t t = 0; t < V; ++t)
        if (bitmask_allows(mask, t) && std::find(gc.stop_token_ids().begin(), gc.stop_token_ids().end(), t) ==
                                           gc.stop_token_ids().end())
          allowed.push_back(t);
      if (allowed.empty()) {
        m.reset();
        continue;
      }
      EXPECT_TRUE(m.accept_token(allowed[splitmix64_at(uint64_t(b) * 7919 + 1, uint64_t(s)) % allowed.size()]));
    }
  }
  return {fill / steps, apply / steps};
}

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,6}\\.com$"},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
  "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
              "required": ["city", "zip"]}}, "required": ["name", "age", "email", "address"]})";

void table(int steps, const std::vector<int>& batches) {
  const Tokenizer tok = Tokenizer::from_file(test::kFixtures / "tokenizer" / "smollm2" / "tokenizer.json");
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  const auto t0 = std::chrono::steady_clock::now();
  const GrammarCompiler gc(tok, int64_t(tok.vocab_size()), {eos});
  const double vocab_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("grammar mask cost per decode step (host), vocab %zu, vocabulary setup %.0f ms\n",
              tok.vocab_size(), vocab_ms);
  std::printf("%-14s %6s %8s %12s %14s %14s %14s\n", "constraint", "batch", "threads", "compile_ms", "fill_us/step",
              "fill_us/row", "apply_us/step");
  struct Case {
    const char* name;
    ConstraintSpec spec;
  };
  for (const Case& c : {Case{"json_schema", ConstraintSpec::json_schema(kSchema)}, Case{"json_object", ConstraintSpec::json_object()},
                        Case{"regex", ConstraintSpec::regex("[a-z]{3,10}-[0-9]{2,4}( [A-Z][a-z]+)*")}}) {
    const auto c0 = std::chrono::steady_clock::now();
    gc.compile(c.spec);
    const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
    for (int b : batches) {
      std::vector<int> thread_counts = {1};
      if (default_mask_threads() > 1 && b >= 4) thread_counts.push_back(default_mask_threads());
      for (int threads : thread_counts) {
        const Result r = run(gc, c.spec, b, steps, threads);
        std::printf("%-14s %6d %8d %12.1f %14.1f %14.1f %14.1f\n", c.name, b, threads, compile_ms, r.fill_us_per_step,
                    r.fill_us_per_step / b, r.apply_us_per_step);
      }
    }
  }
}

}  // namespace

TEST(GrammarMaskBench, Smoke) { table(4, {1, 4}); }

TEST(GrammarMaskBench, DISABLED_Table) { table(64, {1, 64}); }
