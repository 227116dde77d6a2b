// Argument helpers shared by the Jinja built-ins (filters, tests, methods): positional-or-keyword
// lookup with Python-style defaults. Internal to src/text/jinja_*.cc.
#pragma once

#include <optional>
#include <string>

#include "core/error.h"
#include "text/jinja_value.h"

namespace moefold::jinja {

/// Positional argument `i` or keyword `name`, else `dflt`.
inline Value arg_or(const CallArgs& a, size_t i, const std::string& name, const Value& dflt) {
  const Value* v = a.get(i, name);
  return v ? *v : dflt;
}

/// Optional string argument (None/Undefined count as absent); throws for other types.
inline std::optional<std::string> opt_string(const CallArgs& a, size_t i, const std::string& name) {
  const Value* v = a.get(i, name);
  if (!v || v->is_none() || v->is_undefined()) return std::nullopt;
  if (!v->is_string()) fail("argument '{}' must be a string, not {}", name, v->type_name());
  return v->as_string();
}

/// Required string argument.
inline std::string req_string(const CallArgs& a, size_t i, const std::string& name) {
  auto s = opt_string(a, i, name);
  if (!s) fail("missing required argument '{}'", name);
  return *s;
}

/// Optional integer argument (None/Undefined count as absent).
inline int64_t opt_int(const CallArgs& a, size_t i, const std::string& name, int64_t dflt) {
  const Value* v = a.get(i, name);
  if (!v || v->is_none() || v->is_undefined()) return dflt;
  if (!v->is_int() && !v->is_bool()) fail("argument '{}' must be an integer, not {}", name, v->type_name());
  return v->as_int();
}

/// Optional argument read by truthiness.
inline bool opt_bool(const CallArgs& a, size_t i, const std::string& name, bool dflt) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : dflt;
}

/// Throws the error an Undefined value stands for.
[[noreturn]] inline void fail_undefined(const Value& v) { fail("{}", v.undefined_hint()); }

}  // namespace moefold::jinja
