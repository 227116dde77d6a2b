// `--stats` lines (contract: generation_stats.h).
#include "cli/generation_stats.h"

#include <cstdio>
#include <fmt/format.h>

namespace moefold {

namespace {

std::string rate(int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return "-";
  return fmt::format("{:.1f}", double(tokens) / seconds);
}

}  // namespace

std::string format_stats(const GenerationStats& s) {
  const int64_t decoded = s.output_tokens > 1 ? s.output_tokens - 1 : 0;
  return fmt::format("stats: prompt {} tokens, prefill {:.1f} ms ({} tokens/s); output {} tokens, decode {:.1f} ms ({} tokens/s)",
                     s.prompt_tokens, s.prefill_seconds * 1e3, rate(s.prompt_tokens, s.prefill_seconds),
                     s.output_tokens, s.decode_seconds * 1e3, rate(decoded, s.decode_seconds));
}

void print_stats(const GenerationStats& s) {
  const std::string line = format_stats(s);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace moefold
