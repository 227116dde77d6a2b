// OpenAI response bodies (contract: responses.h).
#include "server/responses.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <random>

#include "core/error.h"
#include "text/unicode.h"

namespace moefold::server {

namespace {

std::string make_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ uint64_t(rd());
  }();
  return fmt::format("{}-{:016x}{:08x}", prefix, salt, counter.fetch_add(1) & 0xffffffffu);
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

ResponseBuilder::ResponseBuilder(const ParsedRequest& req, const Tokenizer& tokenizer)
    : req_(req), tok_(tokenizer), id_(make_id(req.api == Api::kChat ? "chatcmpl" : "cmpl")),
      created_(req.created != 0 ? req.created
                                : std::chrono::duration_cast<std::chrono::seconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count()) {}

ResponseBuilder::Json ResponseBuilder::base(const char* object) const {
  return Json{{"id", id_}, {"object", object}, {"created", created_}, {"model", req_.model}};
}

std::string ResponseBuilder::token_text(int32_t id) const {
  if (req_.tokens_as_ids) return fmt::format("token_id:{}", id);
  try {
    return unicode::decode_lossy(tok_.token_bytes(id));
  } catch (const Error&) {
    return "";
  }
}

ResponseBuilder::Json ResponseBuilder::chat_logprobs(const std::vector<GeneratedToken>& tokens) const {
  auto entry = [&](int32_t id, float lp) {
    Json bytes = Json::array();
    try {
      for (unsigned char c : tok_.token_bytes(id)) bytes.push_back(int(c));
    } catch (const Error&) {
    }
    return Json{{"token", token_text(id)}, {"logprob", lp}, {"bytes", bytes}};
  };
  Json content = Json::array();
  for (const GeneratedToken& t : tokens) {
    Json e = entry(t.id, t.logprob);
    Json top = Json::array();
    for (const TokenLogprob& a : t.top) top.push_back(entry(a.token, a.logprob));
    e["top_logprobs"] = top;
    content.push_back(std::move(e));
  }
  return Json{{"content", content}};
}

ResponseBuilder::Json ResponseBuilder::completion_logprobs(const std::vector<GeneratedToken>& tokens,
                                                           int64_t& text_offset) const {
  Json toks = Json::array(), lps = Json::array(), tops = Json::array(), offs = Json::array();
  for (const GeneratedToken& t : tokens) {
    const std::string s = token_text(t.id);
    toks.push_back(s);
    lps.push_back(t.logprob);
    offs.push_back(text_offset);
    text_offset += utf8_length(s);
    if (req_.top_logprobs > 0) {
      Json top = Json::object();
      for (const TokenLogprob& a : t.top) {
        const std::string k = token_text(a.token);
        if (!top.contains(k)) top[k] = a.logprob;  // several tokens can share a spelling
      }
      tops.push_back(std::move(top));
    } else {
      tops.push_back(nullptr);
    }
  }
  return Json{{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

ResponseBuilder::Json ResponseBuilder::logprobs(const std::vector<GeneratedToken>& tokens, int64_t& text_offset) const {
  if (!req_.logprobs) return nullptr;
  return req_.api == Api::kChat ? chat_logprobs(tokens) : completion_logprobs(tokens, text_offset);
}

ResponseBuilder::Json ResponseBuilder::usage(int64_t completion_tokens) const {
  const int64_t prompt = req_.prompt_tokens();
  return Json{{"prompt_tokens", prompt},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt + completion_tokens},
              {"prompt_tokens_details", Json{{"cached_tokens", cached_tokens_}}}};
}

ResponseBuilder::Json ResponseBuilder::message(const ChoiceResult& c) const {
  if (!req_.parses_output()) return Json{{"role", "assistant"}, {"content", c.text}};
  const ChatMessage& m = c.message;
  Json out = {{"role", "assistant"}};
  if (m.content.empty() && !m.tool_calls.empty()) out["content"] = nullptr;
  else out["content"] = m.content;
  if (!req_.reasoning_parser.empty()) out["reasoning_content"] = m.has_reasoning ? Json(m.reasoning) : Json(nullptr);
  if (!m.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCall& t : m.tool_calls)
      calls.push_back(Json{{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
    out["tool_calls"] = std::move(calls);
  }
  return out;
}

ResponseBuilder::Json ResponseBuilder::delta_chunk(int32_t index, const OutputDelta& d,
                                                  const std::vector<GeneratedToken>& tokens, FinishReason finish,
                                                  bool called_tools) const {
  Json out = base("chat.completion.chunk");
  Json delta = Json::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty() || (d.reasoning.empty() && d.tool_calls.empty() && finish == FinishReason::kNone))
    delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCallDelta& t : d.tool_calls) {
      Json c = {{"index", t.index}};
      Json f = Json::object();
      if (!t.id.empty()) {
        c["id"] = t.id;
        c["type"] = "function";
        f["name"] = t.name;
      }
      f["arguments"] = t.arguments;
      c["function"] = std::move(f);
      calls.push_back(std::move(c));
    }
    delta["tool_calls"] = std::move(calls);
  }
  Json ch = {{"index", index}, {"delta", std::move(delta)}};
  int64_t unused_offset = 0;
  ch["logprobs"] = logprobs(tokens, unused_offset);
  if (finish == FinishReason::kNone) ch["finish_reason"] = nullptr;
  else if (called_tools && finish == FinishReason::kStop) ch["finish_reason"] = "tool_calls";
  else ch["finish_reason"] = std::string(finish_reason_name(finish));
  out["choices"] = Json::array({std::move(ch)});
  if (req_.include_usage) out["usage"] = nullptr;
  return out;
}

ResponseBuilder::Json ResponseBuilder::response(const std::vector<ChoiceResult>& choices) const {
  const bool chat = req_.api == Api::kChat;
  Json out = base(chat ? "chat.completion" : "text_completion");
  Json arr = Json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    completion_tokens += int64_t(c.tokens.size());
    int64_t offset = 0;
    Json ch = {{"index", i}};
    if (chat) ch["message"] = message(c);
    else ch["text"] = c.text;
    ch["logprobs"] = logprobs(c.tokens, offset);
    const bool called = chat && req_.parses_output() && !c.message.tool_calls.empty();
    ch["finish_reason"] = called && c.finish == FinishReason::kStop ? std::string("tool_calls")
                                                                    : std::string(finish_reason_name(c.finish));
    arr.push_back(std::move(ch));
  }
  out["choices"] = std::move(arr);
  out["usage"] = usage(completion_tokens);
  return out;
}

ResponseBuilder::Json ResponseBuilder::role_chunk(int32_t index) const {
  Json out = base("chat.completion.chunk");
  out["choices"] = Json::array(
      {Json{{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
            {"finish_reason", nullptr}}});
  if (req_.include_usage) out["usage"] = nullptr;
  return out;
}

ResponseBuilder::Json ResponseBuilder::chunk(int32_t index, const std::string& text,
                                            const std::vector<GeneratedToken>& tokens, FinishReason finish,
                                            int64_t& text_offset) const {
  const bool chat = req_.api == Api::kChat;
  Json out = base(chat ? "chat.completion.chunk" : "text_completion");
  Json ch = {{"index", index}};
  if (chat) {
    Json delta = Json::object();
    if (!text.empty() || finish == FinishReason::kNone) delta["content"] = text;
    ch["delta"] = std::move(delta);
  } else {
    ch["text"] = text;
  }
  ch["logprobs"] = logprobs(tokens, text_offset);
  if (finish == FinishReason::kNone) ch["finish_reason"] = nullptr;
  else ch["finish_reason"] = std::string(finish_reason_name(finish));
  out["choices"] = Json::array({std::move(ch)});
  if (req_.include_usage) out["usage"] = nullptr;
  return out;
}

ResponseBuilder::Json ResponseBuilder::usage_chunk(int64_t completion_tokens) const {
  const bool chat = req_.api == Api::kChat;
  Json out = base(chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = Json::array();
  out["usage"] = usage(completion_tokens);
  return out;
}

}  // namespace moefold::server
