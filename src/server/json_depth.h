// Nesting depth of request JSON. Parsing (nlohmann's SAX parser) and destroying a JSON value are
// iterative, but copying, comparing, dump() and the conversion into chat-template values recurse
// once per level: a body nested 30,000 levels deep (60 KB) would overflow an HTTP thread's
// stack. Every request body is therefore checked right after parsing, before anything else
// touches it.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>

namespace moefold::server {

/// Deepest nesting of arrays / objects a request body may have: {"a": [1]} has depth 2, a
/// scalar 0. Far above what any real request (tool JSON schemas included) needs.
inline constexpr int kMaxRequestJsonDepth = 64;

/// The nesting depth of `v` (0 for a scalar, 1 for a flat array or object, ...), counted without
/// recursion; the walk stops as soon as the depth exceeds `stop_above` and returns that value.
int json_depth(const nlohmann::ordered_json& v, int stop_above = kMaxRequestJsonDepth);

}  // namespace moefold::server
