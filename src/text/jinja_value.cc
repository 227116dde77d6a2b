#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "text/jinja_limits.h"
#include "text/jinja_strings.h"

namespace moefold::jinja {

const Value* ValueDict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::kw(const std::string& name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

const Value* CallArgs::get(size_t i, const std::string& name) const {
  if (i < positional.size()) return &positional[i];
  return kw(name);
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int v) : kind_(Kind::Int), i_(v) {}
Value::Value(int64_t v) : kind_(Kind::Int), i_(v) {}
Value::Value(double v) : kind_(Kind::Float), f_(v) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(const char* s) : Value(std::string(s)) {}

namespace {
/// 1 + the deepest element of a container about to be built; throws past max_value_depth.
int container_depth(int deepest_child) {
  const int d = deepest_child + 1;
  const int max = current_limits().max_value_depth;
  if (d > max) throw TemplateLimitError(fmt::format("chat template: a value nested more than {} levels deep", max));
  return d;
}
}  // namespace

Value Value::list(ValueList items, bool tuple) {
  check_list_size(items.size(), "a list");
  int deepest = 0;
  for (const auto& x : items) deepest = std::max(deepest, x.depth_);
  Value v;
  v.depth_ = container_depth(deepest);
  v.kind_ = Kind::List;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::dict(ValueDict d) {
  int deepest = 0;
  for (const auto& [k, x] : d.items) deepest = std::max(deepest, x.depth_);
  Value v;
  v.depth_ = container_depth(deepest);
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<const ValueDict>(std::move(d));
  return v;
}

Value Value::make_namespace(ValueDict attrs) {
  Value v;
  v.kind_ = Kind::Namespace;
  v.ns_ = std::make_shared<NamespaceObj>(NamespaceObj{std::move(attrs)});
  track_namespace(v.ns_);
  return v;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::Function;
  v.fn_ = std::make_shared<const FunctionObj>(FunctionObj{std::move(name), std::move(fn)});
  return v;
}

namespace {
Value from_json_at(const Json& j, int depth) {
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value(j.get<bool>());
    case Json::value_t::number_integer: return Value(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case Json::value_t::number_float: return Value(j.get<double>());
    case Json::value_t::string: return Value(j.get<std::string>());
    case Json::value_t::array: {
      if (depth >= current_limits().max_value_depth)
        throw TemplateLimitError(fmt::format("chat template: request data nested more than {} levels deep",
                                             current_limits().max_value_depth));
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      if (depth >= current_limits().max_value_depth)
        throw TemplateLimitError(fmt::format("chat template: request data nested more than {} levels deep",
                                             current_limits().max_value_depth));
      ValueDict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json_at(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default: return Value::undefined("binary JSON value");
  }
}

}  // namespace

Value Value::from_json(const Json& j) { return from_json_at(j, 0); }

Json Value::to_json() const {
  DepthGuard guard("a value converted to JSON");
  switch (kind_) {
    case Kind::None: return nullptr;
    case Kind::Bool: return b_;
    case Kind::Int: return i_;
    case Kind::Float: return f_;
    case Kind::String: return *s_;
    case Kind::List: {
      Json a = Json::array();
      for (const auto& e : *list_) a.push_back(e.to_json());
      return a;
    }
    case Kind::Dict: {
      Json o = Json::object();
      for (const auto& [k, v] : dict_->items) o[k] = v.to_json();
      return o;
    }
    case Kind::Namespace: {
      Json o = Json::object();
      for (const auto& [k, v] : ns_->attrs.items) o[k] = v.to_json();
      return o;
    }
    default: fail("cannot convert {} to JSON", type_name());
  }
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::Int: return static_cast<double>(i_);
    case Kind::Float: return f_;
    case Kind::Bool: return b_ ? 1.0 : 0.0;
    default: fail("expected a number, got {}", type_name());
  }
}

const std::string& Value::undefined_hint() const {
  static const std::string generic = "value is undefined";
  return s_ ? *s_ : generic;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0.0;
    case Kind::String: return !s_->empty();
    case Kind::List: return !list_->empty();
    case Kind::Dict: return !dict_->items.empty();
    default: return true;
  }
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::String: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  DepthGuard guard("a printed value");
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "None";
    case Kind::Bool: return b_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return py_float_repr(f_);
    case Kind::String: return py_string_repr(*s_);
    case Kind::List: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      out += tuple_ ? ")" : "]";
      return out;
    }
    case Kind::Dict:
    case Kind::Namespace: {
      const ValueDict& d = kind_ == Kind::Dict ? *dict_ : ns_->attrs;
      std::string out = kind_ == Kind::Dict ? "{" : "Namespace(";
      bool first = true;
      for (const auto& [k, v] : d.items) {
        if (!first) out += ", ";
        first = false;
        out += kind_ == Kind::Dict ? py_string_repr(k) + ": " : k + "=";
        out += v.repr();
      }
      out += kind_ == Kind::Dict ? "}" : ")";
      return out;
    }
    case Kind::Function: return "<function " + fn_->name + ">";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return tuple_ ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Function: return "function";
  }
  return "?";
}

bool values_equal(const Value& a, const Value& b) {
  DepthGuard guard("a compared value");
  if (a.is_number() && b.is_number()) {
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.as_string() == b.as_string();
    case Value::Kind::List: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!values_equal(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      const auto& x = a.as_dict().items;
      const auto& y = b.as_dict();
      if (x.size() != y.items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* o = y.find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::Namespace: return &a.as_namespace() == &b.as_namespace();
    case Value::Kind::Function: return &a.as_function() == &b.as_function();
    default: return false;
  }
}

bool value_less(const Value& a, const Value& b) {
  DepthGuard guard("a compared value");
  if (a.is_number() && b.is_number()) {
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order == code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (value_less(x[i], y[i])) return true;
      if (value_less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python's repr uses exponent notation outside [1e-4, 1e16)
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else {
      size_t int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + ebuf;
}

std::string py_string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  auto hex4 = [&out](uint32_t u) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\u%04x", u);
    out += buf;
  };
  // One character (a byte without ensure_ascii, a code point with it): the short escapes, \uXXXX for
  // the other control characters and, with ensure_ascii, for everything outside printable ASCII
  // (UTF-16 surrogate pairs above the BMP), as Python's json.dumps writes them.
  auto put = [&](char32_t c) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          hex4(uint32_t(c));
        } else if (!ensure_ascii || c <= 0x7e) {
          out += static_cast<char>(c);
        } else if (c >= 0x10000) {
          const uint32_t v = uint32_t(c) - 0x10000;
          hex4(0xD800 + (v >> 10));
          hex4(0xDC00 + (v & 0x3FF));
        } else {
          hex4(uint32_t(c));
        }
    }
  };
  if (ensure_ascii) {
    for (char32_t cp : utf8_decode(s)) put(cp);
  } else {
    for (unsigned char c : s) put(c);
  }
  out += '"';
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& opt, int level) {
  DepthGuard guard("a value passed to tojson");
  check_string_size(out.size(), "tojson");
  auto newline = [&](int lvl) {
    check_string_size(out.size() + 1 + opt.indent.size() * size_t(lvl), "tojson");
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += opt.indent;
  };
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: {
      double d = v.as_double();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
      else out += py_float_repr(d);
      return;
    }
    case Value::Kind::String: json_string(out, v.as_string(), opt.ensure_ascii); return;
    case Value::Kind::List: {
      const auto& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += opt.item_separator;
        if (opt.has_indent) newline(level + 1);
        dump(out, items[i], opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      const ValueDict& d = v.is_dict() ? v.as_dict() : v.as_namespace().attrs;
      for (const auto& e : d.items) entries.push_back(&e);
      if (opt.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += opt.item_separator;
        if (opt.has_indent) newline(level + 1);
        json_string(out, entries[i]->first, opt.ensure_ascii);
        out += opt.key_separator;
        dump(out, entries[i]->second, opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out += '}';
      return;
    }
    default: fail("Object of type {} is not JSON serializable", v.type_name());
  }
}

}  // namespace

std::string py_json_dumps(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  return out;
}

}  // namespace moefold::jinja
