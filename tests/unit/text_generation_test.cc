// Tests of generate_text (src/runtime/text_generation.h), the loop of `moefold generate --prompt` and
// `moefold chat`: a model whose vocabulary is padded past the tokenizer's ids (as Qwen3's 151936 rows
// for 151669 tokens) never samples a padding id, which the detokenizer cannot decode.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fixture_util.h"
#include "models/load_model.h"
#include "runtime/model_runner.h"
#include "runtime/text_generation.h"
#include "text/tokenizer.h"

using namespace moefold;
namespace fs = std::filesystem;

namespace {

TEST(GenerateText, NeverSamplesIdsTheTokenizerCannotDecode) {
  const fs::path tok_file = test::kFixtures / "tokenizer" / "qwen35_mini" / "tokenizer.json";
  const Tokenizer tok = Tokenizer::from_file(tok_file.string());
  const int64_t vocab = int64_t(tok.vocab_size()) + 512;  // 512 padding rows the tokenizer lacks
  const fs::path dir = fs::temp_directory_path() / ("moefold_padded_vocab_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const nlohmann::json cfg = {{"model_type", "qwen3"}, {"vocab_size", vocab}, {"hidden_size", 48},
                              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                              {"head_dim", 16}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096},
                              {"intermediate_size", 64}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0}};
  std::ofstream(dir / "config.json") << cfg.dump(2);
  auto model = load_model(dir.string(), LoadFormat::Dummy, 5);
  ModelRunner runner(*model, {64, 16, 1});
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 11;
  p.max_tokens = 300;
  p.ignore_eos = true;
  const std::vector<int32_t> prompt = tok.encode("Hello there", false);
  TextGenerationResult r;
  ASSERT_NO_THROW(r = generate_text(runner, tok, prompt, p, 1024));
  EXPECT_EQ(r.output_ids.size(), 300u);
  for (int32_t id : r.output_ids) EXPECT_TRUE(tok.contains(id)) << id;
  fs::remove_all(dir);
}

}  // namespace
