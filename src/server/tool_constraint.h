// The grammar that enforces tool_choice "required" and named functions: an xgrammar structural
// tag whose text is one or more tool calls in the request's parser format, with arguments that
// follow each tool's parameters schema:
//   qwen3_coder: <tool_call>\n<function=NAME>\n + the parameters as <parameter=P>...</parameter>
//                (xgrammar's qwen_xml_parameter) + </function>\n</tool_call>
//   hermes:      <tool_call>\n{"name": "NAME", "arguments": + JSON of the schema + }\n</tool_call>
// "required" allows any of the tools, several calls separated by a newline (one with
// parallel_tool_calls false); a named choice allows exactly one call of that function. Nothing
// else may come before, between or after the calls; then only EOS. When the prompt opened a think
// block and the server splits reasoning, the grammar first closes it ("</think>\n\n": an empty
// thought), so the calls come where the model's template puts them.
#pragma once
#include <string>

#include "runtime/grammar_constraint.h"
#include "server/tool_request.h"

namespace moefold::server {

/// The structural tag ({"type": "structural_tag", "format": ...}) for a forced tool choice;
/// `prefix` (e.g. "</think>\n\n" when the prompt opened a think block) is forced first.
/// Precondition: req.forced() and req.parser is "qwen3_coder" or "hermes" (else Error).
std::string tool_call_structural_tag(const ToolRequest& req, const std::string& prefix = "");

/// ConstraintSpec::structural_tag of tool_call_structural_tag(req, prefix).
ConstraintSpec tool_call_constraint(const ToolRequest& req, const std::string& prefix = "");

}  // namespace moefold::server
