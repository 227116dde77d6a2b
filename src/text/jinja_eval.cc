// Jinja evaluator: walks the syntax tree with Jinja's scoping rules (each for-loop iteration and
// each macro call gets a fresh scope; `if` does not create one; namespaces are the only objects
// that can be mutated across scopes) and Python semantics for operators.
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "text/jinja_builtins.h"
#include "text/jinja_lexer.h"
#include "text/jinja_limits.h"
#include "text/jinja_parser.h"
#include "text/jinja_strings.h"
#include "text/jinja_template.h"

namespace moefold::jinja {
namespace {

/// One variable scope; lookups fall through to the parent.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;

  const Value* find(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

FramePtr child_of(const FramePtr& parent) {
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  return f;
}

/// Re-throws an error with "line N: " in front unless it already names a line. A TemplateLimitError
/// stays one.
[[noreturn]] void rethrow_at(const Error& e, int line) {
  if (std::strncmp(e.what(), "line ", 5) == 0) throw;
  if (dynamic_cast<const TemplateLimitError*>(&e)) throw TemplateLimitError(fmt::format("line {}: {}", line, e.what()));
  fail("line {}: {}", line, e.what());
}

/// Python int arithmetic within int64: a result outside it is an error (Python would grow a bigint).
/// `r` by reference: it must be read after the overflow builtin in the same call has written it.
int64_t checked(bool overflow, const int64_t& r, const char* op) {
  if (overflow) fail("integer overflow in '{}' (results must fit in 64 bits)", op);
  return r;
}

enum class Flow { Normal, Break, Continue };

constexpr int kMaxCallDepth = 256;

class Renderer {
 public:
  Value eval(const Expr& e, const FramePtr& f) {
    tick();
    DepthGuard guard("expression evaluation");
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: {
        if (const Value* v = f->find(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a, f));
        return Value::list(std::move(items), e.kind == Expr::Kind::Tuple);
      }
      case Expr::Kind::Dict: {
        ValueDict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], f);
          if (!k.is_string()) fail("line {}: only string keys are supported in dict literals", e.line);
          d.set(k.as_string(), eval(*e.args[i + 1], f));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::Attr: return get_attr(eval(*e.args[0], f), e.name);
      case Expr::Kind::Item: return get_item(eval(*e.args[0], f), eval(*e.args[1], f));
      case Expr::Kind::Slice: return eval_slice(e, f);
      case Expr::Kind::Call: return eval_call(e, f);
      case Expr::Kind::Filter: return apply_filter(e.name, eval(*e.args[0], f), eval_args(e, f, 1));
      case Expr::Kind::Test: {
        bool r = apply_test(e.name, eval(*e.args[0], f), eval_args(e, f, 1));
        return Value(e.negated ? !r : r);
      }
      case Expr::Kind::Unary: {
        Value v = eval(*e.args[0], f);
        if (e.name == "not") return Value(!v.truthy());
        if (v.is_undefined()) fail("{}", v.undefined_hint());
        if (!v.is_number()) fail("bad operand type for unary {}: '{}'", e.name, v.type_name());
        if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
        if (v.is_float()) return Value(-v.as_double());
        int64_t r = 0;
        return Value(checked(__builtin_sub_overflow(int64_t(0), v.as_int(), &r), r, "-"));
      }
      case Expr::Kind::Binary: return eval_binary(e, f);
      case Expr::Kind::Compare: {
        Value left = eval(*e.args[0], f);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], f);
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::Cond: {
        if (eval(*e.args[1], f).truthy()) return eval(*e.args[0], f);
        if (e.args[2]) return eval(*e.args[2], f);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      }
    }
    return Value();
  }

  Flow exec_body(const Body& body, const FramePtr& f, std::string& out) {
    for (const auto& s : body) {
      Flow fl = exec(*s, f, out);
      if (fl != Flow::Normal) return fl;
    }
    return Flow::Normal;
  }

 private:
  CallArgs eval_args(const Expr& e, const FramePtr& f, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], f));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v, f));
    return a;
  }

  std::optional<int64_t> slice_bound(const Expr* e, const FramePtr& f) {
    if (!e) return std::nullopt;
    Value v = eval(*e, f);
    if (v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail("slice indices must be integers or None");
    return v.as_int();
  }

  Value eval_slice(const Expr& e, const FramePtr& f) {
    Value obj = eval(*e.args[0], f);
    auto start = slice_bound(e.args[1].get(), f);
    auto stop = slice_bound(e.args[2].get(), f);
    auto step = slice_bound(e.args[3].get(), f);
    if (obj.is_string()) return Value(py_slice(obj.as_string(), start, stop, step));
    if (obj.is_list()) {
      ValueList out;
      for (size_t i : slice_indices(obj.as_list().size(), start, stop, step)) out.push_back(obj.as_list()[i]);
      return Value::list(std::move(out), obj.is_tuple());
    }
    if (obj.is_undefined()) fail("{}", obj.undefined_hint());
    fail("'{}' object is not subscriptable", obj.type_name());
  }

  Value eval_call(const Expr& e, const FramePtr& f) {
    const Expr& callee = *e.args[0];
    CallArgs args = eval_args(e, f, 1);
    if (callee.kind == Expr::Kind::Attr) return call_method(eval(*callee.args[0], f), callee.name, args);
    return call_value(eval(callee, f), args);
  }

  static Value arith(const std::string& op, const Value& a, const Value& b) {
    if (a.is_undefined()) fail("{}", a.undefined_hint());
    if (b.is_undefined()) fail("{}", b.undefined_hint());
    bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
    bool nums = a.is_number() && b.is_number();
    int64_t r = 0;
    if (op == "+") {
      if (ints) return Value(checked(__builtin_add_overflow(a.as_int(), b.as_int(), &r), r, "+"));
      if (nums) return Value(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        check_string_size(a.as_string().size() + b.as_string().size(), "string concatenation");
        return Value(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list()) {
        check_list_size(a.as_list().size() + b.as_list().size(), "list concatenation");
        ValueList out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        return Value::list(std::move(out), a.is_tuple());
      }
    } else if (op == "-") {
      if (ints) return Value(checked(__builtin_sub_overflow(a.as_int(), b.as_int(), &r), r, "-"));
      if (nums) return Value(a.as_double() - b.as_double());
    } else if (op == "*") {
      if (ints) return Value(checked(__builtin_mul_overflow(a.as_int(), b.as_int(), &r), r, "*"));
      if (nums) return Value(a.as_double() * b.as_double());
      const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
      const Value* count = seq == &a ? &b : &a;
      if (seq && (count->is_int() || count->is_bool())) {
        const int64_t n = std::max<int64_t>(0, count->as_int());
        const size_t unit = seq->is_string() ? seq->as_string().size() : seq->as_list().size();
        // unit * n, saturated: a count of 1e11 must fail here, before any allocation.
        const size_t total = unit == 0 ? 0 : (uint64_t(n) > SIZE_MAX / unit ? SIZE_MAX : unit * size_t(n));
        if (seq->is_string()) {
          check_string_size(total, "string repetition");
          std::string out;
          out.reserve(total);
          for (int64_t i = 0; i < n && unit; ++i) out += seq->as_string();
          return Value(out);
        }
        check_list_size(total, "list repetition");
        ValueList out;
        for (int64_t i = 0; i < n && unit; ++i) out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
        return Value::list(std::move(out), seq->is_tuple());
      }
    } else if (op == "/") {
      if (nums) {
        if (b.as_double() == 0) fail("division by zero");
        return Value(a.as_double() / b.as_double());
      }
    } else if (op == "//" || op == "%") {
      if (op == "%" && a.is_string()) {  // printf-style formatting, as the format filter
        if ((b.is_dict() || (b.is_list() && !b.is_tuple())) && a.as_string().find('%') == std::string::npos)
          return a;  // Python exempts mapping-like arguments from "not all arguments converted"
        CallArgs args;
        if (b.is_tuple()) args.positional = b.as_list();
        else args.positional.push_back(b);
        return apply_filter("format", a, args);
      }
      if (ints) {
        int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) fail("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {  // the one quotient outside int64
          if (op == "%") return Value(int64_t(0));
          fail("integer overflow in '//' (results must fit in 64 bits)");
        }
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return op == "//" ? Value(q) : Value(r);
      }
      if (nums) {
        double x = a.as_double(), y = b.as_double();
        if (y == 0) fail("float division by zero");
        // CPython's float divmod: fmod-based remainder with the divisor's sign.
        double mod = std::fmod(x, y);
        double div = (x - mod) / y;
        if (mod != 0) {
          if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
          }
        } else {
          mod = std::copysign(0.0, y);
        }
        double floordiv;
        if (div != 0) {
          floordiv = std::floor(div);
          if (div - floordiv > 0.5) floordiv += 1.0;
        } else {
          floordiv = std::copysign(0.0, x / y);
        }
        return op == "//" ? Value(floordiv) : Value(mod);
      }
    } else if (op == "**") {
      if (ints && b.as_int() >= 0) {  // square-and-multiply: O(log exponent), overflow is an error
        int64_t base = a.as_int(), result = 1;
        for (int64_t e = b.as_int(); e > 0; e >>= 1) {
          if (e & 1) result = checked(__builtin_mul_overflow(result, base, &result), result, "**");
          if (e > 1) base = checked(__builtin_mul_overflow(base, base, &base), base, "**");
        }
        return Value(result);
      }
      if (nums) return Value(std::pow(a.as_double(), b.as_double()));
    }
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
  }

  Value eval_binary(const Expr& e, const FramePtr& f) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.args[0], f);
      return l.truthy() ? eval(*e.args[1], f) : l;
    }
    if (op == "or") {
      Value l = eval(*e.args[0], f);
      return l.truthy() ? l : eval(*e.args[1], f);
    }
    Value l = eval(*e.args[0], f);
    Value r = eval(*e.args[1], f);
    if (op == "~") {
      std::string ls = l.str(), rs = r.str();
      check_string_size(ls.size() + rs.size(), "string concatenation");
      return Value(ls + rs);
    }
    return arith(op, l, r);
  }

  static bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return values_equal(a, b);
    if (op == "!=") return !values_equal(a, b);
    if (op == "<") return value_less(a, b);
    if (op == ">") return value_less(b, a);
    if (op == "<=") return !value_less(b, a);
    if (op == ">=") return !value_less(a, b);
    if (op == "in") return value_contains(b, a);
    if (op == "notin") return !value_contains(b, a);
    fail("unknown comparison '{}'", op);
  }

  Flow exec(const Stmt& s, const FramePtr& f, std::string& out) {
    tick();
    DepthGuard guard("block");
    try {
      return exec_inner(s, f, out);
    } catch (const Error& e) {
      rethrow_at(e, s.line);
    }
  }

  Flow exec_inner(const Stmt& s, const FramePtr& f, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text: append(out, s.text); return Flow::Normal;
      case Stmt::Kind::Output: append(out, eval(*s.expr, f).str()); return Flow::Normal;
      case Stmt::Kind::If:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (eval(*s.conds[i], f).truthy()) return exec_body(s.bodies[i], f, out);
        return exec_body(s.else_body, f, out);
      case Stmt::Kind::For: return exec_for(s, f, out);
      case Stmt::Kind::Set: exec_set(s, f); return Flow::Normal;
      case Stmt::Kind::Macro: f->vars[s.name] = make_macro(s, f); return Flow::Normal;
      case Stmt::Kind::CallBlock: {
        const Expr& call = *s.expr;
        CallArgs args = eval_args(call, f, 1);
        args.keyword.emplace_back("caller", make_macro(s, f));
        const Expr& callee = *call.args[0];
        if (callee.kind == Expr::Kind::Attr) append(out, call_method(eval(*callee.args[0], f), callee.name, args).str());
        else append(out, call_value(eval(callee, f), args).str());
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string body;
        FramePtr inner = child_of(f);
        exec_body(s.bodies[0], inner, body);
        inner->vars[kFilterBodyVar] = Value(body);
        append(out, eval(*s.expr, inner).str());
        return Flow::Normal;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Scope: return exec_body(s.bodies[0], f, out);
    }
    return Flow::Normal;
  }

  /// Appends rendered text, keeping every output string within max_output_bytes.
  static void append(std::string& out, const std::string& piece) {
    check_string_size(out.size() + piece.size(), "the rendered output");
    out += piece;
  }

  static void bind_targets(Frame& frame, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      frame.vars[targets[0]] = v;
      return;
    }
    ValueList items = iterate(v);
    if (items.size() != targets.size())
      fail("cannot unpack {} values into {} variables", items.size(), targets.size());
    for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = items[i];
  }

  Flow exec_for(const Stmt& s, const FramePtr& f, std::string& out) {
    Value seq = eval(*s.expr, f);
    ValueList items = iterate(seq);
    if (s.cond) {  // the inline filter sees each item bound to the loop variables
      ValueList kept;
      for (const Value& item : items) {
        FramePtr probe = child_of(f);
        bind_targets(*probe, s.targets, item);
        if (eval(*s.cond, probe).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_body(s.else_body, f, out);
    const int64_t depth = 1;  // loop.depth only grows in recursive loops, which are not supported
    auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      tick();  // an empty body evaluates nothing: count the iteration itself
      FramePtr iter = child_of(f);
      bind_targets(*iter, s.targets, items[static_cast<size_t>(i)]);
      ValueDict loop;
      loop.set("index", Value(i + 1));
      loop.set("index0", Value(i));
      loop.set("revindex", Value(n - i));
      loop.set("revindex0", Value(n - i - 1));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == n - 1));
      loop.set("length", Value(n));
      loop.set("depth", Value(depth));
      loop.set("depth0", Value(depth - 1));
      loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
      loop.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
      loop.set("cycle", Value::function("cycle", [i](const CallArgs& a) {
                 if (a.positional.empty()) fail("no items for cycling given");
                 return a.positional[static_cast<size_t>(i) % a.positional.size()];
               }));
      iter->vars["loop"] = Value::dict(std::move(loop));
      Flow fl = exec_body(s.bodies[0], iter, out);
      if (fl == Flow::Break) break;
    }
    return Flow::Normal;
  }

  void exec_set(const Stmt& s, const FramePtr& f) {
    Value v;
    if (s.expr) {
      v = eval(*s.expr, f);
    } else {
      std::string body;
      exec_body(s.bodies[0], child_of(f), body);
      v = Value(body);
    }
    if (!s.attr_object.empty()) {
      const Value* target = f->find(s.attr_object);
      if (!target || !target->is_namespace())
        fail("cannot assign attribute on non-namespace object '{}'", s.attr_object);
      target->as_namespace().attrs.set(s.attr_name, std::move(v));
      return;
    }
    bind_targets(*f, s.targets, v);
  }

  /// A macro (or call-block caller) as a callable value closing over its defining scope.
  Value make_macro(const Stmt& s, const FramePtr& defining) {
    const Stmt* stmt = &s;
    std::weak_ptr<Frame> weak = defining;  // avoid a reference cycle: the frame stores the macro
    return Value::function(s.name, [this, stmt, weak](const CallArgs& a) -> Value {
      FramePtr parent = weak.lock();
      if (!parent) fail("macro '{}' called outside its scope", stmt->name);
      if (++depth_ > kMaxCallDepth) {
        --depth_;
        throw TemplateLimitError(fmt::format("chat template: macro calls nested more than {} levels deep (recursion?)", kMaxCallDepth));
      }
      struct Guard {
        int& d;
        ~Guard() { --d; }
      } guard{depth_};
      FramePtr frame = child_of(parent);
      const auto& params = stmt->params;
      ValueList varargs;
      for (size_t i = 0; i < a.positional.size(); ++i) {
        if (i < params.size()) frame->vars[params[i].name] = a.positional[i];
        else varargs.push_back(a.positional[i]);
      }
      ValueDict kwargs;
      for (const auto& kw : a.keyword) {  // not a structured binding: clang 14 cannot capture one
        const std::string& k = kw.first;
        const Value& v = kw.second;
        bool is_param = std::any_of(params.begin(), params.end(), [&](const MacroParam& p) { return p.name == k; });
        if (is_param || k == "caller") frame->vars[k] = v;
        else kwargs.set(k, v);
      }
      for (size_t i = a.positional.size(); i < params.size(); ++i) {
        const MacroParam& p = params[i];
        if (frame->vars.count(p.name)) continue;
        frame->vars[p.name] = p.default_value ? eval(*p.default_value, frame)
                                              : Value::undefined("parameter '" + p.name + "' was not provided");
      }
      frame->vars["varargs"] = Value::list(std::move(varargs), true);
      frame->vars["kwargs"] = Value::dict(std::move(kwargs));
      std::string out;
      exec_body(stmt->bodies[0], frame, out);
      return Value(out);
    });
  }

  int depth_ = 0;
};

}  // namespace

Template::Template(const std::string& source)
    : body_(std::make_shared<const Body>(parse(tokenize(source)))) {}

std::string Template::render(const ValueDict& context, const RenderLimits& limits) const {
  LimitScope scope(limits);
  auto globals = std::make_shared<Frame>();
  for (const auto& [k, v] : default_globals().items) globals->vars[k] = v;
  auto root = child_of(globals);
  for (const auto& [k, v] : context.items) root->vars[k] = v;
  Renderer r;
  std::string out;
  r.exec_body(*body_, root, out);
  return out;
}

}  // namespace moefold::jinja
