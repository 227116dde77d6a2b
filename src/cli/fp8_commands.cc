#include "cli/fp8_commands.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/device_option.h"
#include "cli/kv_cache_dtype_option.h"
#include "core/error.h"
#include "models/fp8_probe.h"
#include "models/load_model.h"
#include "runtime/model_runner.h"
#include "text/tokenizer.h"
#ifdef MOEFOLD_HAVE_CUDA
#include "models/cuda/cuda_executor.h"
#include "models/cuda/fp8_probe_gpu.h"
#endif

namespace moefold {

namespace {

using json = nlohmann::json;

std::vector<int32_t> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    try {
      ids.push_back(int32_t(std::stol(s.substr(i, j - i))));
    } catch (const std::exception&) {
      fail("--prompt-ids: '{}' is not an integer", s.substr(i, j - i));
    }
    i = j + 1;
  }
  return ids;
}

/// Seeded prompts of token ids in [0, vocab) (models without a tokenizer, or no prompts file).
std::vector<std::vector<int32_t>> random_prompts(int n, int len, int64_t vocab, uint64_t seed) {
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& p : out)
    for (int i = 0; i < len; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      p.push_back(int32_t((s >> 33) % uint64_t(vocab)));
    }
  return out;
}

/// The prompts of drift / probe: a JSONL file's "question" (or "prompt") strings through the model's
/// tokenizer, else seeded random ids.
std::vector<std::vector<int32_t>> load_prompts(const Fp8Commands& o, const ModelConfig& cfg, int n) {
  if (o.prompts_file.empty()) return random_prompts(n, o.prompt_len, cfg.vocab_size, o.seed);
  Tokenizer tok = Tokenizer::from_file(o.model_dir);
  std::ifstream in(o.prompts_file);
  MOEFOLD_CHECK(in.good(), "--prompts-file {}: cannot open", o.prompts_file);
  std::vector<std::vector<int32_t>> out;
  std::string line;
  while (int(out.size()) < n && std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    MOEFOLD_CHECK(j.is_object(), "--prompts-file {}: a line is not a JSON object", o.prompts_file);
    std::string text = j.value("question", j.value("prompt", std::string()));
    if (o.with_answers && j.contains("answer") && j["answer"].is_string()) text += "\n" + j["answer"].get<std::string>();
    if (!text.empty()) out.push_back(tok.encode(text, true));
  }
  MOEFOLD_CHECK(!out.empty(), "--prompts-file {}: no \"question\" or \"prompt\" strings", o.prompts_file);
  return out;
}

/// Configuration B's activation quantisation, for the report's header.
const char* act_note(const Fp8Commands& o) {
  return o.b_act ? " + fp8 activations (1x128)" : (o.b_expert_act ? " + fp8 expert activations (1x128)" : "");
}

/// A runner for one sequence of up to `tokens` tokens.
/// `fp8_act`: the CPU model quantises the inputs of its FP8 projections 1 x 128 (W8A8 emulation);
/// `fp8_expert_act`: only those of its routed experts (what the GPU's prefill steps do).
std::unique_ptr<ModelRunner> runner_for(const std::string& dir, const std::string& device, Quantization q,
                                        int32_t tokens, std::unique_ptr<Model>& cpu_model, bool fp8_lm_head = false,
                                        const std::string& only = "", bool fp8_act = false,
                                        const std::string& kv_dtype = "auto", bool fp8_expert_act = false) {
  const int32_t bs = 16;
  RunnerOptions opt{(tokens + bs - 1) / bs + 1, bs, 1};
  opt.kv_cache_dtype = parse_kv_cache_dtype(kv_dtype);
  check_kv_cache_dtype(ModelConfig::from_dir(dir), opt.kv_cache_dtype, device);
  if (device == "cpu" && !only.empty()) {  // a subset of the tensors in FP8
    ModelConfig cfg = ModelConfig::from_dir(dir);
    auto src = fp8_quantizing_source(checkpoint_source(dir), q == Quantization::Fp8, fp8_lm_head, only);
    ModelWeights w = load_weights(cfg, *src);
    cpu_model = std::make_unique<Model>(std::move(cfg), std::move(w));
    cpu_model->set_emulate_fp8_activations(fp8_act, fp8_act || fp8_expert_act);
    return std::make_unique<ModelRunner>(*cpu_model, opt);
  }
  MOEFOLD_CHECK(only.empty(), "--b-fp8-only runs on --b-device cpu");
  MOEFOLD_CHECK((!fp8_act && !fp8_expert_act) || device == "cpu",
                "--b-fp8-activations / --b-fp8-expert-activations (W8A8 emulation) run on --b-device cpu");
  if (device == "cpu") {
    cpu_model = load_model(dir, LoadFormat::Safetensors, 0, q, fp8_lm_head);
    cpu_model->set_emulate_fp8_activations(fp8_act, fp8_act || fp8_expert_act);
    return std::make_unique<ModelRunner>(*cpu_model, opt);
  }
#ifdef MOEFOLD_HAVE_CUDA
  CudaExecutorOptions co;
  co.num_blocks = opt.num_blocks;
  co.block_size = bs;
  co.num_slots = 1;
  co.max_rows = std::max(tokens, 1);
  co.max_blocks_per_seq = opt.num_blocks;
  co.quantization = q;
  co.fp8_lm_head = fp8_lm_head;
  co.kv_cache_dtype = opt.kv_cache_dtype;
  return std::make_unique<ModelRunner>(make_cuda_executor(dir, LoadFormat::Safetensors, 0, co), opt);
#else
  fail("--device cuda: this binary was built without the CUDA backend");
#endif
}

int argmax(const float* v, int64_t n) { return int(std::max_element(v, v + n) - v); }
double top2_margin(const float* v, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (v[i] > a) {
      b = a;
      a = v[i];
    } else if (v[i] > b) {
      b = v[i];
    }
  }
  return double(a) - double(b);
}

struct Decoded {
  std::vector<int32_t> tokens;
  std::vector<double> margins;  ///< top-2 margin of the logits each token was chosen from
  double nll = 0;               ///< sum of -log p(prompt[i] | prompt[< i]) over i >= 1 (teacher-forced)
};

/// -log softmax(logits)[target], in fp64.
double neg_log_prob(const float* logits, int64_t V, int32_t target) {
  double mx = -INFINITY, sum = 0;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(logits[i]));
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - mx);
  return std::log(sum) + mx - double(logits[target]);
}

Decoded greedy(ModelRunner& r, const std::vector<int32_t>& prompt, int max_tokens, int64_t V) {
  Decoded d;
  const int32_t s = r.add_sequence(prompt);
  const int64_t n = int64_t(prompt.size());
  auto all = r.step({{s, int32_t(n), true}})[0];  // every position: the prompt's perplexity too
  for (int64_t i = 0; i + 1 < n; ++i) d.nll += neg_log_prob(all.data() + i * V, V, prompt[size_t(i + 1)]);
  std::vector<float> logits(all.end() - V, all.end());
  for (int i = 0; i < max_tokens; ++i) {
    const int32_t t = argmax(logits.data(), V);
    d.tokens.push_back(t);
    d.margins.push_back(top2_margin(logits.data(), V));
    if (i + 1 == max_tokens) break;
    r.append_token(s, t);
    logits = r.step({{s, 1, false}})[0];
  }
  r.release(s);
  return d;
}

double logits_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return n > 0 ? std::sqrt(e / n) : 0.0;
}

std::vector<float> prompt_logits(ModelRunner& r, const std::vector<int32_t>& ids) {
  const int32_t s = r.add_sequence(ids);
  auto out = r.step({{s, int32_t(ids.size()), true}})[0];
  r.release(s);
  return out;
}

int run_probe(const Fp8Commands& o) {
  const Quantization q = parse_quantization(o.quantization);
  auto model = load_model(o.model_dir, LoadFormat::Safetensors, 0, q);
  const ModelConfig& cfg = model->config();
  std::vector<int32_t> ids;
  if (!o.prompt_ids.empty()) ids = parse_id_list(o.prompt_ids);
  else if (!o.prompt.empty()) ids = Tokenizer::from_file(o.model_dir).encode(o.prompt, true);
  else ids = random_prompts(1, o.prompt_len, cfg.vocab_size, o.seed)[0];
  json out = {{"model", o.model_dir}, {"quantization", o.quantization}, {"tokens", ids.size()}};
  // MoE stage probes (models with MoE layers only).
  const bool has_moe = std::find(cfg.layer_is_moe.begin(), cfg.layer_is_moe.end(), true) != cfg.layer_is_moe.end();
  if (has_moe) {
    MoeStageRunner tested = o.probe_fp8_act ? moe_stages_cpu_w8a8 : moe_stages_cpu;
#ifdef MOEFOLD_HAVE_CUDA
    if (o.device == "cuda") tested = o.probe_fp8_act ? moe_stages_gpu_w8a8 : moe_stages_gpu;
#endif
    MOEFOLD_CHECK(o.device == "cpu" || o.device == "cuda", "--device {}: expected cpu or cuda", o.device);
    const std::string name = o.device + (o.probe_fp8_act ? " W8A8" : " W8A16");
    const ProbeReport r = probe_moe_layer(*model, ids, o.layer, tested, name);
    std::printf("probe: MoE layer %d, %lld tokens, tested chain: %s, references: the ideal quantised chains (fp64, "
                "same FP8 weights; activations bf16 (W8A16) or quantised 1 x 128 (W8A8))\n",
                r.layer, (long long)r.tokens, r.tested.c_str());
    std::printf("  %-26s %12s %22s %18s\n", "stage", "vs W8A16", "ideal W8A8(1x128) vs W8A16", "vs ideal W8A8");
    std::printf("  %-26s %12.3e %22.3e %18.3e\n", "after the expert GEMMs", r.gemms, r.a8_gemms, r.vs_a8_gemms);
    std::printf("  %-26s %12.3e %22.3e %18.3e\n", "per slot (expert output)", r.per_slot, r.a8_per_slot,
                r.vs_a8_per_slot);
    std::printf("  %-26s %12.3e %22.3e %18.3e\n", "after the combine", r.combine, r.a8_combine, r.vs_a8_combine);
    std::printf("  %-26s %12.3e\n", "layer output", r.layer_out);
    out["moe"] = {{"layer", r.layer},
                  {"tested", r.tested},
                  {"after_gemms", r.gemms},
                  {"per_slot", r.per_slot},
                  {"after_combine", r.combine},
                  {"layer_output", r.layer_out},
                  {"a8_after_gemms", r.a8_gemms},
                  {"a8_per_slot", r.a8_per_slot},
                  {"a8_after_combine", r.a8_combine},
                  {"vs_a8_after_gemms", r.vs_a8_gemms},
                  {"vs_a8_per_slot", r.vs_a8_per_slot},
                  {"vs_a8_after_combine", r.vs_a8_combine}};
  }
  // Whole forward: the device's logits against the CPU's fp32 chain over the same FP8 weights, and the
  // FP8 model against the unquantised one.
  std::unique_ptr<Model> keep;
  const int32_t n = int32_t(ids.size());
  ModelRunner ref(*model, {(n + 15) / 16 + 1, 16, 1});
  const auto l_ref = prompt_logits(ref, ids);
  double fwd = 0;
  if (o.device == "cuda") {
    auto gpu = runner_for(o.model_dir, "cuda", q, n, keep);
    const auto l_gpu = prompt_logits(*gpu, ids);
    bool w8a8 = false;
#ifdef MOEFOLD_HAVE_CUDA
    w8a8 = cuda_step_runs_w8a8_experts(cfg, n);
#endif
    std::vector<float> l_ref8;
    if (w8a8) {  // the GPU's routed experts quantise their activations in a step this long: so does the CPU's
      model->set_emulate_fp8_activations(false, true);
      ModelRunner ref8(*model, {(n + 15) / 16 + 1, 16, 1});
      l_ref8 = prompt_logits(ref8, ids);
      model->set_emulate_fp8_activations(false, false);
    }
    fwd = logits_rel(l_gpu, w8a8 ? l_ref8 : l_ref);
    std::printf("  %-26s %12.3e  (cuda logits vs the CPU fp32 chain, same FP8 weights%s)\n", "whole forward", fwd,
                w8a8 ? "; the routed experts W8A8 in both" : "");
    out["forward_vs_cpu_fp8"] = fwd;
    out["forward_w8a8_experts"] = w8a8;
  }
  if (q == Quantization::Fp8) {
    auto plain = load_model(o.model_dir, LoadFormat::Safetensors, 0, Quantization::None);
    ModelRunner pr(*plain, {(n + 15) / 16 + 1, 16, 1});
    const double unq = logits_rel(l_ref, prompt_logits(pr, ids));
    std::printf("  %-26s %12.3e  (FP8 vs the unquantised weights, CPU logits)\n", "quantisation (forward)", unq);
    out["forward_fp8_vs_unquantised"] = unq;
  }
  if (!o.json_out.empty()) std::ofstream(o.json_out) << out.dump(2) << "\n";
  return 0;
}

int run_drift(const Fp8Commands& o) {
  const ModelConfig cfg = ModelConfig::from_dir(o.model_dir);
  const auto prompts = load_prompts(o, cfg, o.num_prompts);
  int32_t longest = 0;
  for (auto& p : prompts) longest = std::max<int32_t>(longest, int32_t(p.size()));
  const int32_t tokens = longest + o.max_tokens;
  std::unique_ptr<Model> ma, mb;
  auto ra = runner_for(o.model_dir, o.a_device, parse_quantization(o.a_quant), tokens, ma, o.a_lm_head, "", false,
                       o.a_kv);
  auto rb = runner_for(o.model_dir, o.b_device, parse_quantization(o.b_quant), tokens, mb, o.b_lm_head, o.b_only,
                       o.b_act, o.b_kv, o.b_expert_act);
  const int64_t V = cfg.vocab_size;
  int matches = 0;
  double first_sum = 0, margin_sum = 0, nll_a = 0, nll_b = 0, scored = 0;
  int diverged = 0;
  json rows = json::array();
  auto kv_note = [](const std::string& kv) { return kv == "auto" ? std::string() : " + " + kv + " KV cache"; };
  std::printf("drift: A = %s%s%s on %s, B = %s%s%s%s%s on %s; %zu prompts, %d greedy tokens each\n", o.a_quant.c_str(),
              o.a_lm_head ? " + fp8 lm_head" : "", kv_note(o.a_kv).c_str(), o.a_device.c_str(), o.b_quant.c_str(),
              o.b_lm_head ? " + fp8 lm_head" : "", act_note(o), kv_note(o.b_kv).c_str(),
              o.b_only.empty() ? "" : (" (only *" + o.b_only + "*)").c_str(), o.b_device.c_str(), prompts.size(),
              o.max_tokens);
  std::printf("  %6s %8s %16s %14s\n", "prompt", "match", "first diverge", "A top-2 margin");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Decoded a = greedy(*ra, prompts[i], o.max_tokens, V), b = greedy(*rb, prompts[i], o.max_tokens, V);
    int first = -1;
    for (size_t t = 0; t < a.tokens.size(); ++t)
      if (a.tokens[t] != b.tokens[t]) {
        first = int(t);
        break;
      }
    const double margin = first >= 0 ? a.margins[size_t(first)] : NAN;
    nll_a += a.nll;
    nll_b += b.nll;
    scored += double(prompts[i].size() - 1);
    if (first < 0) ++matches;
    else {
      ++diverged;
      first_sum += first;
      margin_sum += margin;
    }
    std::printf("  %6zu %8s %16s %14s\n", i, first < 0 ? "yes" : "no", first < 0 ? "-" : std::to_string(first).c_str(),
                first < 0 ? "-" : fmt::format("{:.4f}", margin).c_str());
    rows.push_back({{"prompt", i}, {"match", first < 0}, {"first_divergence", first},
                    {"a_top2_margin", first < 0 ? json(nullptr) : json(margin)}});
  }
  std::printf("drift: %d / %zu outputs match", matches, prompts.size());
  if (diverged)
    std::printf("; diverged ones: mean first divergence at token %.1f, mean A top-2 margin there %.4f",
                first_sum / diverged, margin_sum / diverged);
  std::printf("\n");
  const double ppl_a = std::exp(nll_a / std::max(scored, 1.0)), ppl_b = std::exp(nll_b / std::max(scored, 1.0));
  std::printf("drift: prompt perplexity (teacher-forced, %.0f tokens): A %.4f, B %.4f (B / A - 1 = %+.3f%%)\n",
              scored, ppl_a, ppl_b, 100.0 * (ppl_b / ppl_a - 1.0));
  if (!o.json_out.empty())
    std::ofstream(o.json_out) << json{{"a", {{"quantization", o.a_quant}, {"device", o.a_device}, {"fp8_lm_head", o.a_lm_head},
                                             {"kv_cache_dtype", o.a_kv}}},
                                      {"b", {{"quantization", o.b_quant}, {"device", o.b_device}, {"fp8_lm_head", o.b_lm_head},
                                             {"only", o.b_only}, {"kv_cache_dtype", o.b_kv}}},
                                      {"max_tokens", o.max_tokens},
                                      {"matches", matches},
                                      {"perplexity", {{"a", ppl_a}, {"b", ppl_b}, {"tokens", scored}}},
                                      {"prompts", rows}}
                                     .dump(2)
                              << "\n";
  return 0;
}

// ---------------------------------------------------------------- perplexity

/// The texts `perplexity` scores: --text-file's tokens in windows of --max-len (each window its own
/// sequence, its first token unscored), at most --num-prompts windows; else --prompts-file's lines.
std::vector<std::vector<int32_t>> perplexity_segments(const Fp8Commands& o, const ModelConfig& cfg) {
  if (o.text_file.empty()) {
    MOEFOLD_CHECK(!o.prompts_file.empty(), "perplexity: give --text-file or --prompts-file (a real text)");
    return load_prompts(o, cfg, o.num_prompts);
  }
  std::ifstream in(o.text_file, std::ios::binary);
  MOEFOLD_CHECK(in.good(), "--text-file {}: cannot open", o.text_file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = Tokenizer::from_file(o.model_dir).encode(text, true);
  MOEFOLD_CHECK(ids.size() >= 2, "--text-file {}: fewer than 2 tokens", o.text_file);
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i + 1 < ids.size() && int(out.size()) < o.num_prompts; i += size_t(o.max_len))
    out.emplace_back(ids.begin() + int64_t(i), ids.begin() + int64_t(std::min(ids.size(), i + size_t(o.max_len))));
  return out;
}

/// One configuration's scores against the reference (A) over the same tokens.
struct PplScore {
  double nll = 0;   ///< sum of -log p(next token)
  double kl = 0;    ///< sum over positions of KL(p_A || p_this), nats
  int64_t tokens = 0, top1_agree = 0;  ///< scored positions; those whose argmax equals A's
  double ppl() const { return std::exp(nll / double(std::max<int64_t>(tokens, 1))); }
};

/// log-softmax of one row of logits, fp64.
void log_softmax(const float* v, int64_t V, std::vector<double>& out) {
  double mx = -INFINITY, sum = 0;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(v[i]));
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(v[i]) - mx);
  const double lse = mx + std::log(sum);
  out.resize(size_t(V));
  for (int64_t i = 0; i < V; ++i) out[size_t(i)] = double(v[i]) - lse;
}

/// Teacher-forced scores of `segments` under one configuration. `ref` empty: this is A, whose
/// log-probabilities (float) are stored into it, [positions, V] per segment; else KL and top-1 agreement
/// against them.
PplScore score_config(ModelRunner& r, const std::vector<std::vector<int32_t>>& segments, int64_t V,
                      std::vector<std::vector<float>>& ref) {
  const bool is_ref = ref.empty();
  if (is_ref) ref.resize(segments.size());
  PplScore sc;
  std::vector<double> lp;
  for (size_t s = 0; s < segments.size(); ++s) {
    const auto& seg = segments[s];
    const auto logits = prompt_logits(r, seg);
    const int64_t n = int64_t(seg.size()) - 1;
    if (is_ref) ref[s].resize(size_t(n * V));
    for (int64_t t = 0; t < n; ++t) {
      log_softmax(logits.data() + t * V, V, lp);
      sc.nll -= lp[size_t(seg[size_t(t + 1)])];
      float* a = ref[s].data() + t * V;
      if (is_ref) {
        for (int64_t i = 0; i < V; ++i) a[i] = float(lp[size_t(i)]);
        continue;
      }
      double kl = 0;
      int64_t am = 0, bm = 0;
      for (int64_t i = 0; i < V; ++i) {
        // B's log-probability rounded to float like A's stored one: identical configurations give 0.
        kl += std::exp(double(a[i])) * (double(a[i]) - double(float(lp[size_t(i)])));
        if (a[i] > a[am]) am = i;
        if (lp[size_t(i)] > lp[size_t(bm)]) bm = i;
      }
      sc.kl += kl;
      sc.top1_agree += am == bm;
    }
    sc.tokens += n;
  }
  if (is_ref) sc.top1_agree = sc.tokens;
  return sc;
}

/// The groups of --attribution: `kinds` (each projection kind in every layer, the routed experts one
/// group) or `layers` (each layer's projections), as substrings of the FP8-quantisable tensor names.
std::vector<std::string> attribution_groups(const ModelConfig& cfg, const std::string& what) {
  CountingSource counting(true);
  (void)load_weights(cfg, counting);
  std::vector<std::string> groups;
  auto add = [&](const std::string& g) {
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  };
  for (const TensorSpec& t : counting.specs) {
    if (!fp8_quantisable(t)) continue;
    const size_t at = t.name.find("layers.");
    if (at == std::string::npos) continue;
    const size_t dot = t.name.find('.', at + 7);
    if (what == "layers") {
      add(t.name.substr(at, dot + 1 - at));
      continue;
    }
    std::string kind = t.name.substr(dot + 1);
    if (kind.find("experts.") != std::string::npos && kind.find("shared_expert") == std::string::npos) kind = "mlp.experts";
    else if (kind.size() > 7 && kind.compare(kind.size() - 7, 7, ".weight") == 0) kind.resize(kind.size() - 7);
    add(kind + ".");
  }
  return groups;
}

int run_perplexity(const Fp8Commands& o) {
  const ModelConfig cfg = ModelConfig::from_dir(o.model_dir);
  const auto segments = perplexity_segments(o, cfg);
  int32_t longest = 0;
  int64_t positions = 0;
  for (auto& p : segments) {
    longest = std::max<int32_t>(longest, int32_t(p.size()));
    positions += int64_t(p.size()) - 1;
  }
  const int64_t V = cfg.vocab_size;
  MOEFOLD_CHECK(double(positions) * double(V) * 4 < 4e9,
                "perplexity: {} positions x {} logits would keep {:.1f} GB of reference log-probabilities; "
                "score fewer tokens (--num-prompts, --max-len)",
                positions, V, double(positions) * double(V) * 4 / 1e9);
  std::vector<std::vector<float>> ref;
  PplScore a;
  {
    std::unique_ptr<Model> m;
    auto r = runner_for(o.model_dir, o.a_device, parse_quantization(o.a_quant), longest, m, o.a_lm_head);
    a = score_config(*r, segments, V, ref);
  }
  struct Row {
    std::string name, only;
    PplScore s;
  };
  std::vector<Row> rows;
  auto run_b = [&](const std::string& name, const std::string& only) {
    std::unique_ptr<Model> m;
    auto r = runner_for(o.model_dir, o.b_device, parse_quantization(o.b_quant), longest, m, o.b_lm_head, only, o.b_act,
                        "auto", o.b_expert_act);
    rows.push_back({name, only, score_config(*r, segments, V, ref)});
    const Row& w = rows.back();
    std::printf("  %-28s %10.4f %+9.3f%% %12.3e %9.2f%%\n", w.name.c_str(), w.s.ppl(), 100.0 * (w.s.ppl() / a.ppl() - 1.0),
                w.s.kl / double(w.s.tokens), 100.0 * double(w.s.top1_agree) / double(w.s.tokens));
    std::fflush(stdout);
  };
  std::printf("perplexity: %zu segments, %lld scored tokens; A = %s%s, B = %s%s%s%s (cpu unless --*-device)\n",
              segments.size(), (long long)a.tokens, o.a_quant.c_str(), o.a_lm_head ? " + fp8 lm_head" : "",
              o.b_quant.c_str(), o.b_lm_head ? " + fp8 lm_head" : "", act_note(o),
              o.b_only.empty() ? "" : (" (only *" + o.b_only + "*)").c_str());
  std::printf("  %-28s %10s %10s %12s %10s\n", "configuration", "perplexity", "vs A", "KL(A||B)/tok", "top-1 = A");
  std::printf("  %-28s %10.4f %+9.3f%% %12.3e %9.2f%%\n", "A", a.ppl(), 0.0, 0.0, 100.0);
  run_b("B", o.b_only);
  if (!o.attribution.empty()) {
    MOEFOLD_CHECK(o.b_only.empty(), "--attribution and --b-fp8-only: pick one");
    std::printf("perplexity: attribution (B with only these tensors in FP8):\n");
    for (const std::string& g : attribution_groups(cfg, o.attribution)) run_b("only " + g, g);
  }
  std::printf("perplexity: B / A - 1 = %+.3f%% (A %.4f, B %.4f over %lld tokens)\n",
              100.0 * (rows[0].s.ppl() / a.ppl() - 1.0), a.ppl(), rows[0].s.ppl(), (long long)a.tokens);
  if (!o.json_out.empty()) {
    json jr = json::array();
    for (const Row& w : rows)
      jr.push_back({{"name", w.name}, {"only", w.only}, {"perplexity", w.s.ppl()},
                    {"kl_per_token", w.s.kl / double(w.s.tokens)},
                    {"top1_agreement", double(w.s.top1_agree) / double(w.s.tokens)}});
    std::ofstream(o.json_out) << json{{"a", {{"quantization", o.a_quant}, {"device", o.a_device}, {"fp8_lm_head", o.a_lm_head},
                                             {"perplexity", a.ppl()}}},
                                      {"b", {{"quantization", o.b_quant}, {"device", o.b_device}, {"fp8_lm_head", o.b_lm_head},
                                             {"fp8_activations", o.b_act}, {"fp8_expert_activations", o.b_expert_act},
                                             {"only", o.b_only}}},
                                      {"segments", segments.size()},
                                      {"tokens", a.tokens},
                                      {"rows", jr}}
                                     .dump(2)
                              << "\n";
  }
  return 0;
}

}  // namespace

std::unique_ptr<Fp8Commands> add_fp8_commands(CLI::App& app) {
  auto o = std::make_unique<Fp8Commands>();
  auto quant_check = CLI::IsMember({"none", "fp8"});
  CLI::App* p = app.add_subcommand("probe", "FP8 stage probes of one MoE layer and the forward vs the ideal quantised chain");
  p->add_option("--model", o->model_dir, "model directory")->required();
  p->add_option("--quantization,-q", o->quantization, "fp8: quantise at load (none: the checkpoint must be FP8)")
      ->check(quant_check);
  device_choices(p->add_option("--device", o->device));
  p->add_option("--layer", o->layer, "MoE layer to probe (-1: the first)");
  p->add_option("--prompt", o->prompt, "prompt text (needs tokenizer.json)");
  p->add_option("--prompt-ids", o->prompt_ids, "comma-separated token ids");
  p->add_option("--prompt-len", o->prompt_len, "length of the seeded random prompt otherwise");
  p->add_option("--seed", o->seed, "seed of the random prompt");
  p->add_option("--json", o->json_out, "also write the report as JSON to this file");
  p->add_flag("--fp8-activations", o->probe_fp8_act,
              "the chain under test quantises the experts' activations per token and 128 columns (W8A8: the GPU's "
              "prefill experts, any token count; the CPU's emulation)");
  o->probe = p;
  CLI::App* d = app.add_subcommand("drift", "greedy outputs of N prompts under two configurations: matches, first divergence, margin");
  d->add_option("--model", o->model_dir, "model directory")->required();
  d->add_option("--a-quantization", o->a_quant, "configuration A: none | fp8")->check(quant_check);
  d->add_option("--b-quantization", o->b_quant, "configuration B: none | fp8")->check(quant_check);
  d->add_flag("--a-fp8-lm-head", o->a_lm_head, "configuration A: lm_head in FP8 (--fp8-lm-head)");
  d->add_flag("--b-fp8-lm-head", o->b_lm_head, "configuration B: lm_head in FP8 (--fp8-lm-head)");
  d->add_option("--b-fp8-only", o->b_only,
                "configuration B (cpu): quantise only the tensors whose name contains this (e.g. layers.3. or mlp.down_proj)");
  add_kv_cache_dtype_option(d, o->a_kv, "--a-kv-cache-dtype", "configuration A: KV cache");
  add_kv_cache_dtype_option(d, o->b_kv, "--b-kv-cache-dtype", "configuration B: KV cache");
  device_choices(d->add_option("--a-device", o->a_device));
  device_choices(d->add_option("--b-device", o->b_device));
  d->add_option("--num-prompts", o->num_prompts, "prompts")->check(CLI::Range(1, 100000));
  d->add_option("--max-tokens", o->max_tokens, "greedy tokens per prompt")->check(CLI::Range(1, 100000));
  d->add_option("--prompts-file", o->prompts_file,
                "JSONL with \"question\" or \"prompt\" strings (e.g. GSM8K test.jsonl); default: seeded random ids");
  d->add_option("--prompt-len", o->prompt_len, "length of the seeded random prompts");
  d->add_flag("--with-answers", o->with_answers,
              "--prompts-file: append each line's \"answer\" to its prompt (perplexity over questions and answers)");
  d->add_option("--seed", o->seed, "seed of the random prompts");
  d->add_flag("--b-fp8-activations", o->b_act,
              "configuration B (cpu): FP8 projections quantise their inputs per token and 128 columns (W8A8)");
  d->add_flag("--b-fp8-expert-activations", o->b_expert_act,
              "configuration B (cpu): only the routed experts quantise their activations (the GPU's prefill steps)");
  d->add_option("--json", o->json_out, "also write the report as JSON to this file");
  o->drift = d;
  CLI::App* pp = app.add_subcommand(
      "perplexity", "teacher-forced perplexity of a real text under configurations A and B (KL, top-1 agreement), "
                    "and which tensors cost what (--attribution)");
  pp->add_option("--model", o->model_dir, "model directory")->required();
  pp->add_option("--text-file", o->text_file, "plain text, scored in windows of --max-len tokens");
  pp->add_option("--prompts-file", o->prompts_file, "JSONL with \"question\" or \"prompt\" strings (instead of --text-file)");
  pp->add_flag("--with-answers", o->with_answers, "--prompts-file: append each line's \"answer\"");
  pp->add_option("--num-prompts", o->num_prompts, "at most this many windows / prompts")->check(CLI::Range(1, 100000));
  pp->add_option("--max-len", o->max_len, "--text-file: tokens per window")->check(CLI::Range(2, 1 << 20));
  pp->add_option("--a-quantization", o->a_quant, "configuration A: none | fp8")->check(quant_check);
  pp->add_option("--b-quantization", o->b_quant, "configuration B: none | fp8")->check(quant_check);
  pp->add_flag("--a-fp8-lm-head", o->a_lm_head, "configuration A: lm_head in FP8");
  pp->add_flag("--b-fp8-lm-head", o->b_lm_head, "configuration B: lm_head in FP8");
  pp->add_flag("--b-fp8-activations", o->b_act,
               "configuration B (cpu): FP8 projections quantise their inputs per token and 128 columns (W8A8)");
  pp->add_flag("--b-fp8-expert-activations", o->b_expert_act,
               "configuration B (cpu): only the routed experts quantise their activations (the GPU's prefill steps)");
  pp->add_option("--b-fp8-only", o->b_only, "configuration B (cpu): quantise only the tensors whose name contains this");
  pp->add_option("--attribution", o->attribution,
                 "then B once per group with only that group in FP8: kinds (q/k/v/o, gate/up/down, ...) or layers")
      ->check(CLI::IsMember({"kinds", "layers"}));
  device_choices(pp->add_option("--a-device", o->a_device));
  device_choices(pp->add_option("--b-device", o->b_device));
  pp->add_option("--json", o->json_out, "also write the report as JSON to this file");
  o->perplexity = pp;
  return o;
}

int Fp8Commands::run() {
  if (*probe) return run_probe(*this);
  if (*perplexity) return run_perplexity(*this);
  return run_drift(*this);
}

}  // namespace moefold
