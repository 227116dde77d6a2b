// Jinja tests, Python methods on str/dict/list, attribute/item lookup, iteration and the global
// functions HF exposes to chat templates (filters live in jinja_filters.cc).
#include "text/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "core/error.h"
#include "text/jinja_limits.h"
#include "text/jinja_args.h"
#include "text/jinja_strings.h"

namespace moefold::jinja {
namespace {

std::string type_obj(const Value& v) { return "'" + v.type_name() + " object'"; }

/// Python str.format with automatic/explicit positional and named fields (no format specs
/// beyond plain conversion).
std::string brace_format(const std::string& f, const CallArgs& args) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '{') {
      if (i + 1 < f.size() && f[i + 1] == '{') {
        out += '{';
        ++i;
        continue;
      }
      size_t e = f.find('}', i);
      if (e == std::string::npos) fail("single '{{' encountered in format string");
      std::string field = f.substr(i + 1, e - i - 1);
      size_t colon = field.find(':');
      if (colon != std::string::npos) field = field.substr(0, colon);
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_idx < args.positional.size() ? &args.positional[auto_idx] : nullptr;
        ++auto_idx;
      } else if (std::all_of(field.begin(), field.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        if (field.size() > 9) fail("format field index {} is out of range", field);
        size_t k = std::stoul(field);
        v = k < args.positional.size() ? &args.positional[k] : nullptr;
      } else {
        v = args.kw(field);
      }
      if (!v) fail("format field '{}' has no value", field);
      out += v->str();
      check_string_size(out.size(), "str.format");
      i = e;
    } else if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') ++i;
      out += '}';
    } else {
      out += c;
    }
  }
  return out;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> names = {
      "boolean", "callable", "defined", "divisibleby", "eq",     "equalto", "escaped",  "even",     "false",
      "float",   "ge",       "gt",      "greaterthan", "in",     "integer", "iterable", "le",       "lessthan",
      "lower",   "lt",       "mapping", "ne",          "none",   "number",  "odd",      "sameas",   "sequence",
      "string",  "true",     "undefined", "upper",     "filter", "test"};
  return names;
}
}  // namespace

bool is_known_test(const std::string& name) { return test_names().count(name) > 0; }

Value dict_items(const Value& v) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("can only get item pairs from a mapping, not {}", v.type_name());
  ValueList out;
  for (const auto& [k, val] : v.as_dict().items) out.push_back(Value::list({Value(k), val}, true));
  return Value::list(std::move(out));
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& a) {
  const std::string& n = name;
  auto arg0 = [&]() -> const Value& {
    const Value* x = a.get(0, "other");
    if (!x) fail("test '{}' needs an argument", name);
    return *x;
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_dict();
  if (n == "number") return v.is_number();
  if (n == "integer") return v.is_int();
  if (n == "float") return v.is_float();
  if (n == "boolean") return v.is_bool();
  if (n == "true") return v.is_bool() && v.as_bool();
  if (n == "false") return v.is_bool() && !v.as_bool();
  if (n == "callable") return v.is_function() || v.is_undefined();  // jinja's Undefined defines __call__
  if (n == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (n == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (n == "escaped") return false;
  if (n == "lower" || n == "upper") {  // str(value).islower() / isupper()
    std::string s = v.str();
    bool has_cased = py_lower(s) != py_upper(s);
    return has_cased && (n == "lower" ? py_lower(s) == s : py_upper(s) == s);
  }
  if (n == "odd" || n == "even") {  // value % 2 == 1 / == 0, with Python's float modulo
    if (!v.is_number()) fail("unsupported operand type(s) for %: '{}' and 'int'", v.type_name());
    double r = std::fmod(v.as_double(), 2.0);
    if (r < 0) r += 2.0;
    return n == "odd" ? r == 1.0 : r == 0.0;
  }
  if (n == "divisibleby") {
    int64_t d = arg0().as_int();
    if (d == 0) fail("integer division or modulo by zero");
    return v.as_int() % d == 0;
  }
  if (n == "eq" || n == "equalto") return values_equal(v, arg0());
  if (n == "ne") return !values_equal(v, arg0());
  if (n == "lt" || n == "lessthan") return value_less(v, arg0());
  if (n == "gt" || n == "greaterthan") return value_less(arg0(), v);
  if (n == "le") return !value_less(arg0(), v);
  if (n == "ge") return !value_less(v, arg0());
  if (n == "in") return value_contains(arg0(), v);
  if (n == "sameas") {
    const Value& o = arg0();
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool()) return v.as_bool() == o.as_bool();
    if (v.is_namespace()) return &v.as_namespace() == &o.as_namespace();
    return values_equal(v, o);
  }
  if (n == "filter") return v.is_string() && is_known_filter(v.as_string());
  if (n == "test") return v.is_string() && is_known_test(v.as_string());
  fail("no test named '{}'", name);
}

// ---- attribute / item access, methods --------------------------------------------------------

namespace {

bool is_method_of(const Value& obj, const std::string& name) {
  static const std::set<std::string> str_methods = {
      "startswith", "endswith", "strip",  "lstrip",  "rstrip",  "split",   "rsplit",  "replace",
      "upper",      "lower",    "title",  "capitalize", "find", "rfind",   "count",   "join",
      "format",     "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper",
      "removeprefix", "removesuffix", "index"};
  static const std::set<std::string> dict_methods = {"items", "keys", "values", "get"};
  static const std::set<std::string> list_methods = {"index", "count"};
  if (obj.is_string()) return str_methods.count(name) > 0;
  if (obj.is_dict()) return dict_methods.count(name) > 0;
  if (obj.is_list()) return list_methods.count(name) > 0;
  return false;
}

Value string_method(const std::string& s, const std::string& name, const CallArgs& a) {
  if (name == "startswith" || name == "endswith") {
    const Value& p = arg_or(a, 0, "prefix", Value(""));
    ValueList options = p.is_list() ? p.as_list() : ValueList{p};
    for (const Value& o : options) {
      const std::string& x = o.as_string();
      bool hit = name == "startswith" ? s.compare(0, x.size(), x) == 0
                                      : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
      if (hit) return Value(true);
    }
    return Value(false);
  }
  if (name == "strip") return Value(py_strip(s, opt_string(a, 0, "chars"), true, true));
  if (name == "lstrip") return Value(py_strip(s, opt_string(a, 0, "chars"), true, false));
  if (name == "rstrip") return Value(py_strip(s, opt_string(a, 0, "chars"), false, true));
  if (name == "split" || name == "rsplit") {
    auto sep = opt_string(a, 0, "sep");
    int64_t maxsplit = opt_int(a, 1, "maxsplit", -1);
    ValueList out;
    for (auto& part : name == "split" ? py_split(s, sep, maxsplit) : py_rsplit(s, sep, maxsplit)) out.emplace_back(part);
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    ValueList out;
    for (auto& part : py_splitlines(s)) out.emplace_back(part);
    return Value::list(std::move(out));
  }
  if (name == "replace") return Value(py_replace(s, req_string(a, 0, "old"), req_string(a, 1, "new"), opt_int(a, 2, "count", -1)));
  if (name == "upper") return Value(py_upper(s));
  if (name == "lower") return Value(py_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "find" || name == "rfind" || name == "index") {
    std::string sub = req_string(a, 0, "sub");
    size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name == "index") fail("substring not found");
      return Value(static_cast<int64_t>(-1));
    }
    return Value(static_cast<int64_t>(utf8_length(s.substr(0, p))));
  }
  if (name == "count") {
    std::string sub = req_string(a, 0, "sub");
    if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
    int64_t c = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
    return Value(c);
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& item : iterate(arg_or(a, 0, "iterable", Value::list({})))) {
      if (!item.is_string()) fail("sequence item: expected str instance, {} found", item.type_name());
      if (!first) out += s;
      first = false;
      out += item.as_string();
      check_string_size(out.size(), "str.join");
    }
    return Value(out);
  }
  if (name == "format") return Value(brace_format(s, a));
  if (name == "removeprefix") {
    std::string p = req_string(a, 0, "prefix");
    return Value(s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
  }
  if (name == "removesuffix") {
    std::string p = req_string(a, 0, "suffix");
    bool hit = !p.empty() && s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
    return Value(hit ? s.substr(0, s.size() - p.size()) : s);
  }
  std::u32string u = utf8_decode(s);
  auto all = [&](auto pred) { return !u.empty() && std::all_of(u.begin(), u.end(), pred); };
  if (name == "isdigit") return Value(all([](char32_t c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha") return Value(all([](char32_t c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }));
  if (name == "isalnum")
    return Value(all([](char32_t c) { return ((c | 32) >= 'a' && (c | 32) <= 'z') || (c >= '0' && c <= '9'); }));
  if (name == "isspace") return Value(all([](char32_t c) { return py_isspace(c); }));
  if (name == "islower") return Value(py_lower(s) == s && py_upper(s) != s);
  if (name == "isupper") return Value(py_upper(s) == s && py_lower(s) != s);
  fail("'str object' has no attribute '{}'", name);
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (is_method_of(obj, name)) {
    return Value::function(name, [obj, name](const CallArgs& a) { return call_method(obj, name, a); });
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.as_namespace().attrs.find(name)) return *v;
  }
  return Value::undefined(type_obj(obj) + " has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[static_cast<size_t>(i)];
    } else {
      std::u32string u = utf8_decode(obj.as_string());
      int64_t n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(utf8_encode(u.substr(static_cast<size_t>(i), 1)));
    }
    return Value::undefined(type_obj(obj) + " has no element " + key.repr());
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(type_obj(obj) + " has no element " + key.repr());
}

Value call_method(const Value& obj, const std::string& name, const CallArgs& a) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (is_method_of(obj, name)) {
    if (obj.is_string()) return string_method(obj.as_string(), name, a);
    if (obj.is_dict()) {
      const ValueDict& d = obj.as_dict();
      if (name == "items") return dict_items(obj);
      if (name == "keys" || name == "values") {
        ValueList out;
        for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? Value(k) : v);
        return Value::list(std::move(out));
      }
      if (name == "get") {
        const Value& key = arg_or(a, 0, "key", Value::none());
        const Value* v = key.is_string() ? d.find(key.as_string()) : nullptr;
        return v ? *v : arg_or(a, 1, "default", Value::none());
      }
    }
    if (obj.is_list()) {
      const ValueList& l = obj.as_list();
      const Value& x = arg_or(a, 0, "value", Value::none());
      int64_t count = 0;
      for (size_t i = 0; i < l.size(); ++i) {
        if (!values_equal(l[i], x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") fail("{} is not in list", x.repr());
      return Value(count);
    }
  }
  Value attr = get_attr(obj, name);
  if (attr.is_undefined()) fail("{}", attr.undefined_hint());
  return call_value(attr, a);
}

Value call_value(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (!callee.is_function()) fail("'{}' object is not callable", callee.type_name());
  return callee.as_function().fn(args);
}

ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.as_list();
    case Value::Kind::Dict: {
      ValueList keys;
      for (const auto& [k, val] : v.as_dict().items) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::String: {
      ValueList chars;
      for (char32_t c : utf8_decode(v.as_string())) chars.emplace_back(utf8_encode(std::u32string(1, c)));
      return chars;
    }
    default: fail("'{}' object is not iterable", v.type_name());
  }
}

bool value_contains(const Value& container, const Value& x) {
  switch (container.kind()) {
    case Value::Kind::String:
      if (!x.is_string()) fail("'in <string>' requires string as left operand, not {}", x.type_name());
      return container.as_string().find(x.as_string()) != std::string::npos;
    case Value::Kind::List:
      return std::any_of(container.as_list().begin(), container.as_list().end(),
                         [&](const Value& e) { return values_equal(e, x); });
    case Value::Kind::Dict:
      if (x.is_list() || x.is_dict() || x.is_namespace()) fail("unhashable type: '{}'", x.type_name());
      return x.is_string() && container.as_dict().find(x.as_string()) != nullptr;
    case Value::Kind::Undefined: return false;  // Undefined iterates as empty
    default: fail("argument of type '{}' is not iterable", container.type_name());
  }
}

ValueDict default_globals() {
  ValueDict g;
  g.set("range", Value::function("range", [](const CallArgs& a) {
          int64_t start = 0, stop, step = 1;
          if (a.positional.size() == 1) {
            stop = a.positional[0].as_int();
          } else if (a.positional.size() >= 2) {
            start = a.positional[0].as_int();
            stop = a.positional[1].as_int();
            if (a.positional.size() > 2) step = a.positional[2].as_int();
          } else {
            fail("range expected at least 1 argument");
          }
          if (step == 0) fail("range() arg 3 must not be zero");
          // Length computed in 128 bits: start + k * step never overflows for the k produced.
          const __int128 span = step > 0 ? __int128(stop) - start : __int128(start) - stop;
          const __int128 mag = step > 0 ? __int128(step) : -__int128(step);
          const __int128 len = span <= 0 ? 0 : (span + mag - 1) / mag;
          const int64_t max = current_limits().max_range;
          if (len > max)
            throw TemplateLimitError(fmt::format("chat template: range() of {} items is over the limit of {}",
                                                 int64_t(std::min<__int128>(len, INT64_MAX)), max));
          ValueList out;
          out.reserve(size_t(len));
          for (int64_t k = 0; k < int64_t(len); ++k) out.emplace_back(int64_t(__int128(start) + __int128(k) * step));
          return Value::list(std::move(out));
        }));
  g.set("namespace", Value::function("namespace", [](const CallArgs& a) {
          ValueDict attrs;
          for (const Value& p : a.positional) {
            if (!p.is_dict()) fail("namespace() positional argument must be a mapping");
            for (const auto& [k, v] : p.as_dict().items) attrs.set(k, v);
          }
          for (const auto& [k, v] : a.keyword) attrs.set(k, v);
          return Value::make_namespace(std::move(attrs));
        }));
  g.set("dict", Value::function("dict", [](const CallArgs& a) {
          ValueDict d;
          for (const Value& p : a.positional) {
            if (!p.is_dict()) fail("dict() positional argument must be a mapping");
            for (const auto& [k, v] : p.as_dict().items) d.set(k, v);
          }
          for (const auto& [k, v] : a.keyword) d.set(k, v);
          return Value::dict(std::move(d));
        }));
  g.set("self", Value::make_namespace({}));  // Jinja's template reference; no blocks are supported
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
          fail("raise_exception: {}", a.positional.empty() ? std::string() : a.positional[0].str());
        }));
  g.set("strftime_now", Value::function("strftime_now", [](const CallArgs& a) {
          std::string f = req_string(a, 0, "format");
          std::time_t t = std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[256];
          size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
          return Value(std::string(buf, n));
        }));
  return g;
}

}  // namespace moefold::jinja
