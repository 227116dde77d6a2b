// Structured-output request fields -> a ConstraintSpec (runtime/grammar_constraint.h).
//
// Accepted (at most one constraint per request; two are a 400):
//   response_format: {"type": "text"}                                       no constraint
//                    {"type": "json_object"}                                any JSON object
//                    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
//                    {"type": "structural_tag", "format": {...}}            xgrammar structural tag
//   structured_outputs (vLLM >= 0.10): {"json": schema | string, "regex": string,
//                    "choice": [string], "grammar": string, "json_object": true,
//                    "structural_tag": string}                              exactly one key set
//   guided_json, guided_regex, guided_choice, guided_grammar (vLLM's older names);
//   guided_decoding_backend is accepted and ignored (xgrammar is the one backend).
// Every malformed field is an ApiError 400 naming it.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>

#include "runtime/grammar_constraint.h"

namespace moefold::server {

/// The constraint the body asks for, or nullopt. `param` receives the name of the field it came
/// from ("response_format", "structured_outputs.json", "guided_regex", ...), for error messages.
/// Throws ApiError 400 for a malformed or ambiguous field.
std::optional<ConstraintSpec> parse_structured_output(const nlohmann::ordered_json& body, std::string& param);

}  // namespace moefold::server
