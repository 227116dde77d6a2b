// Jinja filters: the subset of Jinja's built-in filters chat templates use, plus HF's `tojson`
// override (json.dumps with ensure_ascii=False and insertion-ordered keys).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "core/error.h"
#include "text/jinja_limits.h"
#include "text/jinja_args.h"
#include "text/jinja_builtins.h"
#include "text/jinja_strings.h"

namespace moefold::jinja {
namespace {

// ---- attribute paths (map/selectattr/sort attribute=) ---------------------------------------

Value lookup_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    int64_t index = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    bool numeric = !part.empty() && part[0] != '-' && ec == std::errc() && end == part.data() + part.size();
    cur = get_item(cur, numeric ? Value(index) : Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

/// Sort/unique key: lower-cased strings unless case-sensitive.
Value fold_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(py_lower(v.as_string()));
  return v;
}

// ---- printf-style formatting ("%s" % x, |format) ---------------------------------------------

std::string percent_format(const std::string& fmt_str, const ValueList& args) {
  std::string out;
  size_t ai = 0;
  for (size_t i = 0; i < fmt_str.size(); ++i) {
    char c = fmt_str[i];
    if (c != '%') {
      out += c;
      continue;
    }
    if (++i >= fmt_str.size()) fail("incomplete format");
    std::string spec;
    while (i < fmt_str.size() && std::string("-+ #0123456789.").find(fmt_str[i]) != std::string::npos) spec += fmt_str[i++];
    if (i >= fmt_str.size()) fail("incomplete format");
    char conv = fmt_str[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (ai >= args.size()) fail("not enough arguments for format string");
    const Value& a = args[ai++];
    std::string piece;
    switch (conv) {
      case 's': piece = a.str(); break;
      case 'r': piece = a.repr(); break;
      case 'd':
      case 'i': {
        if (a.is_float() && !(std::fabs(a.as_double()) < 9.2e18)) fail("cannot convert float {} to integer", a.as_double());
        piece = std::to_string(a.is_float() ? static_cast<int64_t>(a.as_double()) : a.as_int());
        break;
      }
      case 'f':
      case 'e':
      case 'g': {
        char buf[64];
        std::string f = "%" + spec + conv;
        std::snprintf(buf, sizeof buf, f.c_str(), a.as_double());
        piece = buf;
        spec.clear();
        break;
      }
      default: fail("unsupported format character '{}'", conv);
    }
    if (!spec.empty()) {
      bool left = spec[0] == '-';
      size_t w = 0;  // the width: leading digits after the flags (a precision after '.' is ignored)
      size_t k = 0;
      while (k < spec.size() && (spec[k] == '-' || spec[k] == '+' || spec[k] == ' ' || spec[k] == '#' || spec[k] == '0')) ++k;
      for (; k < spec.size() && spec[k] >= '0' && spec[k] <= '9'; ++k) {
        w = w * 10 + size_t(spec[k] - '0');
        check_string_size(w, "a %-format width");
      }
      size_t len = utf8_length(piece);
      if (len < w) piece = left ? piece + std::string(w - len, ' ') : std::string(w - len, ' ') + piece;
    }
    out += piece;
    check_string_size(out.size(), "%-formatting");
  }
  if (ai < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

// ---- filters -------------------------------------------------------------------------------

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return static_cast<int64_t>(utf8_length(v.as_string()));
    case Value::Kind::List: return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.as_dict().items.size());
    default: fail("object of type '{}' has no len()", v.type_name());
  }
}

/// Python int(d) for a float; a NaN, an infinity or a value outside int64 is an error.
int64_t float_to_int(double d) {
  if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0)) fail("cannot convert float {} to an integer", d);
  return static_cast<int64_t>(d);
}

Value to_int(const Value& v, const Value& dflt, int64_t base) {
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return Value(float_to_int(v.as_double()));
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    try {
      size_t used = 0;
      int64_t r = std::stoll(digits, &used, static_cast<int>(base));
      if (used == digits.size() && !digits.empty()) return Value(r);
    } catch (...) {
    }
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return Value(float_to_int(d));
    } catch (...) {
    }
  }
  return dflt;
}

Value to_float(const Value& v, const Value& dflt) {
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (...) {
    }
  }
  return dflt;
}

JsonDumpOptions json_options(const CallArgs& a) {
  // HF's tojson: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  JsonDumpOptions opt;
  opt.ensure_ascii = opt_bool(a, 0, "ensure_ascii", false);
  const Value* indent = a.get(1, "indent");
  if (indent && !indent->is_none() && !indent->is_undefined()) {
    opt.has_indent = true;
    if (indent->is_string()) opt.indent = indent->as_string();
    else {
      const int64_t n = std::max<int64_t>(0, indent->as_int());
      check_string_size(size_t(n), "tojson's indent");
      opt.indent = std::string(static_cast<size_t>(n), ' ');
    }
    opt.item_separator = ",";
  }
  const Value* seps = a.get(2, "separators");
  if (seps && seps->is_list()) {
    if (seps->as_list().size() != 2) fail("separators must be a pair");
    opt.item_separator = seps->as_list()[0].str();
    opt.key_separator = seps->as_list()[1].str();
  }
  opt.sort_keys = opt_bool(a, 3, "sort_keys", false);
  return opt;
}

ValueList select_items(const Value& seq, const CallArgs& a, bool by_attr, bool keep) {
  ValueList out;
  size_t first_test_arg = by_attr ? 1 : 0;
  std::string attr = by_attr ? req_string(a, 0, "attribute") : "";
  std::optional<std::string> test = opt_string(a, first_test_arg, "test");
  CallArgs test_args;
  for (size_t i = first_test_arg + 1; i < a.positional.size(); ++i) test_args.positional.push_back(a.positional[i]);
  for (const Value& item : iterate(seq)) {
    Value subject = by_attr ? lookup_path(item, attr) : item;
    bool ok = test ? apply_test(*test, subject, test_args) : subject.truthy();
    if (ok == keep) out.push_back(item);
  }
  return out;
}

Value map_items(const Value& seq, const CallArgs& a) {
  ValueList out;
  if (const Value* attr = a.kw("attribute")) {
    const Value* dflt = a.kw("default");
    for (const Value& item : iterate(seq)) {
      Value v = lookup_path(item, attr->str());
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
    return Value::list(std::move(out));
  }
  std::string filter = req_string(a, 0, "filter");
  CallArgs rest;
  for (size_t i = 1; i < a.positional.size(); ++i) rest.positional.push_back(a.positional[i]);
  rest.keyword = a.keyword;
  for (const Value& item : iterate(seq)) out.push_back(apply_filter(filter, item, rest));
  return Value::list(std::move(out));
}

std::string do_indent(const std::string& text, const Value& width, bool first, bool blank) {
  if (!width.is_string() && width.as_int() < 0) fail("indent width must not be negative");
  if (!width.is_string()) check_string_size(size_t(width.as_int()), "the indent filter");
  std::string ind = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(width.as_int()), ' ');
  std::vector<std::string> lines = py_splitlines(text + "\n");
  check_string_size(text.size() + (lines.size() + 1) * ind.size(), "the indent filter");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind + lines[i]);
  }
  return first ? ind + rv : rv;
}

/// Jinja's `title` filter (not Python's str.title): words start after runs of whitespace, '-',
/// '(', '{', '[' or '<'; each word's first character is upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s) {
  std::u32string u = utf8_decode(s);
  auto is_sep = [](char32_t c) { return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    std::string piece = utf8_encode(u.substr(i, j - i));
    if (sep) {
      out += piece;
    } else {
      std::string first = utf8_encode(u.substr(i, 1));
      out += py_upper(first) + py_lower(piece.substr(first.size()));
    }
    i = j;
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value sorted_list(const Value& seq, bool reverse, bool case_sensitive, const std::optional<std::string>& attr) {
  ValueList items = iterate(seq);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = fold_case(attr ? lookup_path(x, *attr) : x, case_sensitive);
    Value ky = fold_case(attr ? lookup_path(y, *attr) : y, case_sensitive);
    return reverse ? value_less(ky, kx) : value_less(kx, ky);
  });
  return Value::list(std::move(items));
}

Value min_max(const Value& seq, const CallArgs& a, bool want_max) {
  ValueList items = iterate(seq);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool cs = opt_bool(a, 0, "case_sensitive", false);
  auto attr = opt_string(a, 1, "attribute");
  auto key = [&](const Value& v) { return fold_case(attr ? lookup_path(v, *attr) : v, cs); };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    bool better = want_max ? value_less(key(items[best]), key(items[i])) : value_less(key(items[i]), key(items[best]));
    if (better) best = i;
  }
  return items[best];
}

Value add_values(const Value& a, const Value& b) {
  if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) return Value(a.as_int() + b.as_int());
  if (a.is_number() && b.is_number()) return Value(a.as_double() + b.as_double());
  fail("unsupported operand type(s) for +: '{}' and '{}'", a.type_name(), b.type_name());
}

const std::set<std::string>& filter_names() {
  static const std::set<std::string> names = {
      "abs",     "attr",      "capitalize", "center", "count",      "d",      "default", "dictsort", "e",
      "escape",  "first",     "float",      "format", "indent",     "int",    "items",   "join",     "last",
      "length",  "list",      "lower",      "map",    "max",        "min",    "reject",  "rejectattr",
      "replace", "reverse",   "round",      "safe",   "select",     "selectattr", "sort", "string", "sum",
      "title",   "tojson",    "trim",       "unique", "upper",      "wordcount"};
  return names;
}
}  // namespace

bool is_known_filter(const std::string& name) { return filter_names().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& v, const CallArgs& a) {
  static const Value kNone = Value::none();
  const std::string& n = name;
  if (n == "default" || n == "d") {
    bool boolean = opt_bool(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) return arg_or(a, 0, "default_value", Value(""));
    return v;
  }
  if (n == "safe") return v;
  if (n == "string") return Value(v.str());
  if (n == "length" || n == "count") return Value(length_of(v));
  if (n == "tojson") {
    if (v.is_undefined()) fail_undefined(v);
    return Value(py_json_dumps(v, json_options(a)));
  }
  if (n == "trim") return Value(py_strip(v.str(), opt_string(a, 0, "chars"), true, true));
  if (n == "upper") return Value(py_upper(v.str()));
  if (n == "lower") return Value(py_lower(v.str()));
  if (n == "title") return Value(jinja_title(v.str()));
  if (n == "capitalize") return Value(py_capitalize(v.str()));
  if (n == "e" || n == "escape") return Value(html_escape(v.str()));
  if (n == "replace") {
    int64_t count = opt_int(a, 2, "count", -1);
    return Value(py_replace(v.str(), arg_or(a, 0, "old", Value("")).str(), arg_or(a, 1, "new", Value("")).str(), count));
  }
  if (n == "items") return dict_items(v);
  if (n == "list") return Value::list(iterate(v));
  if (n == "first" || n == "last") {
    if (v.is_undefined()) return Value::undefined("No first item, sequence was empty.");
    ValueList items = iterate(v);
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    return n == "first" ? items.front() : items.back();
  }
  if (n == "reverse") {
    if (v.is_string()) return Value(py_slice(v.as_string(), std::nullopt, std::nullopt, -1));
    ValueList items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (n == "join") {
    std::string sep = arg_or(a, 0, "d", Value("")).str();
    auto attr = opt_string(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += (attr ? lookup_path(item, *attr) : item).str();
      check_string_size(out.size(), "the join filter");
    }
    return Value(out);
  }
  if ((n == "int" || n == "float") && v.is_undefined()) fail_undefined(v);
  if (n == "int") return to_int(v, arg_or(a, 0, "default", Value(0)), opt_int(a, 1, "base", 10));
  if (n == "float") return to_float(v, arg_or(a, 0, "default", Value(0.0)));
  if (n == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    if (v.is_int() || v.is_bool()) return Value(static_cast<int64_t>(std::llabs(v.as_int())));
    fail("bad operand type for abs(): '{}'", v.type_name());
  }
  if (n == "round") {
    int64_t precision = opt_int(a, 0, "precision", 0);
    std::string method = arg_or(a, 1, "method", Value("common")).str();
    if (method != "common" && method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
    if (method == "common" && (v.is_int() || v.is_bool()) && precision >= 0) return Value(v.as_int());  // round(int) is int
    double scale = std::pow(10.0, static_cast<double>(precision));
    double x = v.as_double() * scale;
    x = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value(x / scale);
  }
  if ((n == "map" || n == "select" || n == "reject" || n == "selectattr" || n == "rejectattr") && !v.truthy())
    return Value::list({});  // Jinja skips falsy inputs instead of iterating them
  if (n == "map") return map_items(v, a);
  if (n == "select" || n == "reject") return Value::list(select_items(v, a, false, n == "select"));
  if (n == "selectattr" || n == "rejectattr") return Value::list(select_items(v, a, true, n == "selectattr"));
  if (n == "sort")
    return sorted_list(v, opt_bool(a, 0, "reverse", false), opt_bool(a, 1, "case_sensitive", false), opt_string(a, 2, "attribute"));
  if (n == "dictsort") {
    if (v.is_undefined()) fail_undefined(v);
    bool cs = opt_bool(a, 0, "case_sensitive", false);
    std::string by = arg_or(a, 1, "by", Value("key")).str();
    bool reverse = opt_bool(a, 2, "reverse", false);
    ValueList items = dict_items(v).as_list();
    size_t pos = by == "value" ? 1 : 0;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      Value kx = fold_case(x.as_list()[pos], cs), ky = fold_case(y.as_list()[pos], cs);
      return reverse ? value_less(ky, kx) : value_less(kx, ky);
    });
    return Value::list(std::move(items));
  }
  if (n == "unique") {
    bool cs = opt_bool(a, 0, "case_sensitive", false);
    auto attr = opt_string(a, 1, "attribute");
    ValueList out, seen;
    for (const Value& item : iterate(v)) {
      Value key = fold_case(attr ? lookup_path(item, *attr) : item, cs);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  }
  if (n == "min" || n == "max") return min_max(v, a, n == "max");
  if (n == "sum") {
    auto attr = opt_string(a, 0, "attribute");
    Value total = arg_or(a, 1, "start", Value(0));
    for (const Value& item : iterate(v)) total = add_values(total, attr ? lookup_path(item, *attr) : item);
    return total;
  }
  if (n == "attr") return get_attr(v, req_string(a, 0, "name"));
  if (n == "indent")
    return Value(do_indent(v.str(), arg_or(a, 0, "width", Value(4)), opt_bool(a, 1, "first", false), opt_bool(a, 2, "blank", false)));
  if (n == "center") {
    std::u32string u = utf8_decode(v.str());
    int64_t width = opt_int(a, 0, "width", 80);
    if (static_cast<int64_t>(u.size()) >= width) return Value(v.str());
    check_string_size(size_t(width) + v.str().size(), "the center filter");
    int64_t marg = width - static_cast<int64_t>(u.size());
    int64_t left = marg / 2 + (marg & width & 1);
    return Value(std::string(static_cast<size_t>(left), ' ') + v.str() + std::string(static_cast<size_t>(marg - left), ' '));
  }
  if (n == "wordcount") {
    int64_t count = 0;
    bool in_word = false;
    for (char32_t c : utf8_decode(v.str())) {
      bool w = c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
      if (w && !in_word) ++count;
      in_word = w;
    }
    return Value(count);
  }
  if (n == "format") return Value(percent_format(v.str(), a.positional));
  fail("no filter named '{}'", name);
}

}  // namespace moefold::jinja
