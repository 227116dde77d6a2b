// A compact Jinja2 interpreter for Hugging Face chat templates.
//
// Why not a library: no maintained C++ Jinja engine is installable from Debian or PyPI (PyPI's
// `minja` is an unrelated Python regex templater, not Google's C++ minja; Debian has no C++
// Jinja package, and pantor/inja is not Jinja-compatible enough for HF templates), and vendoring
// another project's source is not allowed here. So moefold carries its own interpreter, scoped
// to what chat templates use and verified byte-for-byte against transformers' rendering.
//
// Implemented subset (see docs/chat_templates.md for the full list):
//  - `{{ }}`, `{% %}`, `{# #}` with `-`/`+` whitespace control, trim_blocks, lstrip_blocks,
//    newline normalisation and the dropped trailing newline, `{% raw %}`.
//  - Statements: if/elif/else, for (tuple unpacking, inline `if` filter, else branch, loop.*
//    variables, break/continue), set (names, tuples, `ns.attr`, block set), macro (defaults,
//    keyword arguments, caller), call blocks, filter blocks, HF's `{% generation %}`.
//  - Expressions: literals, list/tuple/dict displays, attribute/item access, slicing, calls,
//    filters, tests, `not and or`, comparisons (chained), `in`/`not in`, `+ - * / // % **`, `~`,
//    conditional expressions; Python semantics for str/list/dict values and their common methods.
//  - Globals: range, namespace, dict, raise_exception, strftime_now.
// Not implemented: template inheritance/includes/imports, recursive loops, autoescaping.
#pragma once

#include <memory>
#include <string>

#include "text/jinja_ast.h"
#include "text/jinja_limits.h"
#include "text/jinja_value.h"

namespace moefold::jinja {

/// A parsed template, renderable any number of times (rendering does not mutate it).
class Template {
 public:
  /// Parses `source` with HF's environment settings (trim_blocks, lstrip_blocks). Throws
  /// moefold::Error naming the line for syntax errors and unknown filters/tests.
  explicit Template(const std::string& source);

  /// Renders with `context` as the template's global variables (on top of the built-in globals),
  /// under `limits` (time, output size, list sizes, nesting depth). Throws moefold::Error naming the
  /// line for runtime errors, including raise_exception(), and TemplateLimitError (a moefold::Error)
  /// when the render goes over a limit.
  std::string render(const ValueDict& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace moefold::jinja
