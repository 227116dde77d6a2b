// `moefold bench serve` options and runs (contract: bench_serve_command.h).
#include "cli/bench_serve_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench/ab_comparison.h"
#include "bench/arrival_schedule.h"
#include "bench/datasets.h"
#include "bench/openai_client.h"
#include "bench/progress_bar.h"
#include "bench/serve_metrics.h"
#include "bench/serve_report.h"
#include "bench/serve_runner.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace moefold {

using bench::BenchmarkMetrics;
using bench::RequestOutput;
using Json = nlohmann::ordered_json;

std::unique_ptr<BenchServeCommand> add_bench_serve_command(CLI::App& bench) {
  auto b = std::make_unique<BenchServeCommand>();
  CLI::App* c = bench.add_subcommand("serve", "load an OpenAI-compatible server (any engine) and report throughput and "
                                              "TTFT / TPOT / ITL / E2EL percentiles, like `vllm bench serve`");
  b->app = c;
  c->add_option("--base-url", b->base_url, "server URL, e.g. http://127.0.0.1:8000 (default: http://HOST:PORT)");
  c->add_option("--host", b->host, "server host when --base-url is not given")->capture_default_str();
  c->add_option("--port", b->port, "server port when --base-url is not given")->capture_default_str()->check(CLI::Range(1, 65535));
  c->add_option("--endpoint", b->endpoint, "API route: /v1/completions or /v1/chat/completions")->capture_default_str();
  c->add_option("--model", b->model, "the model name sent (default: the first id of GET /v1/models)");
  c->add_option("--num-prompts", b->num_prompts, "requests to send")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  c->add_option("--request-rate", b->request_rate, "requests per second, Poisson arrivals (inf: all at once)")
      ->capture_default_str();
  c->add_option("--burstiness", b->burstiness, "gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more regular")
      ->capture_default_str();
  c->add_option("--max-concurrency", b->max_concurrency, "most requests in flight at once (default: no limit)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  c->add_option("--dataset-name", b->dataset_name, "random | prefix_repetition | multi_turn | file")
      ->capture_default_str()
      ->check(CLI::IsMember({"random", "prefix_repetition", "multi_turn", "file"}));
  c->add_option("--multi-turn-num-turns", b->mt_turns,
                "multi_turn: requests per conversation (--num-prompts conversations; --max-concurrency of them at once)")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  c->add_option("--multi-turn-shared-prefix-len", b->mt_shared_prefix_len,
                "multi_turn: system-prompt tokens shared by every conversation")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  c->add_option("--multi-turn-prefix-len", b->mt_prefix_len,
                "multi_turn: system-prompt tokens of each conversation's own, after the shared ones")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  c->add_option("--multi-turn-user-len", b->mt_user_len,
                "multi_turn: tokens of each user message (with --random-range-ratio)")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  c->add_option("--prefix-repetition-prefix-len", b->prefix_len, "prefix_repetition: tokens of each shared prefix")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  c->add_option("--prefix-repetition-suffix-len", b->suffix_len, "prefix_repetition: distinct tokens after the prefix")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  c->add_option("--prefix-repetition-num-prefixes", b->num_prefixes, "prefix_repetition: distinct prefixes")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  c->add_option("--dataset-path", b->dataset_path, "prompt file for --dataset-name file: one prompt per line, or .jsonl");
  c->add_option("--dataset-field", b->dataset_field, "the prompt's field in each .jsonl object (e.g. question)")
      ->capture_default_str();
  c->add_option("--random-input-len", b->random_input_len, "prompt tokens of random prompts")->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  c->add_option("--random-output-len,--output-len", b->random_output_len, "output tokens to ask for (random and file prompts)")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  c->add_option("--random-range-ratio", b->random_range_ratio,
                "random lengths drawn from [len * (1 - r), len * (1 + r)], 0 <= r < 1")->capture_default_str();
  c->add_option("--random-prompt-format", b->random_prompt_format,
                "text: random token ids decoded to text (as vLLM); token-ids: sent as an id list (/v1/completions)")
      ->capture_default_str()->check(CLI::IsMember({"text", "token-ids"}));
  c->add_option("--tokenizer", b->tokenizer, "model directory with tokenizer.json (or the file): needed for random prompts");
  c->add_flag("--ignore-eos", b->ignore_eos, "send ignore_eos: every request generates exactly its output length");
  c->add_option("--temperature", b->temperature, "sampling temperature sent (0: greedy)")->capture_default_str();
  c->add_option("--extra-body", b->extra_body, "JSON object merged into every request body, e.g. '{\"top_k\": 5}'");
  c->add_option("--seed", b->seed, "seed of prompts and arrival times")->capture_default_str();
  c->add_option("--percentile-metrics", b->percentile_metrics, "latency metrics in the report: ttft,tpot,itl,e2el")
      ->capture_default_str();
  c->add_option("--metric-percentiles", b->metric_percentiles, "percentiles reported, e.g. 50,90,99")->capture_default_str();
  c->add_option("--json,--save-result", b->json_out, "write every number (and each request) as JSON to this file");
  c->add_flag("--disable-tqdm", b->disable_tqdm, "no progress bar (there is none when stderr is not a terminal)");
  c->add_option("--request-timeout", b->request_timeout, "seconds to wait for the next bytes of a response")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--ab", b->ab_url, "second server B: run A, B, B, A with the same requests and report ratios B / A");
  c->add_option("--ab-model", b->ab_model, "model name on B (default: the first id of B's /v1/models)");
  return b;
}

namespace {

/// A target with its model resolved against GET /v1/models; throws when the server is unreachable.
bench::Target resolve_target(bench::Target t, const std::string& option) {
  const bench::ModelList models = bench::fetch_models(t);
  if (!models.reachable) fail("{}", models.error);
  if (t.model.empty()) {
    if (models.ids.empty()) fail("{} (give the model name with {})", models.error, option);
    t.model = models.ids.front();
  } else if (!models.ids.empty() && std::find(models.ids.begin(), models.ids.end(), t.model) == models.ids.end()) {
    std::fprintf(stderr, "warning: %s does not list the model '%s' (it serves: %s)\n", t.base_url.c_str(),
                 t.model.c_str(), models.ids.front().c_str());
  }
  return t;
}

std::string now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

/// One finished run.
struct Run {
  std::string label;  // "" for a single run, else A1 / B1 / B2 / A2
  const bench::Target* target = nullptr;
  std::vector<RequestOutput> outputs;
  BenchmarkMetrics metrics;
};

}  // namespace

int BenchServeCommand::run() {
  // Options first, so that a mistake is reported before any request is sent.
  const std::vector<std::string> metrics = bench::parse_metric_names(percentile_metrics);
  const std::vector<double> percentiles = bench::parse_percentiles(metric_percentiles);
  MOEFOLD_CHECK(request_rate > 0, "--request-rate must be > 0 requests/s (got {})", request_rate);
  MOEFOLD_CHECK(burstiness > 0 && std::isfinite(burstiness), "--burstiness must be > 0 (got {})", burstiness);
  MOEFOLD_CHECK(!endpoint.empty() && endpoint.front() == '/', "--endpoint {}: must start with '/'", endpoint);
  const bool chat = bench::is_chat_endpoint(endpoint);
  const bool token_ids = random_prompt_format == "token-ids";
  MOEFOLD_CHECK(!(token_ids && chat), "--random-prompt-format token-ids needs a completions endpoint, not {}", endpoint);
  MOEFOLD_CHECK(dataset_name == "file" || dataset_path.empty(), "--dataset-path needs --dataset-name file");
  bench::RequestOptions ropt;
  ropt.ignore_eos = ignore_eos;
  ropt.temperature = temperature;
  if (!extra_body.empty()) {
    ropt.extra_body = nlohmann::json::parse(extra_body, nullptr, false);
    MOEFOLD_CHECK(!ropt.extra_body.is_discarded() && ropt.extra_body.is_object(), "--extra-body: not a JSON object: {}",
                  extra_body);
  }
  std::optional<std::ofstream> json_file;
  if (!json_out.empty()) {
    json_file.emplace(json_out);
    MOEFOLD_CHECK(json_file->good(), "--json {}: cannot open the file for writing", json_out);
  }

  bench::Target a;
  a.base_url = !base_url.empty() ? base_url
                                 : "http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                                       std::to_string(port);
  bench::split_base_url(a.base_url);  // validates
  a.endpoint = endpoint;
  a.model = model;
  a.timeout_s = request_timeout;
  if (const char* key = std::getenv("OPENAI_API_KEY")) a.api_key = key;
  a = resolve_target(a, "--model");
  std::optional<bench::Target> b;
  if (!ab_url.empty()) {
    bench::Target t = a;
    t.base_url = ab_url;
    bench::split_base_url(t.base_url);
    t.model = ab_model;
    b = resolve_target(t, "--ab-model");
  } else {
    MOEFOLD_CHECK(ab_model.empty(), "--ab-model needs --ab URL_B");
  }

  std::optional<Tokenizer> tok;
  if (!tokenizer.empty()) tok = Tokenizer::from_file(tokenizer);
  std::vector<bench::SampleRequest> requests;
  std::vector<bench::Conversation> conversations;  // --dataset-name multi_turn
  const bool multi_turn = dataset_name == "multi_turn";
  if (dataset_name == "random") {
    MOEFOLD_CHECK(tok.has_value(),
                  "--dataset-name random needs --tokenizer DIR (a model directory with tokenizer.json, or the file) "
                  "to draw prompt token ids from");
    requests = bench::sample_random_requests(*tok, {num_prompts, random_input_len, random_output_len,
                                                    random_range_ratio, seed, token_ids});
  } else if (dataset_name == "prefix_repetition") {
    MOEFOLD_CHECK(tok.has_value(), "--dataset-name prefix_repetition needs --tokenizer DIR to draw prompt token ids from");
    requests = bench::sample_prefix_repetition_requests(
        *tok, {num_prompts, prefix_len, suffix_len, num_prefixes, random_output_len, seed, token_ids});
  } else if (dataset_name == "multi_turn") {
    MOEFOLD_CHECK(tok.has_value(), "--dataset-name multi_turn needs --tokenizer DIR to draw message tokens from");
    MOEFOLD_CHECK(!token_ids, "--dataset-name multi_turn sends text (the replies come back as text), not token ids");
    MOEFOLD_CHECK(std::isinf(request_rate), "--dataset-name multi_turn sends each conversation's turns back to back; "
                                            "bound the load with --max-concurrency, not --request-rate");
    conversations = bench::sample_multi_turn_conversations(
        *tok, {num_prompts, mt_turns, mt_shared_prefix_len, mt_prefix_len, mt_user_len, random_output_len,
               random_range_ratio, seed});
  } else {
    requests = bench::sample_file_requests({dataset_path, dataset_field, num_prompts, random_output_len, seed},
                                           tok ? &*tok : nullptr);
  }

  const int64_t total_requests = multi_turn ? num_prompts * mt_turns : num_prompts;
  if (multi_turn)
    std::printf("multi_turn: %lld conversations x %lld turns (shared system prompt %lld tokens + %lld of its own, "
                "user messages %lld tokens, replies up to %lld tokens)\n",
                (long long)num_prompts, (long long)mt_turns, (long long)mt_shared_prefix_len, (long long)mt_prefix_len,
                (long long)mt_user_len, (long long)random_output_len);
  std::printf("bench serve: %lld requests (%s) to %s%s, model %s%s\n", (long long)total_requests, dataset_name.c_str(),
              a.base_url.c_str(), endpoint.c_str(), a.model.c_str(),
              b ? (" and (--ab) " + b->base_url + endpoint + ", model " + b->model).c_str() : "");
  std::printf("traffic request rate: %s, burstiness: %g%s, maximum request concurrency: %s\n",
              std::isinf(request_rate) ? "inf" : fmt::format("{} req/s", request_rate).c_str(), burstiness,
              burstiness == 1.0 ? " (Poisson process)" : "",
              max_concurrency > 0 ? std::to_string(max_concurrency).c_str() : "none");
  std::fflush(stdout);

  // A server that closes a connection while a request is written makes that request fail; it must
  // not kill the client.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<Run> runs;
  if (b)
    runs = {{"A1", &a, {}, {}}, {"B1", &*b, {}, {}}, {"B2", &*b, {}, {}}, {"A2", &a, {}, {}}};
  else
    runs = {{"", &a, {}, {}}};
  for (Run& r : runs) {
    bench::ProgressBar bar(total_requests, !disable_tqdm && bench::stderr_is_terminal(), r.label);
    const bench::Target& target = *r.target;
    bench::RunResult result;
    if (multi_turn) {
      const Tokenizer* t = tok ? &*tok : nullptr;
      result = bench::run_conversations(
          conversations.size(), size_t(mt_turns), max_concurrency,
          [&](size_t c, size_t turn, const std::vector<std::string>& replies, std::chrono::steady_clock::time_point start) {
            try {
              return bench::send_request(target, bench::multi_turn_request(conversations[c], replies, turn, chat, t), ropt,
                                         start);
            } catch (const std::exception& e) {
              RequestOutput o;
              o.error = e.what();
              return o;
            }
          },
          &bar);
    } else {
      const std::vector<double> arrivals = bench::arrival_times(num_prompts, request_rate, burstiness, seed);
      result = bench::run_requests(
          arrivals, max_concurrency,
          [&](size_t i, std::chrono::steady_clock::time_point start) {
            return bench::send_request(target, requests[i], ropt, start);
          },
          &bar);
    }
    bar.close();
    r.outputs = std::move(result.outputs);
    r.metrics = bench::calculate_metrics(r.outputs, result.duration_s, percentiles);
    bench::ReportContext ctx;
    ctx.request_rate = request_rate;
    ctx.max_concurrency = max_concurrency;
    if (!r.label.empty()) ctx.title = "Serving Benchmark Result " + r.label;
    std::printf("%s", bench::format_result(r.metrics, r.outputs, metrics, ctx).c_str());
    std::fflush(stdout);
  }
  std::vector<bench::AbRow> ab_rows;
  if (b) {
    ab_rows = bench::compare_ab(runs[0].metrics, runs[1].metrics, runs[2].metrics, runs[3].metrics, metrics);
    std::printf("%s", bench::format_ab(ab_rows, a.base_url + " (" + a.model + ")", b->base_url + " (" + b->model + ")").c_str());
  }

  if (json_file) {
    auto target_json = [](const bench::Target& t) {
      return Json{{"base_url", t.base_url}, {"endpoint", t.endpoint}, {"model_id", t.model}};
    };
    Json j;
    j["date"] = now_iso8601();
    j["mode"] = b ? "ab" : "single";
    j["base_url"] = a.base_url;
    j["endpoint"] = endpoint;
    j["model_id"] = a.model;
    j["tokenizer_id"] = tokenizer;
    j["dataset_name"] = dataset_name;
    j["dataset_path"] = dataset_path;
    j["num_prompts"] = num_prompts;
    if (multi_turn) {
      j["multi_turn_num_turns"] = mt_turns;
      j["multi_turn_shared_prefix_len"] = mt_shared_prefix_len;
      j["multi_turn_prefix_len"] = mt_prefix_len;
      j["multi_turn_user_len"] = mt_user_len;
    }
    j["request_rate"] = std::isinf(request_rate) ? Json("inf") : Json(request_rate);
    j["burstiness"] = burstiness;
    j["max_concurrency"] = max_concurrency > 0 ? Json(max_concurrency) : Json(nullptr);
    j["seed"] = seed;
    j["random_input_len"] = random_input_len;
    j["random_output_len"] = random_output_len;
    j["random_range_ratio"] = random_range_ratio;
    j["random_prompt_format"] = random_prompt_format;
    j["ignore_eos"] = ignore_eos;
    j["temperature"] = temperature;
    j["percentiles"] = percentiles;
    auto run_json = [&](const Run& r) {
      Json rj = bench::metrics_json(r.metrics, r.outputs);
      rj["requests"] = bench::requests_json(r.outputs);
      return rj;
    };
    if (!b) {
      j.update(run_json(runs[0]));
    } else {
      j["targets"] = {{"a", target_json(a)}, {"b", target_json(*b)}};
      j["runs"] = Json::array();
      for (const Run& r : runs) {
        Json rj = {{"label", r.label}, {"target", r.label[0] == 'A' ? "a" : "b"}};
        rj.update(run_json(r));
        j["runs"].push_back(std::move(rj));
      }
      j["comparison"] = bench::ab_json(ab_rows);
    }
    *json_file << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
    json_file->close();
    MOEFOLD_CHECK(json_file->good(), "--json {}: writing failed", json_out);
  }
  int rc = 0;
  for (const Run& r : runs) {
    if (r.metrics.completed > 0) continue;
    const std::string first = r.outputs.empty() ? "" : r.outputs.front().error;
    std::fprintf(stderr, "error: no request completed%s%s; first error: %s\n", r.label.empty() ? "" : " in run ",
                 r.label.c_str(), first.c_str());
    rc = 1;
  }
  return rc;
}

}  // namespace moefold
