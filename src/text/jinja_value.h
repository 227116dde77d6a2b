// Jinja runtime values: a small dynamic type modelled on the Python objects that Jinja templates
// see (None, bool, int, float, str, list/tuple, dict, namespace, callables, Undefined), with the
// Python spellings of str(), repr() and json.dumps() that chat templates rely on for byte-exact
// output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace moefold::jinja {

/// JSON type used at the engine boundary. Ordered, because Python dicts keep insertion order and
/// `tojson` of a tool spec must reproduce the caller's key order byte for byte.
using Json = nlohmann::ordered_json;

class Value;
using ValueList = std::vector<Value>;

/// Insertion-ordered string-keyed mapping (Python dict semantics for key order).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  /// Returns the value stored under `key`, or nullptr.
  const Value* find(const std::string& key) const;
  /// Inserts or overwrites `key`, keeping the original position of an existing key.
  void set(const std::string& key, Value v);
};

/// Arguments of a call: positional then keyword, as written at the call site.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  /// Keyword argument `name`, or nullptr.
  const Value* kw(const std::string& name) const;
  /// Positional argument `i`, else keyword `name`, else nullptr.
  const Value* get(size_t i, const std::string& name) const;
};

/// A callable value: global functions, macros and bound methods.
struct FunctionObj {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

/// Jinja's `namespace()`: the one mutable object templates can assign attributes to.
struct NamespaceObj {
  ValueDict attrs;
};

/// A dynamically typed template value. Copies are cheap: containers are shared and immutable
/// (chat templates run in an immutable sandbox), only namespaces are shared and mutable.
class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

  /// An Undefined value; `hint` describes what was missing (used in error messages).
  Value() = default;
  static Value undefined(std::string hint);
  static Value none();
  Value(bool b);                // NOLINT(google-explicit-constructor)
  Value(int v);                 // NOLINT(google-explicit-constructor)
  Value(int64_t v);             // NOLINT(google-explicit-constructor)
  Value(double v);              // NOLINT(google-explicit-constructor)
  Value(std::string s);         // NOLINT(google-explicit-constructor)
  Value(const char* s);         // NOLINT(google-explicit-constructor)
  /// A list; `tuple` only changes how repr() spells it. Lists and dicts record their nesting depth;
  /// building one deeper than RenderLimits::max_value_depth (or a list longer than max_list_items)
  /// throws TemplateLimitError, which bounds every recursive walk over values (str, repr, tojson,
  /// ==, destruction).
  static Value list(ValueList items, bool tuple = false);
  static Value dict(ValueDict d);
  static Value make_namespace(ValueDict attrs);
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);

  /// Deep conversion from JSON (objects keep their key order). Throws TemplateLimitError
  /// (jinja_limits.h) for JSON nested deeper than RenderLimits::max_value_depth, without recursing
  /// further, so request data of any depth is safe to pass.
  static Value from_json(const Json& j);
  /// Deep conversion to JSON; throws moefold::Error for values JSON cannot hold.
  Json to_json() const;

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  /// Python's numbers.Number: int, float and bool.
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && tuple_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_function() const { return kind_ == Kind::Function; }

  /// Nesting depth: 0 for scalars (and namespaces, which are mutable), 1 + the deepest element for
  /// lists and dicts.
  int depth() const { return depth_; }
  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? (b_ ? 1 : 0) : i_; }
  /// Numeric value as double (int, float or bool).
  double as_double() const;
  const std::string& as_string() const { return *s_; }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  NamespaceObj& as_namespace() const { return *ns_; }
  const FunctionObj& as_function() const { return *fn_; }
  /// What an Undefined value stands for, e.g. "'foo' is undefined".
  const std::string& undefined_hint() const;

  /// Python truthiness.
  bool truthy() const;
  /// Python str() (Undefined prints as the empty string, as in Jinja).
  std::string str() const;
  /// Python repr().
  std::string repr() const;
  /// Python type name as Jinja error messages spell it ("str", "dict object", ...).
  std::string type_name() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  bool tuple_ = false;
  int depth_ = 0;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<const ValueDict> dict_;
  std::shared_ptr<NamespaceObj> ns_;
  std::shared_ptr<const FunctionObj> fn_;
};

/// Python `==` between two values (1 == 1.0, lists and dicts compare deeply).
bool values_equal(const Value& a, const Value& b);
/// Python `<`; throws moefold::Error for unorderable types.
bool value_less(const Value& a, const Value& b);

/// Python float repr(): shortest round-trip digits, "1.0", "1e+16", "1e-05", "nan", "inf".
std::string py_float_repr(double d);
/// Python repr() of a str.
std::string py_string_repr(const std::string& s);

/// Options of Python's json.dumps, as HF's `tojson` filter exposes them.
struct JsonDumpOptions {
  bool has_indent = false;
  std::string indent;                 // the per-level indent string (json.dumps accepts int or str)
  std::string item_separator = ", ";  // json.dumps default when indent is None; "," otherwise
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;  // HF's tojson default
};
/// Python json.dumps(value, ...) with the given options.
std::string py_json_dumps(const Value& v, const JsonDumpOptions& opt);

}  // namespace moefold::jinja
