// Reasoning split + tool-call parsing per choice (contract: chat_output.h).
#include "server/chat_output.h"

namespace moefold::server {

ChatOutputOptions chat_output_options(const ParsedRequest& req) {
  ChatOutputOptions o;
  o.reasoning_parser = req.reasoning_parser;
  o.prompt = req.prompt_text;
  o.tool_parser = req.tools.parser;
  o.tools = req.tools.tools;
  return o;
}

ChatOutputParser::ChatOutputParser(const ChatOutputOptions& o) {
  if (!o.reasoning_parser.empty()) reasoning_.emplace(o.reasoning_parser, o.prompt);
  if (!o.tool_parser.empty()) tools_ = make_tool_parser(o.tool_parser, o.tools, o.make_id);
}

void ChatOutputParser::route(OutputDelta& d, bool final) {
  if (!tools_) return;
  OutputDelta t;
  tools_->feed(d.content, t);
  if (final) tools_->finish(t);
  d.content = std::move(t.content);
  d.tool_calls = std::move(t.tool_calls);
}

OutputDelta ChatOutputParser::feed(std::string_view text) {
  OutputDelta d;
  if (reasoning_) reasoning_->feed(text, d);
  else d.content = std::string(text);
  route(d, false);
  return d;
}

OutputDelta ChatOutputParser::finish() {
  OutputDelta d;
  if (reasoning_) reasoning_->finish(d);
  route(d, true);
  return d;
}

ChatMessage ChatOutputParser::parse(std::string_view text) {
  ChatMessage m;
  m.append(feed(text));
  m.append(finish());
  return m;
}

}  // namespace moefold::server
