#include "text/jinja_parser.h"

#include <algorithm>
#include <initializer_list>

#include "core/error.h"
#include "text/jinja_builtins.h"

namespace moefold::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& toks) : toks_(toks) {}

  Body parse_template() {
    std::string found;
    Body body = parse_until({}, &found);
    return body;
  }

 private:
  // ---- token helpers ---------------------------------------------------------------------
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op) const { return cur().type == TokenType::Operator && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::Name && cur().text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::Eof: return "end of template";
      case TokenType::BlockEnd: return "end of statement block";
      case TokenType::VarEnd: return "end of print statement";
      case TokenType::Text: return "template data";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void error(const std::string& msg) const { fail("line {}: {}", cur().line, msg); }
  void expect_op(const char* op) {
    if (!accept_op(op)) error(fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) error(fmt::format("expected a name, got {}", describe(cur())));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd) error(fmt::format("expected end of statement block, got {}", describe(cur())));
    next();
  }

  static ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  /// Sets e->depth from its children and rejects a tree deeper than kMaxNesting. Every node with
  /// children passes through here, so chains built by loops (a.b.c..., 1+1+1..., x|f|f...) are bounded
  /// like nesting built by recursion: evaluating and destroying the tree recurse once per level.
  ExprPtr seal(ExprPtr e) const {
    int d = 0;
    for (const auto& a : e->args)
      if (a) d = std::max(d, a->depth);
    for (const auto& [k, v] : e->kwargs)
      if (v) d = std::max(d, v->depth);
    e->depth = d + 1;
    if (e->depth > kMaxNesting) fail("line {}: expression nested too deeply (more than {} levels)", e->line, kMaxNesting);
    return e;
  }

  // ---- statements ------------------------------------------------------------------------
  /// Parses statements until a block tag whose keyword is one of `enders`; consumes `{%` and the
  /// keyword and stores it in *found. With no enders, parses to the end of the template.
  Body parse_until(std::initializer_list<const char*> enders, std::string* found) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::Eof) {
        if (enders.size() == 0) return body;
        std::string list;
        for (const char* e : enders) list += (list.empty() ? "'" : " or '") + std::string(e) + "'";
        error("unexpected end of template; expected " + list);
      }
      if (t.type == TokenType::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
        continue;
      }
      if (t.type == TokenType::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = t.line;
        s->expr = parse_tuple(true);
        if (cur().type != TokenType::VarEnd) error("expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(s));
        continue;
      }
      if (t.type != TokenType::BlockBegin) error("unexpected " + describe(t));
      const Token& kw = peek();
      if (kw.type != TokenType::Name) fail("line {}: tag name expected", kw.line);
      for (const char* e : enders) {
        if (kw.text == e) {
          next();
          next();
          *found = e;
          return body;
        }
      }
      next();
      body.push_back(parse_statement());
    }
  }

  StmtPtr new_stmt(Stmt::Kind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const Token kw = next();
    const std::string& k = kw.text;
    std::string found;
    if (k == "if") {
      auto s = new_stmt(Stmt::Kind::If, kw.line);
      s->conds.push_back(parse_tuple(true));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_until({"elif", "else", "endif"}, &found));
        if (found == "elif") {
          s->conds.push_back(parse_tuple(true));
          expect_block_end();
          continue;
        }
        if (found == "else") {
          expect_block_end();
          s->else_body = parse_until({"endif"}, &found);
        }
        expect_block_end();
        return s;
      }
    }
    if (k == "for") {
      auto s = new_stmt(Stmt::Kind::For, kw.line);
      bool paren = accept_op("(");
      s->targets.push_back(expect_name());
      while (accept_op(",")) {
        if (cur().type != TokenType::Name || is_name("in")) break;
        s->targets.push_back(expect_name());
      }
      if (paren) expect_op(")");
      if (!accept_name("in")) error("expected 'in' in for loop, got " + describe(cur()));
      s->expr = parse_tuple(false);
      if (accept_name("if")) s->cond = parse_expression(true);
      if (is_name("recursive")) error("recursive for loops are not supported");
      expect_block_end();
      s->bodies.push_back(parse_until({"else", "endfor"}, &found));
      if (found == "else") {
        expect_block_end();
        s->else_body = parse_until({"endfor"}, &found);
      }
      expect_block_end();
      return s;
    }
    if (k == "set") {
      auto s = new_stmt(Stmt::Kind::Set, kw.line);
      std::string first = expect_name();
      if (accept_op(".")) {
        s->attr_object = first;
        s->attr_name = expect_name();
      } else {
        s->targets.push_back(first);
        while (accept_op(",")) s->targets.push_back(expect_name());
      }
      if (accept_op("=")) {
        s->expr = parse_tuple(true);
        expect_block_end();
        return s;
      }
      if (!s->attr_object.empty() || s->targets.size() != 1) error("block set needs a single name");
      expect_block_end();
      s->bodies.push_back(parse_until({"endset"}, &found));
      expect_block_end();
      return s;
    }
    if (k == "macro") {
      auto s = new_stmt(Stmt::Kind::Macro, kw.line);
      s->name = expect_name();
      parse_signature(*s);
      expect_block_end();
      s->bodies.push_back(parse_until({"endmacro"}, &found));
      if (cur().type == TokenType::Name) next();  // {% endmacro name %}
      expect_block_end();
      return s;
    }
    if (k == "call") {
      auto s = new_stmt(Stmt::Kind::CallBlock, kw.line);
      if (is_op("(")) parse_signature(*s);
      s->expr = parse_expression(true);
      if (s->expr->kind != Expr::Kind::Call) error("expected a call in call block");
      expect_block_end();
      s->bodies.push_back(parse_until({"endcall"}, &found));
      expect_block_end();
      return s;
    }
    if (k == "filter") {
      auto s = new_stmt(Stmt::Kind::FilterBlock, kw.line);
      auto placeholder = make(Expr::Kind::Name, kw.line);
      placeholder->name = kFilterBodyVar;
      ExprPtr chain = parse_filter(std::move(placeholder), false);
      while (is_op("|")) chain = parse_filter(std::move(chain), true);
      s->expr = std::move(chain);
      expect_block_end();
      s->bodies.push_back(parse_until({"endfilter"}, &found));
      expect_block_end();
      return s;
    }
    if (k == "break" || k == "continue") {
      auto s = new_stmt(k == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, kw.line);
      expect_block_end();
      return s;
    }
    if (k == "generation") {  // HF's assistant-mask extension: renders its body unchanged
      auto s = new_stmt(Stmt::Kind::Scope, kw.line);
      expect_block_end();
      s->bodies.push_back(parse_until({"endgeneration"}, &found));
      expect_block_end();
      return s;
    }
    fail("line {}: unknown or unsupported tag '{}'", kw.line, k);
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (accept_op("=")) p.default_value = parse_expression(true);
      s.params.push_back(std::move(p));
    }
    expect_op(")");
  }

  // ---- expressions -----------------------------------------------------------------------
  /// An expression, or a bare tuple `a, b` (used by print, set and for).
  ExprPtr parse_tuple(bool with_condexpr) {
    int line = cur().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::Tuple, line);
    t->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (!starts_expression()) break;
      t->args.push_back(parse_expression(with_condexpr));
    }
    return seal(std::move(t));
  }

  bool starts_expression() const {
    const Token& t = cur();
    if (t.type == TokenType::Name) return !(t.text == "in" || t.text == "if" || t.text == "else");
    if (t.type == TokenType::String || t.type == TokenType::Integer || t.type == TokenType::Float) return true;
    if (t.type == TokenType::Operator) return t.text == "(" || t.text == "[" || t.text == "{" || t.text == "-" || t.text == "+";
    return false;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      int line = next().line;
      auto c = make(Expr::Kind::Cond, line);
      c->args.push_back(std::move(e));
      c->args.push_back(parse_or());
      if (accept_name("else")) c->args.push_back(parse_expression(true));
      else c->args.push_back(nullptr);
      e = seal(std::move(c));
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto b = make(Expr::Kind::Binary, line);
    b->name = op;
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return seal(std::move(b));
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      int line = next().line;
      l = binary("or", std::move(l), parse_and(), line);
    }
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      int line = next().line;
      l = binary("and", std::move(l), parse_not(), line);
    }
    return l;
  }

  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      int line = next().line;
      auto u = make(Expr::Kind::Unary, line);
      u->name = "not";
      u->args.push_back(parse_not());
      return seal(std::move(u));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::Operator &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == TokenType::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? seal(std::move(cmp)) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      l = binary(t.text, std::move(l), parse_concat(), t.line);
    }
    return l;
  }

  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      int line = next().line;
      l = binary("~", std::move(l), parse_math2(), line);
    }
    return l;
  }

  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      l = binary(t.text, std::move(l), parse_pow(), t.line);
    }
    return l;
  }

  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      int line = next().line;
      l = binary("**", std::move(l), parse_unary(true), line);
    }
    return l;
  }

  /// Bounds parser recursion so that pathological nesting fails cleanly instead of overflowing
  /// the stack.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.error("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };
  static constexpr int kMaxNesting = 512;

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      node = make(Expr::Kind::Unary, t.line);
      node->name = t.text;
      node->args.push_back(parse_unary(false));
      node = seal(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    if (t.type == TokenType::Name) {
      next();
      auto e = make(Expr::Kind::Literal, t.line);
      if (t.text == "true" || t.text == "True") e->value = Value(true);
      else if (t.text == "false" || t.text == "False") e->value = Value(false);
      else if (t.text == "none" || t.text == "None") e->value = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == TokenType::String) {
      auto e = make(Expr::Kind::Literal, t.line);
      std::string s;
      while (cur().type == TokenType::String) s += next().text;  // adjacent literals concatenate
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == TokenType::Integer || t.type == TokenType::Float) {
      next();
      auto e = make(Expr::Kind::Literal, t.line);
      e->value = t.type == TokenType::Integer ? Value(t.int_value) : Value(t.float_value);
      return e;
    }
    if (is_op("(")) {
      int line = next().line;
      if (accept_op(")")) return make(Expr::Kind::Tuple, line);
      ExprPtr first = parse_expression(true);
      if (accept_op(")")) return first;
      auto tup = make(Expr::Kind::Tuple, line);
      tup->args.push_back(std::move(first));
      while (accept_op(",")) {
        if (is_op(")")) break;
        tup->args.push_back(parse_expression(true));
      }
      expect_op(")");
      return seal(std::move(tup));
    }
    if (is_op("[")) {
      int line = next().line;
      auto l = make(Expr::Kind::List, line);
      while (!is_op("]")) {
        if (!l->args.empty()) expect_op(",");
        if (is_op("]")) break;
        l->args.push_back(parse_expression(true));
      }
      expect_op("]");
      return seal(std::move(l));
    }
    if (is_op("{")) {
      int line = next().line;
      auto d = make(Expr::Kind::Dict, line);
      while (!is_op("}")) {
        if (!d->args.empty()) expect_op(",");
        if (is_op("}")) break;
        d->args.push_back(parse_expression(true));
        expect_op(":");
        d->args.push_back(parse_expression(true));
      }
      expect_op("}");
      return seal(std::move(d));
    }
    error("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        int line = next().line;
        if (cur().type == TokenType::Integer) {
          auto it = make(Expr::Kind::Item, line);
          auto idx = make(Expr::Kind::Literal, line);
          idx->value = Value(next().int_value);
          it->args.push_back(std::move(node));
          it->args.push_back(std::move(idx));
          node = seal(std::move(it));
        } else {
          auto a = make(Expr::Kind::Attr, line);
          a->name = expect_name();
          a->args.push_back(std::move(node));
          node = seal(std::move(a));
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    int line = next().line;  // '['
    ExprPtr parts[3];
    bool is_slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (accept_op(":")) {
      is_slice = true;
      if (!is_op(":") && !is_op("]")) parts[1] = parse_expression(true);
      if (accept_op(":") && !is_op("]")) parts[2] = parse_expression(true);
    }
    expect_op("]");
    if (!is_slice) {
      auto it = make(Expr::Kind::Item, line);
      it->args.push_back(std::move(node));
      it->args.push_back(std::move(parts[0]));
      return seal(std::move(it));
    }
    auto sl = make(Expr::Kind::Slice, line);
    sl->args.push_back(std::move(node));
    for (auto& p : parts) sl->args.push_back(std::move(p));
    return seal(std::move(sl));
  }

  /// Parses `(args, kw=value)` into `e` (args appended after whatever e->args already holds).
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error("*args / **kwargs in calls are not supported");
      if (cur().type == TokenType::Name && peek().type == TokenType::Operator && peek().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error("positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make(Expr::Kind::Call, cur().line);
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return seal(std::move(c));
  }

  ExprPtr parse_filter(ExprPtr operand, bool pipe) {
    if (pipe) expect_op("|");
    int line = cur().line;
    std::string name = expect_name();
    while (accept_op(".")) name += "." + expect_name();
    if (!is_known_filter(name)) fail("line {}: no filter named '{}'", line, name);
    auto f = make(Expr::Kind::Filter, line);
    f->name = name;
    f->args.push_back(std::move(operand));
    if (is_op("(")) parse_call_args(*f);
    return seal(std::move(f));
  }

  ExprPtr parse_test(ExprPtr operand) {
    int line = next().line;  // 'is'
    bool negated = accept_name("not");
    std::string name = expect_name();
    while (accept_op(".")) name += "." + expect_name();
    if (!is_known_test(name)) fail("line {}: no test named '{}'", line, name);
    auto t = make(Expr::Kind::Test, line);
    t->name = name;
    t->negated = negated;
    t->args.push_back(std::move(operand));
    if (is_op("(")) {
      parse_call_args(*t);
    } else {
      const Token& c = cur();
      bool arg_start = c.type == TokenType::Name || c.type == TokenType::String || c.type == TokenType::Integer ||
                       c.type == TokenType::Float ||
                       (c.type == TokenType::Operator && (c.text == "(" || c.text == "[" || c.text == "{"));
      if (arg_start && !(c.type == TokenType::Name && (c.text == "else" || c.text == "or" || c.text == "and"))) {
        if (c.type == TokenType::Name && c.text == "is") error("you cannot chain multiple tests with is");
        t->args.push_back(parse_postfix(parse_primary()));
      }
    }
    return seal(std::move(t));
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) node = parse_filter(std::move(node), true);
      else if (is_name("is")) node = parse_test(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  const std::vector<Token>& toks_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace moefold::jinja
