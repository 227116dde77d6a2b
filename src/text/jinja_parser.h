// Jinja parser: token stream -> syntax tree, with Jinja's operator precedence (filters and tests
// bind tighter than arithmetic; `~` sits between `+`/`-` and `*`/`/`), and compile-time checks
// for unknown tags, filters and tests.
#pragma once

#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace moefold::jinja {

/// Parses a token stream into the template body. Throws moefold::Error ("line N: ...") on syntax
/// errors, unknown tags, and filters or tests the engine does not implement.
Body parse(const std::vector<Token>& tokens);

}  // namespace moefold::jinja
