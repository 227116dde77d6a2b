// Shared helpers of the libFuzzer targets (docs/fuzzing.md).
//
// Contract every target checks: a parser of untrusted input either succeeds or throws
// moefold::Error (the request parser: server::ApiError). Any other exception escapes the fuzz
// entry point, and libFuzzer reports it as a crash, like a sanitizer finding or a timeout.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace moefold::fuzz {

/// The fuzzer input as a string.
inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

/// Runs `f`, swallowing the documented error type: what the parser is allowed to throw.
template <class F>
void expect_ok_or_error(F&& f) {
  try {
    f();
  } catch (const moefold::Error&) {
  }
}

}  // namespace moefold::fuzz
