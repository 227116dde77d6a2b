// Jinja syntax tree: expression and statement nodes produced by the parser and walked by the
// evaluator. Nodes are generic (kind + children) to keep the tree small and easy to print.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace moefold::jinja {

/// Name of the placeholder variable that holds the rendered body of a `{% filter %}` block.
inline constexpr const char* kFilterBodyVar = "\x01filter_body";

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// An expression node. Field use per kind:
///  Literal:  value
///  Name:     name
///  List/Tuple: args = elements
///  Dict:     args = key0, value0, key1, value1, ...
///  Attr:     args[0] = object, name = attribute
///  Item:     args[0] = object, args[1] = subscript
///  Slice:    args[0] = object, args[1..3] = start, stop, step (nullptr when omitted)
///  Call:     args[0] = callee, args[1..] = positional, kwargs = keyword arguments
///  Filter:   name = filter, args[0] = operand, args[1..] = positional, kwargs
///  Test:     name = test, args[0] = operand, args[1..] = positional, negated
///  Unary:    name = "not" | "-" | "+", args[0]
///  Binary:   name = operator ("+", "-", "*", "/", "//", "%", "**", "~", "and", "or"), args[0..1]
///  Compare:  args[0] = first operand, ops[i] applies to args[i] and args[i+1] (chained)
///  Cond:     args[0] = then, args[1] = condition, args[2] = else (nullptr when omitted)
struct Expr {
  enum class Kind { Literal, Name, List, Tuple, Dict, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, Compare, Cond };
  Kind kind;
  int line = 0;
  std::string name;
  Value value;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
  int depth = 1;  ///< height of this subtree (a leaf is 1); the parser bounds it (jinja_limits.h)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// A macro parameter with an optional default.
struct MacroParam {
  std::string name;
  ExprPtr default_value;
};

/// A statement node. Field use per kind:
///  Text:      text
///  Output:    expr
///  If:        conds[i] guards bodies[i]; else_body for the final else
///  For:       targets (loop variables), expr = iterable, cond = inline `if` filter (optional),
///             bodies[0] = loop body, else_body
///  Set:       targets (names; several = tuple unpacking) or attr_object.attr_name (namespace
///             attribute); expr = value, or bodies[0] for a block set (`{% set x %}..{% endset %}`)
///  Macro:     name, params, bodies[0]
///  CallBlock: expr = macro call, params = caller's parameters, bodies[0] = caller body
///  FilterBlock: filters (a Filter expression chain whose innermost operand is a placeholder),
///             bodies[0]
///  Break / Continue: nothing
///  Scope:     bodies[0] (e.g. HF's {% generation %}: rendered as-is)
struct Stmt {
  enum class Kind { Text, Output, If, For, Set, Macro, CallBlock, FilterBlock, Break, Continue, Scope };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr_object;
  std::string attr_name;
  std::vector<MacroParam> params;
};

}  // namespace moefold::jinja
