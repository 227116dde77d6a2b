#include "text/jinja_strings.h"

#include "core/error.h"
#include "text/jinja_limits.h"

namespace moefold::jinja {

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    size_t n;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if ((c >> 5) == 0x6) {
      cp = c & 0x1f;
      n = 2;
    } else if ((c >> 4) == 0xe) {
      cp = c & 0x0f;
      n = 3;
    } else if ((c >> 3) == 0x1e) {
      cp = c & 0x07;
      n = 4;
    } else {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    if (i + n > s.size()) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    bool ok = true;
    for (size_t k = 1; k < n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    out += cp;
    i += n;
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xc0) != 0x80) ++n;
  return n;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t f = s.find(*sep, pos);
      if (f == std::string::npos) break;
      out.push_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.push_back(s.substr(pos));
    return out;
  }
  std::u32string u = utf8_decode(s);
  size_t i = 0;
  while (i < u.size()) {
    while (i < u.size() && py_isspace(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t e = u.size();
      while (e > i && py_isspace(u[e - 1])) --e;
      out.push_back(utf8_encode(u.substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !py_isspace(u[j])) ++j;
    out.push_back(utf8_encode(u.substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0) return py_split(s, sep, maxsplit);
  std::vector<std::string> rev;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    size_t end = s.size();
    while (static_cast<int64_t>(rev.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string::npos) break;
      rev.push_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    rev.push_back(s.substr(0, end));
  } else {
    std::u32string u = utf8_decode(s);
    size_t e = u.size();
    while (e > 0) {
      while (e > 0 && py_isspace(u[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<int64_t>(rev.size()) >= maxsplit) {
        size_t b = 0;
        while (b < e && py_isspace(u[b])) ++b;
        rev.push_back(utf8_encode(u.substr(b, e - b)));
        break;
      }
      size_t b = e;
      while (b > 0 && !py_isspace(u[b - 1])) --b;
      rev.push_back(utf8_encode(u.substr(b, e - b)));
      e = b;
    }
  }
  return {rev.rbegin(), rev.rend()};
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every code point
    std::u32string u = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < u.size()) out += utf8_encode(std::u32string(1, u[i]));
      check_string_size(out.size(), "replace");
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    check_string_size(out.size(), "replace");
    pos = f + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

namespace {

char32_t to_upper_cp(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;  // Greek
  if (c >= 0x430 && c <= 0x44f) return c - 32;                // Cyrillic
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

char32_t to_lower_cp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

bool is_cased_letter(char32_t c) { return to_upper_cp(c) != c || to_lower_cp(c) != c; }

}  // namespace

std::string py_upper(const std::string& s) {
  std::u32string u = utf8_decode(s);
  for (auto& c : u) c = to_upper_cp(c);
  return utf8_encode(u);
}

std::string py_lower(const std::string& s) {
  std::u32string u = utf8_decode(s);
  for (auto& c : u) c = to_lower_cp(c);
  return utf8_encode(u);
}

std::string py_title(const std::string& s) {
  std::u32string u = utf8_decode(s);
  bool prev_cased = false;
  for (auto& c : u) {
    bool cased = is_cased_letter(c);
    c = prev_cased ? to_lower_cp(c) : to_upper_cp(c);
    prev_cased = cased;
  }
  return utf8_encode(u);
}

std::string py_capitalize(const std::string& s) {
  std::u32string u = utf8_decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_upper_cp(u[i]) : to_lower_cp(u[i]);
  return utf8_encode(u);
}

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> out;
  std::u32string u = utf8_decode(s);
  std::u32string cur;
  for (size_t i = 0; i < u.size(); ++i) {
    char32_t c = u[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (brk) {
      out.push_back(utf8_encode(cur));
      cur.clear();
      if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(utf8_encode(cur));
  return out;
}

std::vector<size_t> slice_indices(size_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  std::optional<int64_t> step) {
  int64_t n = static_cast<int64_t>(len);
  int64_t st = step.value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (x < lo) x = lo;
    if (x > hi) x = hi;
    return x;
  };
  std::vector<size_t> out;
  if (st > 0) {
    int64_t b = clamp(start, 0, 0, n), e = clamp(stop, n, 0, n);
    for (int64_t i = b; i < e; i += st) out.push_back(static_cast<size_t>(i));
  } else {
    int64_t b = clamp(start, n - 1, -1, n - 1), e = clamp(stop, -1, -1, n - 1);
    for (int64_t i = b; i > e; i += st) out.push_back(static_cast<size_t>(i));
  }
  return out;
}

std::string py_slice(const std::string& s, std::optional<int64_t> start, std::optional<int64_t> stop,
                     std::optional<int64_t> step) {
  std::u32string u = utf8_decode(s);
  std::u32string out;
  for (size_t i : slice_indices(u.size(), start, stop, step)) out += u[i];
  return utf8_encode(out);
}

}  // namespace moefold::jinja
