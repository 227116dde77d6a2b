// `--stats` of `moefold generate` and `moefold chat`: token counts and speeds of one generation,
// printed as one line on stderr (stdout keeps only the answer, or pure JSON with --output json).
#pragma once
#include <cstdint>
#include <string>

namespace moefold {

/// One generation's counts and wall times. The first output token is sampled from the prefill's
/// logits, so decode_seconds covers the other output_tokens - 1.
struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double prefill_seconds = 0;  ///< the prompt's forward step and the first sample
  double decode_seconds = 0;   ///< every later step and sample
};

/// The stats line, e.g. "stats: prompt 6 tokens, prefill 31.2 ms (192.3 tokens/s); output 40 tokens,
/// decode 512.0 ms (76.2 tokens/s)". A rate whose time or token count is zero prints as "-".
std::string format_stats(const GenerationStats& s);

/// Writes format_stats(s) and a newline to stderr.
void print_stats(const GenerationStats& s);

}  // namespace moefold
