// Jinja lexer: splits template source into text and tag tokens, applying Jinja's whitespace
// control exactly as HF renders chat templates (trim_blocks=True, lstrip_blocks=True, `-`/`+`
// modifiers, newline normalisation, one trailing newline dropped), and tokenizes the
// expressions inside `{{ }}` and `{% %}`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moefold::jinja {

enum class TokenType {
  Text,        // literal template text (already whitespace-processed)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,        // identifier or keyword
  String,      // string literal (value unescaped)
  Integer,
  Float,
  Operator,    // punctuation / operator, spelled in `text`
  Eof,
};

/// One lexical token with the 1-based source line it starts on.
struct Token {
  TokenType type;
  std::string text;  // text, identifier, unescaped string literal or operator spelling
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

/// Whitespace options of the Jinja environment.
struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

/// Tokenizes a whole template. Throws moefold::Error ("line N: ...") on lexical errors such as an
/// unterminated tag or string.
std::vector<Token> tokenize(const std::string& source, const LexerOptions& opt = {});

}  // namespace moefold::jinja
