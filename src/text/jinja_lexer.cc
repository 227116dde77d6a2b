#include "text/jinja_lexer.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "text/jinja_strings.h"

namespace moefold::jinja {
namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/// Jinja normalises every newline to "\n" and (by default) drops one trailing newline.
std::string normalize(const std::string& src, bool keep_trailing_newline) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void append_utf8(std::string& out, uint32_t cp) { out += utf8_encode(std::u32string(1, static_cast<char32_t>(cp))); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Python "unicode-escape" decoding of a string literal body, as Jinja applies it.
std::string unescape(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          int h = i + 1 + k < body.size() ? hex_value(body[i + 1 + k]) : -1;
          if (h < 0) fail("line {}: truncated \\{} escape in string literal", line, e);
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        i += digits;
        append_utf8(out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          append_utf8(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const LexerOptions& opt) : src_(std::move(src)), opt_(opt) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t t = find_tag(pos_);
      if (t == std::string::npos) {
        emit_text(src_.substr(pos_), line_);
        advance_to(src_.size());
        break;
      }
      char kind = src_[t + 1];
      char sign = t + 2 < src_.size() ? src_[t + 2] : '\0';
      if (sign != '-' && sign != '+') sign = '\0';
      std::string text = src_.substr(pos_, t - pos_);
      if (sign == '-') {
        text = py_strip(text, std::nullopt, false, true);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool only_blank = text.find_first_not_of(" \t", l_pos) == std::string::npos;
          if (only_blank) text.resize(l_pos);
        }
      }
      int text_line = line_;
      emit_text(text, text_line);
      advance_to(t + 2 + (sign ? 1 : 0));
      size_t consumed_from = pos_;
      if (kind == '#') {
        lex_comment();
      } else if (kind == '%' && try_raw()) {
        // raw block handled
      } else {
        lex_tag(kind == '{');
      }
      line_starting = pos_ > consumed_from && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{TokenType::Eof, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  void advance_to(size_t p) {
    for (size_t i = pos_; i < p && i < src_.size(); ++i)
      if (src_[i] == '\n') ++line_;
    pos_ = p;
  }

  void emit_text(const std::string& text, int line) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::Text, text, 0, 0, line});
  }

  void skip_ws() {
    while (pos_ < src_.size() && is_ws(src_[pos_])) advance_to(pos_ + 1);
  }

  /// After a block or comment end: `-` eats all following whitespace, `+` nothing, plain ends
  /// eat one newline when trim_blocks is on.
  void after_block_end(char sign) {
    if (sign == '-') skip_ws();
    else if (sign != '+' && opt_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') advance_to(pos_ + 1);
  }

  void lex_comment() {
    int start_line = line_;
    size_t e = src_.find("#}", pos_);
    if (e == std::string::npos) fail("line {}: missing end of comment tag", start_line);
    char sign = e > pos_ && (src_[e - 1] == '-' || src_[e - 1] == '+') ? src_[e - 1] : '\0';
    advance_to(e + 2);
    after_block_end(sign);
  }

  bool starts_with(size_t p, const char* s) const { return src_.compare(p, std::strlen(s), s) == 0; }

  /// Handles `{% raw %}...{% endraw %}`; returns false (consuming nothing) when the tag is not raw.
  bool try_raw() {
    size_t p = pos_;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (!starts_with(p, "raw")) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    bool strip_after = false;
    if (starts_with(p, "-%}")) {
      strip_after = true;
      p += 3;
    } else if (starts_with(p, "%}")) {
      p += 2;
    } else {
      return false;
    }
    int start_line = line_;
    advance_to(p);
    if (strip_after) skip_ws();
    // Find the matching {% endraw %}.
    size_t q = pos_;
    while (true) {
      q = src_.find("{%", q);
      if (q == std::string::npos) fail("line {}: missing {{% endraw %}}", start_line);
      size_t r = q + 2;
      char sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : '\0';
      if (sign) ++r;
      while (r < src_.size() && is_ws(src_[r])) ++r;
      if (!starts_with(r, "endraw")) {
        q += 2;
        continue;
      }
      r += 6;
      while (r < src_.size() && is_ws(src_[r])) ++r;
      char end_sign = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) end_sign = src_[r++];
      if (!starts_with(r, "%}")) fail("line {}: malformed endraw tag", line_);
      std::string body = src_.substr(pos_, q - pos_);
      if (sign == '-') {
        body = py_strip(body, std::nullopt, false, true);
      } else if (sign != '+' && opt_.lstrip_blocks) {
        size_t l_pos = body.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (body.find_first_not_of(" \t", l_pos) == std::string::npos && l_pos > 0) body.resize(l_pos);
      }
      emit_text(body, line_);
      advance_to(r + 2);
      after_block_end(end_sign);
      return true;
    }
  }

  void lex_tag(bool variable) {
    int start_line = line_;
    tokens_.push_back(Token{variable ? TokenType::VarBegin : TokenType::BlockBegin, "", 0, 0, line_});
    int depth = 0;
    while (true) {
      skip_ws();
      if (pos_ >= src_.size()) fail("line {}: unexpected end of template inside a tag", start_line);
      if (depth == 0) {
        if (variable) {
          if (starts_with(pos_, "-}}")) {
            advance_to(pos_ + 3);
            skip_ws();
            tokens_.push_back(Token{TokenType::VarEnd, "", 0, 0, line_});
            return;
          }
          if (starts_with(pos_, "}}")) {
            advance_to(pos_ + 2);
            tokens_.push_back(Token{TokenType::VarEnd, "", 0, 0, line_});
            return;
          }
        } else {
          char sign = '\0';
          size_t len = 0;
          if (starts_with(pos_, "-%}")) sign = '-', len = 3;
          else if (starts_with(pos_, "+%}")) sign = '+', len = 3;
          else if (starts_with(pos_, "%}")) len = 2;
          if (len) {
            tokens_.push_back(Token{TokenType::BlockEnd, "", 0, 0, line_});
            advance_to(pos_ + len);
            after_block_end(sign);
            return;
          }
        }
      }
      lex_expr_token(depth);
    }
  }

  void lex_expr_token(int& depth) {
    char c = src_[pos_];
    int line = line_;
    if (c == '\'' || c == '"') {
      size_t p = pos_ + 1;
      while (p < src_.size() && src_[p] != c) p += src_[p] == '\\' ? 2 : 1;
      if (p >= src_.size()) fail("line {}: unterminated string literal", line);
      std::string body = src_.substr(pos_ + 1, p - pos_ - 1);
      advance_to(p + 1);
      tokens_.push_back(Token{TokenType::String, unescape(body, line), 0, 0, line});
      return;
    }
    if (is_digit(c)) {
      bool after_dot = !tokens_.empty() && tokens_.back().type == TokenType::Operator && tokens_.back().text == ".";
      size_t p = pos_;
      auto digits = [&](size_t q) {
        while (q < src_.size() && (is_digit(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() && is_digit(src_[q + 1]))))
          ++q;
        return q;
      };
      p = digits(p);
      bool is_float = false;
      if (!after_dot && p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
        p = digits(p + 1);
        is_float = true;
      }
      if (!after_dot && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && is_digit(src_[q])) {
          p = digits(q);
          is_float = true;
        }
      }
      std::string text;
      for (size_t i = pos_; i < p; ++i)
        if (src_[i] != '_') text += src_[i];
      advance_to(p);
      Token tok{is_float ? TokenType::Float : TokenType::Integer, text, 0, 0, line};
      if (is_float) {
        tok.float_value = std::strtod(text.c_str(), nullptr);  // out of range: +-inf or 0, as Python
      } else {
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), tok.int_value);
        if (ec != std::errc() || end != text.data() + text.size())
          fail("line {}: integer literal {} does not fit in 64 bits", line, text);
      }
      tokens_.push_back(tok);
      return;
    }
    if (is_name_start(c)) {
      size_t p = pos_;
      while (p < src_.size() && is_name_char(src_[p])) ++p;
      tokens_.push_back(Token{TokenType::Name, src_.substr(pos_, p - pos_), 0, 0, line});
      advance_to(p);
      return;
    }
    static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two) {
      if (starts_with(pos_, op)) {
        tokens_.push_back(Token{TokenType::Operator, op, 0, 0, line});
        advance_to(pos_ + 2);
        return;
      }
    }
    if (std::strchr("+-*/%~<>=.,:|()[]{}", c)) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) fail("line {}: unexpected '{}'", line, c);
        --depth;
      }
      tokens_.push_back(Token{TokenType::Operator, std::string(1, c), 0, 0, line});
      advance_to(pos_ + 1);
      return;
    }
    fail("line {}: unexpected character '{}' in tag", line, c);
  }

  std::string src_;
  LexerOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexerOptions& opt) {
  return Lexer(normalize(source, opt.keep_trailing_newline), opt).run();
}

}  // namespace moefold::jinja
