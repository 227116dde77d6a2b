// Delta accumulation (contract: output_delta.h).
#include "server/tool_parsers/output_delta.h"

namespace moefold::server {

void OutputDelta::append(const OutputDelta& o) {
  reasoning += o.reasoning;
  content += o.content;
  for (const ToolCallDelta& d : o.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == d.index && d.id.empty()) {
      tool_calls.back().arguments += d.arguments;
      continue;
    }
    tool_calls.push_back(d);
  }
}

void ChatMessage::append(const OutputDelta& d) {
  if (!d.reasoning.empty()) has_reasoning = true;
  reasoning += d.reasoning;
  content += d.content;
  for (const ToolCallDelta& t : d.tool_calls) {
    if (t.index < 0) continue;
    if (size_t(t.index) >= tool_calls.size()) tool_calls.resize(size_t(t.index) + 1);
    ToolCall& c = tool_calls[size_t(t.index)];
    if (!t.id.empty()) c.id = t.id;
    if (!t.name.empty()) c.name = t.name;
    c.arguments += t.arguments;
  }
}

}  // namespace moefold::server
