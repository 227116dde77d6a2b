// OpenAI request parsing and validation (contract: request_parser.h).
#include "server/request_parser.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_depth.h"
#include "server/structured_output.h"
#include "server/reasoning_parser.h"
#include "server/tool_constraint.h"
#include "text/unicode.h"

namespace moefold::server {

using Json = nlohmann::ordered_json;

namespace {

const char* type_name(const Json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

/// The field, or nullptr when absent or null (null means "use the default", as in OpenAI's API).
const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const Json& body, const char* name, bool def) {
  const Json* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) bad_request(name, "'{}' must be a boolean, got {}.", name, type_name(*v));
  return v->get<bool>();
}

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

/// An integer in [lo, hi]. Integral floats (3.0) count as integers; fractions, other types and
/// anything outside [lo, hi] (also beyond 64 bits) are a 400 naming the field. Note that nlohmann
/// reports unsigned values as is_number_integer() too: they are checked before any conversion.
int64_t as_int(const Json& v, const char* name, int64_t lo = std::numeric_limits<int64_t>::min(),
               int64_t hi = std::numeric_limits<int64_t>::max()) {
  auto out_of_range = [&](const std::string& shown) {
    bad_request(name, "'{}' must be an integer in [{}, {}], got {}.", name, lo, hi, clip(shown));
  };
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) out_of_range(std::to_string(u));
    x = int64_t(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d))
      bad_request(name, "'{}' must be an integer, got {}.", name, clip(v.dump()));
    // JSON integers within 64 bits parse as integers; a float this large is either written with
    // an exponent or an integer literal beyond 64 bits rounded to a double: not exact, refused.
    if (std::fabs(d) >= 9007199254740992.0) out_of_range(v.dump());
    x = int64_t(d);
  } else {
    bad_request(name, "'{}' must be an integer, got {}.", name, type_name(v));
  }
  if (x < lo || x > hi) out_of_range(std::to_string(x));
  return x;
}

std::optional<int64_t> get_int(const Json& body, const char* name, int64_t lo = std::numeric_limits<int64_t>::min(),
                               int64_t hi = std::numeric_limits<int64_t>::max()) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  return as_int(*v, name, lo, hi);
}

std::optional<double> get_number(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request(name, "'{}' must be a number, got {}.", name, type_name(*v));
  return v->get<double>();
}

std::vector<int32_t> token_ids(const Json& arr, const char* name, const ModelInfo& info) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const Json& t : arr) {
    if (!(t.is_number_integer() || t.is_number_unsigned()))
      bad_request(name, "'{}' must be a string, a list of token ids, or a list of those; found {} in a token list.",
                  name, type_name(t));
    const int64_t id = as_int(t, name);
    if (id < 0 || id >= info.vocab_size)
      bad_request(name, "Token id {} in '{}' is out of vocabulary [0, {}).", id, name, info.vocab_size);
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<int32_t> encode(const ModelInfo& info, const std::string& text, bool add_special, const char* name) {
  try {
    return info.tokenizer->encode(text, add_special);
  } catch (const Error& e) {
    bad_request(name, "Could not tokenize '{}': {}", name, clip(e.what(), 4 * kMaxEchoedChars));
  }
}

/// Completions: "prompt" as a string, a token list, or a list of strings / token lists.
std::vector<std::vector<int32_t>> completion_prompts(const Json& body, const ModelInfo& info, bool add_special) {
  const Json* p = field(body, "prompt");
  if (!p) bad_request("prompt", "'prompt' is required.");
  std::vector<std::vector<int32_t>> out;
  if (p->is_string()) {
    out.push_back(encode(info, p->get<std::string>(), add_special, "prompt"));
  } else if (p->is_array()) {
    if (p->empty()) bad_request("prompt", "'prompt' is empty.");
    if ((*p)[0].is_number()) {
      out.push_back(token_ids(*p, "prompt", info));
    } else {
      for (const Json& item : *p) {
        if (item.is_string()) out.push_back(encode(info, item.get<std::string>(), add_special, "prompt"));
        else if (item.is_array()) out.push_back(token_ids(item, "prompt", info));
        else
          bad_request("prompt", "'prompt' must be a string, a list of token ids, or a list of those; found {}.",
                      type_name(item));
      }
    }
  } else {
    bad_request("prompt", "'prompt' must be a string, a list of token ids, or a list of those; got {}.",
                type_name(*p));
  }
  for (const auto& ids : out)
    if (ids.empty()) bad_request("prompt", "The prompt is empty.");
  return out;
}

/// Chat: validates "messages", flattens text-part lists to strings, parses the tool fields into
/// r.tools, renders the chat template (the text goes to r.prompt_text).
std::vector<int32_t> chat_prompt(const Json& body, const ModelInfo& info, ParsedRequest& r) {
  const Json* m = field(body, "messages");
  if (!m) bad_request("messages", "'messages' is required.");
  if (!m->is_array()) bad_request("messages", "'messages' must be an array, got {}.", type_name(*m));
  if (m->empty()) bad_request("messages", "'messages' must contain at least one message.");
  Json messages = Json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& msg = (*m)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!msg.is_object()) bad_request(where, "'{}' must be an object, got {}.", where, type_name(msg));
    const Json* role = field(msg, "role");
    if (!role || !role->is_string()) bad_request(where + ".role", "'{}.role' must be a string.", where);
    Json copy = msg;
    auto c = msg.find("content");
    if (c != msg.end() && c->is_array()) {
      std::string text;
      for (const Json& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          bad_request(where + ".content",
                      "'{}.content' parts must be objects {{\"type\": \"text\", \"text\": string}} (only text is "
                      "supported).",
                      where);
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      copy["content"] = text;
    } else if (c != msg.end() && !c->is_string() && !c->is_null()) {
      bad_request(where + ".content", "'{}.content' must be a string, an array of parts or null, got {}.", where,
                  type_name(*c));
    }
    messages.push_back(std::move(copy));
  }
  if (!info.chat_template)
    bad_request("messages", "This model has no chat template; use /v1/completions with a prompt instead.");
  r.tools = parse_tool_request(body, info.tool_serving);
  prepare_tool_messages(messages);
  Json tools = nullptr;
  if (const Json* t = field(body, "tools")) tools = *t;
  Json kwargs = Json::object();
  if (const Json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object.");
    kwargs = *k;
  }
  const bool add_generation_prompt = get_bool(body, "add_generation_prompt", true);
  std::string text;
  try {
    text = info.chat_template->render(messages, tools, add_generation_prompt, kwargs);
  } catch (const Error& e) {
    bad_request("messages", "The chat template failed on these messages: {}", clip(e.what(), 4 * kMaxEchoedChars));
  }
  std::vector<int32_t> ids = encode(info, text, get_bool(body, "add_special_tokens", false), "messages");
  if (ids.empty()) bad_request("messages", "The prompt is empty.");
  r.reasoning_parser = info.reasoning_parser;
  r.prompt_text = std::move(text);
  return ids;
}

void parse_stop(const Json& body, SamplingParams& p) {
  if (const Json* s = field(body, "stop")) {
    if (s->is_string()) {
      p.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const Json& x : *s) {
        if (!x.is_string()) bad_request("stop", "'stop' must be a string or a list of strings.");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      bad_request("stop", "'stop' must be a string or a list of strings, got {}.", type_name(*s));
    }
    for (const auto& x : p.stop)
      if (x.empty()) bad_request("stop", "'stop' cannot contain an empty string.");
  }
  if (const Json* s = field(body, "stop_token_ids")) {
    if (!s->is_array()) bad_request("stop_token_ids", "'stop_token_ids' must be a list of token ids.");
    for (const Json& x : *s) p.stop_token_ids.push_back(int32_t(as_int(x, "stop_token_ids", 0, kInt32Max)));
  }
}

/// The sampling fields shared by both APIs. Range checks: SamplingParams::validate().
void parse_sampling(const Json& body, const ModelInfo& info, ParsedRequest& r) {
  SamplingParams& p = r.params;
  const SamplingDefaults& d = info.sampling_defaults;
  if (d.temperature) p.temperature = *d.temperature;
  if (d.top_p) p.top_p = *d.top_p;
  if (d.top_k) p.top_k = *d.top_k;
  if (d.min_p) p.min_p = *d.min_p;
  if (d.repetition_penalty) p.repetition_penalty = *d.repetition_penalty;
  if (auto v = get_number(body, "temperature")) p.temperature = float(*v);
  if (auto v = get_number(body, "top_p")) p.top_p = float(*v);
  if (auto v = get_int(body, "top_k", -1, kInt32Max)) p.top_k = int32_t(*v);
  if (auto v = get_number(body, "min_p")) p.min_p = float(*v);
  if (auto v = get_number(body, "presence_penalty")) p.presence_penalty = float(*v);
  if (auto v = get_number(body, "frequency_penalty")) p.frequency_penalty = float(*v);
  if (auto v = get_number(body, "repetition_penalty")) p.repetition_penalty = float(*v);
  if (auto v = get_int(body, "seed")) p.seed = *v;
  p.ignore_eos = get_bool(body, "ignore_eos", false);
  parse_stop(body, p);
  if (r.api == Api::kChat) {
    r.logprobs = get_bool(body, "logprobs", false);
    if (auto v = get_int(body, "top_logprobs", 0, SamplingParams::kMaxTopLogprobs)) r.top_logprobs = int32_t(*v);
    if (r.top_logprobs > 0 && !r.logprobs)
      bad_request("top_logprobs", "'logprobs' must be true when 'top_logprobs' is used.");
  } else if (auto v = get_int(body, "logprobs", 0, SamplingParams::kMaxTopLogprobs)) {
    r.logprobs = true;
    r.top_logprobs = int32_t(*v);
  }
  p.logprobs = r.logprobs;
  p.top_logprobs = r.top_logprobs;
  try {
    p.validate();
  } catch (const Error& e) {
    std::string msg = e.what();
    bad_request(msg.substr(0, msg.find(' ')), "{}", msg);
  }
}

void reject_unsupported(const Json& body, Api api) {
  if (api == Api::kCompletions) {
    if (get_bool(body, "echo", false)) bad_request("echo", "'echo' is not supported.");
    if (field(body, "suffix")) bad_request("suffix", "'suffix' is not supported.");
    if (auto b = get_int(body, "best_of"); b && *b != 1) bad_request("best_of", "'best_of' is not supported.");
  }
  if (const Json* lb = field(body, "logit_bias"); lb && !(lb->is_object() && lb->empty()))
    bad_request("logit_bias", "'logit_bias' is not supported.");
}

}  // namespace

int64_t ParsedRequest::prompt_tokens() const {
  int64_t n_tokens = 0;
  for (const auto& p : prompts) n_tokens += int64_t(p.size());
  return n_tokens;
}

std::vector<ChoiceSpec> ParsedRequest::choices() const {
  std::vector<ChoiceSpec> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int32_t j = 0; j < n; ++j) {
      ChoiceSpec c{prompts[i], params, skip_special_tokens};
      c.params.max_tokens = max_tokens[i];
      if (params.seed) c.params.seed = int64_t(uint64_t(*params.seed) + uint64_t(j));
      out.push_back(std::move(c));
    }
  }
  return out;
}

ParsedRequest parse_request(Api api, const std::string& raw, const ModelInfo& info) {
  const size_t valid = unicode::valid_prefix_length(raw);
  if (valid != raw.size())
    throw ApiError(400, fmt::format("The request body is not valid UTF-8 (byte offset {}).", valid),
                   "invalid_request_error", "", "invalid_utf8");
  Json body;
  try {
    body = Json::parse(raw);
  } catch (const std::exception& e) {
    throw ApiError(400, fmt::format("The request body is not valid JSON: {}", clip(e.what(), 2 * kMaxEchoedChars)),
                   "invalid_request_error", "", "invalid_json");
  }
  // Before anything copies, compares or converts the body (all recursive): see json_depth.h.
  if (json_depth(body) > kMaxRequestJsonDepth)
    throw ApiError(400,
                   fmt::format("The request body nests arrays / objects more than {} levels deep (the limit).",
                               kMaxRequestJsonDepth),
                   "invalid_request_error", "", "json_too_deep");
  if (!body.is_object())
    throw ApiError(400, fmt::format("The request body must be a JSON object, got {}.", type_name(body)),
                   "invalid_request_error", "", "invalid_json");

  ParsedRequest r;
  r.api = api;
  if (const Json* m = field(body, "model")) {
    if (!m->is_string()) bad_request("model", "'model' must be a string, got {}.", type_name(*m));
    r.model = m->get<std::string>();
    if (r.model != info.name)
      throw ApiError(400,
                     fmt::format("The model '{}' does not exist; this server serves '{}'.", clip(r.model), info.name),
                     "invalid_request_error", "model", "model_not_found");
  } else {
    r.model = info.name;
  }
  reject_unsupported(body, api);

  if (auto v = get_int(body, "n", 1, info.max_n)) r.n = int32_t(*v);
  r.stream = get_bool(body, "stream", false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_request("stream_options", "'stream_options' must be an object.");
    if (!r.stream) bad_request("stream_options", "'stream_options' is only allowed when 'stream' is true.");
    r.include_usage = get_bool(*so, "include_usage", false);
  }
  r.tokens_as_ids = get_bool(body, "return_tokens_as_token_ids", false);
  r.skip_special_tokens = get_bool(body, "skip_special_tokens", true);
  parse_sampling(body, info, r);

  std::optional<int64_t> max_tokens = get_int(body, "max_completion_tokens");
  const char* max_name = "max_completion_tokens";
  if (!max_tokens) {
    max_tokens = get_int(body, "max_tokens");
    max_name = "max_tokens";
  }
  if (max_tokens && *max_tokens <= 0)
    bad_request(max_name, "'{}' must be at least 1, got {}.", max_name, *max_tokens);

  if (api == Api::kChat) r.prompts.push_back(chat_prompt(body, info, r));
  else r.prompts = completion_prompts(body, info, get_bool(body, "add_special_tokens", true));

  for (const auto& p : r.prompts) {
    const int64_t len = int64_t(p.size());
    if (len >= info.max_model_len)
      bad_request(api == Api::kChat ? "messages" : "prompt",
                  "This model's maximum context length is {} tokens. However, your prompt has {} tokens, which "
                  "leaves no room for a completion.",
                  info.max_model_len, len);
    const int64_t room = info.max_model_len - len;
    if (max_tokens && *max_tokens > room)
      bad_request(max_name,
                  "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the "
                  "prompt, {} for the completion). Please reduce the prompt or the completion length.",
                  info.max_model_len, len + *max_tokens, len, *max_tokens);
    const int64_t def = api == Api::kChat ? room : std::min<int64_t>(16, room);
    r.max_tokens.push_back(int32_t(max_tokens.value_or(def)));
  }

  // Structured output last: compiling a grammar is the most expensive check.
  std::string so_param;
  if (std::optional<ConstraintSpec> spec = parse_structured_output(body, so_param)) {
    if (!info.grammar) bad_request(so_param, "Structured output ('{}') is not available on this server.", so_param);
    try {
      r.params.constraint = info.grammar->compile(*spec);
    } catch (const ConstraintError& e) {
      throw ApiError(400, fmt::format("'{}' cannot be enforced: {}", so_param, clip(e.what(), 8 * kMaxEchoedChars)),
                     "invalid_request_error", so_param, std::string("invalid_") + spec->kind_name());
    }
  }
  // tool_choice "required" / named: the output is tool calls, enforced by the grammar.
  if (r.tools.forced()) {
    if (r.params.constraint)
      bad_request("tool_choice", "'tool_choice' \"required\" or a named function cannot be combined with '{}'.",
                  so_param);
    if (!info.grammar) bad_request("tool_choice", "Forced tool calls are not available on this server (no grammar engine).");
    // With reasoning split, an open think block is closed first (empty), so that the calls come
    // after it as the template expects and the split stays right; else the output starts constrained.
    const bool close_think = !r.reasoning_parser.empty() && prompt_opens_think(r.prompt_text);
    try {
      r.params.constraint = info.grammar->compile(tool_call_constraint(r.tools, close_think ? "</think>\n\n" : ""));
    } catch (const ConstraintError& e) {
      throw ApiError(400, fmt::format("The tools' parameters cannot be enforced: {}", clip(e.what(), 8 * kMaxEchoedChars)),
                     "invalid_request_error", "tools", "invalid_tool_schema");
    }
    if (!close_think) r.reasoning_parser.clear();
  } else if (r.params.constraint) {
    // Any other constraint holds from the first generated token, so the output has no think
    // block: it is not split (else the whole output would land in reasoning_content).
    r.reasoning_parser.clear();
  }
  return r;
}

}  // namespace moefold::server
