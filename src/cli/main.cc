// moefold command line: inspect | logits | generate.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_config.h"
#include "io/npy.h"
#include "models/load_model.h"
#include "models/weight_loader.h"
#include "runtime/model_runner.h"
#include "cli/serve_command.h"

using namespace moefold;
using json = nlohmann::json;

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    try {
      size_t used = 0;
      long v = std::stol(tok, &used);
      if (used != tok.size()) throw std::invalid_argument(tok);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("--prompt-ids: '{}' is not an integer (expected e.g. 1,2,3)", tok);
    }
    i = j + 1;
  }
  if (ids.empty()) fail("--prompt-ids is empty");
  return ids;
}

void check_device(const std::string& device) {
  if (device != "cpu") fail("--device {}: only 'cpu' is available in this build", device);
}

int cmd_inspect(const std::string& dir, bool as_json) {
  ModelConfig c = ModelConfig::from_dir(dir);
  ParamCounts p = count_params(c);
  const int64_t kv = c.kv_bytes_per_token(2), st = c.deltanet_state_bytes_per_seq(2);
  if (as_json) {
    json j = {{"family", family_name(c.family)},
              {"model_type", c.model_type},
              {"num_layers", c.num_layers},
              {"full_attention_layers", c.num_layers_of(LayerType::FullAttention)},
              {"linear_attention_layers", c.num_layers_of(LayerType::LinearAttention)},
              {"total_params", p.total},
              {"active_params_per_token", p.active_per_token},
              {"routed_expert_params", p.routed_expert},
              {"kv_cache_bytes_per_token_bf16", kv},
              {"deltanet_state_bytes_per_seq", st}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("family                   %s (%s)\n", family_name(c.family).c_str(), c.model_type.c_str());
    std::printf("layers                   %lld (%lld full attention, %lld Gated DeltaNet)\n", (long long)c.num_layers,
                (long long)c.num_layers_of(LayerType::FullAttention), (long long)c.num_layers_of(LayerType::LinearAttention));
    std::printf("total parameters         %.2f B\n", double(p.total) / 1e9);
    std::printf("active per token         %.2f B\n", double(p.active_per_token) / 1e9);
    std::printf("KV cache per token       %lld bytes (bf16)\n", (long long)kv);
    std::printf("DeltaNet state per seq   %.2f MiB (conv bf16, recurrent fp32)\n", double(st) / 1048576.0);
  }
  return 0;
}

int argmax(const std::vector<float>& v) {
  return int(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moefold: an inference engine for sparse mixture-of-experts LLMs"};
  app.require_subcommand(1);
  std::string model_dir, load_format = "auto", device = "cpu", prompt_ids, out_path, output = "text";
  bool as_json = false;
  int max_tokens = 16;
  double temperature = 0;
  uint64_t seed = 0;

  auto add_model_opts = [&](CLI::App* c) {
    c->add_option("--model", model_dir, "model directory (config.json + safetensors)")->required();
    c->add_option("--load-format", load_format, "auto | safetensors | dummy (seeded random weights)");
    c->add_option("--device", device, "cpu");
    c->add_option("--seed", seed, "seed for dummy weights");
  };
  auto* inspect = app.add_subcommand("inspect", "model facts from config.json, without loading weights");
  inspect->add_option("--model", model_dir, "model directory")->required();
  inspect->add_flag("--json", as_json, "print JSON");
  auto* logits = app.add_subcommand("logits", "float32 logits of every prompt position to a .npy file");
  add_model_opts(logits);
  logits->add_option("--prompt-ids", prompt_ids, "comma-separated token ids")->required();
  logits->add_option("--out", out_path, "output .npy path")->required();
  auto* generate = app.add_subcommand("generate", "generate tokens from a prompt");
  add_model_opts(generate);
  generate->add_option("--prompt-ids", prompt_ids, "comma-separated token ids")->required();
  generate->add_option("--max-tokens", max_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  generate->add_option("--temperature", temperature, "0 = greedy");
  generate->add_option("--output", output, "text | json");

  auto serve = add_serve_command(app);

  CLI11_PARSE(app, argc, argv);
  try {
    if (*inspect) return cmd_inspect(model_dir, as_json);
    if (*serve->app) return serve->run();
    check_device(device);
    auto ids = parse_ids(prompt_ids);
    auto model = load_model(model_dir, parse_load_format(load_format), seed);
    const int32_t bs = 16;
    const int32_t total = int32_t(ids.size()) + (*generate ? max_tokens : 0);
    ModelRunner runner(*model, {(total + bs - 1) / bs + 1, bs, 1});
    int32_t seq = runner.add_sequence(ids);
    if (*logits) {
      auto out = runner.step({{seq, int32_t(ids.size()), true}});
      write_npy(out_path, {int64_t(ids.size()), model->config().vocab_size}, out[0]);
      return 0;
    }
    if (temperature != 0) fail("--temperature: only greedy (0) is available in this build");
    std::vector<int32_t> gen;
    auto out = runner.step({{seq, int32_t(ids.size()), false}});
    const auto& eos = model->config().eos_token_ids;
    for (int i = 0; i < max_tokens; ++i) {
      int32_t tok = argmax(out[0]);
      gen.push_back(tok);
      if (std::find(eos.begin(), eos.end(), tok) != eos.end() || i + 1 == max_tokens) break;
      runner.append_token(seq, tok);
      out = runner.step({{seq, 1, false}});
    }
    if (output == "json") {
      std::cout << json{{"tokens", gen}}.dump() << "\n";
    } else {
      for (size_t i = 0; i < gen.size(); ++i) std::cout << (i ? "," : "") << gen[i];
      std::cout << "\n";
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
