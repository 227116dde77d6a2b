// libFuzzer target: an HTTP request body through the server's request parser
// (server::parse_request, src/server/request_parser.h), as /v1/chat/completions (first input byte even)
// or /v1/completions (odd), with the SmolLM2 tokenizer and chat template from tests/fixtures.
// Contract: parse_request returns or throws server::ApiError; nothing else escapes.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "fuzz_util.h"
#include "server/api_error.h"
#include "server/request_parser.h"

namespace {
struct Served {
  moefold::Tokenizer tok;
  moefold::ChatTemplate tmpl;
  moefold::server::ModelInfo info;
  Served()
      : tok(moefold::Tokenizer::from_file(MOEFOLD_FIXTURES "/tokenizer/smollm2/tokenizer.json")),
        tmpl(moefold::ChatTemplate::from_model_dir(MOEFOLD_FIXTURES "/chat_templates/smollm2")) {
    info.name = "m";
    info.max_model_len = 2048;
    info.vocab_size = int64_t(tok.vocab_size());
    info.tokenizer = &tok;
    info.chat_template = &tmpl;
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Served served;
  if (size == 0) return 0;
  auto api = data[0] % 2 ? moefold::server::Api::kCompletions : moefold::server::Api::kChat;
  try {
    moefold::server::parse_request(api, moefold::fuzz::as_string(data + 1, size - 1), served.info);
  } catch (const moefold::server::ApiError& e) {
    if (e.status() < 400 || e.status() > 599) std::abort();
  }
  return 0;
}
