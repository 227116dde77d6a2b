// libFuzzer target: tokenizer.json loading (Tokenizer::from_json, text/tokenizer.h). A tokenizer that
// loads then encodes a fixed text (words, digits, whitespace runs, non-ASCII, every added token's
// content) and decodes the ids back, so that a file which loads but breaks encoding is caught too.
#include "fuzz_util.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moefold::fuzz::expect_ok_or_error([&] {
    moefold::Tokenizer tok = moefold::Tokenizer::from_json(moefold::fuzz::as_string(data, size));
    std::string text = "Hello, world! It's 2026: 12345 tokens\n\n  \t indented \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 ";
    for (const auto& t : tok.added_tokens()) text += t.content + " x";
    std::vector<int32_t> ids = tok.encode(text, /*add_special_tokens=*/true);
    tok.decode(ids, /*skip_special_tokens=*/false);
    tok.decode(ids, /*skip_special_tokens=*/true);
  });
  return 0;
}
