// Jinja built-ins: filters (jinja_filters.cc), tests, Python methods on str/dict/list values, attribute and item
// lookup, and the global functions HF exposes to chat templates.
#pragma once

#include <functional>
#include <string>

#include "text/jinja_value.h"

namespace moefold::jinja {

/// True if `name` is a filter this engine implements.
bool is_known_filter(const std::string& name);
/// True if `name` is a test this engine implements.
bool is_known_test(const std::string& name);

/// Applies filter `name` to `v` with the call-site arguments.
Value apply_filter(const std::string& name, const Value& v, const CallArgs& args);
/// Evaluates test `name` on `v` (without negation).
bool apply_test(const std::string& name, const Value& v, const CallArgs& args);

/// Jinja attribute lookup (`obj.name`): Python attributes/methods first, then items.
Value get_attr(const Value& obj, const std::string& name);
/// Jinja subscript lookup (`obj[key]`): items first, then attributes for string keys.
Value get_item(const Value& obj, const Value& key);
/// Calls method `name` of `obj` (e.g. str.split, dict.get). Falls back to calling a callable
/// attribute. Throws moefold::Error when there is no such method.
Value call_method(const Value& obj, const std::string& name, const CallArgs& args);
/// Calls a callable value.
Value call_value(const Value& callee, const CallArgs& args);

/// Iterates a value as a Jinja `for` loop does: list items, dict keys, string characters;
/// Undefined iterates as empty. Throws moefold::Error for non-iterables.
ValueList iterate(const Value& v);

/// Python `list(d.items())` as a list of (key, value) tuples; Undefined gives an empty list.
Value dict_items(const Value& v);

/// Python `x in container`.
bool value_contains(const Value& container, const Value& x);

/// Global functions available to every template: range, namespace, dict, raise_exception,
/// strftime_now. `raise_exception` throws moefold::Error with the template's message.
ValueDict default_globals();

}  // namespace moefold::jinja
