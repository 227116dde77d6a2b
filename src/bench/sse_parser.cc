// SSE parsing and OpenAI stream chunks (contract: sse_parser.h).
#include "bench/sse_parser.h"

#include <nlohmann/json.hpp>

namespace moefold::bench {

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> out;
  for (char c : bytes) {
    const bool skip_lf = after_cr_ && c == '\n';
    after_cr_ = c == '\r';
    if (skip_lf) continue;
    if (c == '\r' || c == '\n') {
      line(partial_, out);
      partial_.clear();
    } else {
      partial_.push_back(c);
    }
  }
  return out;
}

void SseParser::line(std::string_view l, std::vector<std::string>& out) {
  if (l.empty()) {
    if (has_data_) out.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.front() == ':') return;  // comment
  const size_t colon = l.find(':');
  const std::string_view field = l.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

namespace {

using Json = nlohmann::json;

std::optional<int64_t> int_field(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

void append_string(const Json& obj, const char* key, std::string& out) {
  auto it = obj.find(key);
  if (it != obj.end() && it->is_string()) out += it->get_ref<const std::string&>();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

}  // namespace

StreamChunk parse_stream_chunk(std::string_view data) {
  StreamChunk chunk;
  data = trim(data);
  if (data == "[DONE]") {
    chunk.kind = StreamChunk::Kind::kDone;
    return chunk;
  }
  const Json j = Json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    chunk.kind = StreamChunk::Kind::kError;
    chunk.error = "malformed stream event: " + std::string(data.substr(0, 200));
    return chunk;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    chunk.kind = StreamChunk::Kind::kError;
    if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
      chunk.error = (*e)["message"].get<std::string>();
    else
      chunk.error = e->is_string() ? e->get<std::string>() : e->dump();
    return chunk;
  }
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty() && (*c)[0].is_object()) {
    chunk.has_choices = true;
    const Json& choice = (*c)[0];
    append_string(choice, "text", chunk.text);
    if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
      append_string(*d, "reasoning_content", chunk.text);
      append_string(*d, "reasoning", chunk.text);
      append_string(*d, "content", chunk.text);
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    chunk.prompt_tokens = int_field(*u, "prompt_tokens");
    chunk.completion_tokens = int_field(*u, "completion_tokens");
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
      chunk.cached_tokens = int_field(*d, "cached_tokens");
  }
  return chunk;
}

}  // namespace moefold::bench
