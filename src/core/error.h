// Errors: every failure the user can cause or observe is a moefold::Error with a clear message.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace moefold {

/// The one exception type moefold throws for bad input, bad files and violated preconditions.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Throws Error with a fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace moefold

/// Precondition check that throws moefold::Error (never aborts).
#define MOEFOLD_CHECK(cond, ...)                 \
  do {                                           \
    if (!(cond)) ::moefold::fail(__VA_ARGS__);   \
  } while (0)
