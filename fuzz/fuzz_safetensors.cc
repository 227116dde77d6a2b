// libFuzzer target: a .safetensors image (8-byte header length, JSON header, data) through
// parse_safetensors (io/safetensors.h), then every accepted tensor is read in full (to_f32 for float
// dtypes), so that AddressSanitizer catches a view reaching outside the input.
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes: ASan then flags any read past the image.
  std::vector<uint8_t> image(data, data + size);
  moefold::fuzz::expect_ok_or_error([&] {
    auto tensors = moefold::parse_safetensors(image.data(), image.size(), "fuzz.safetensors");
    for (const auto& [name, t] : tensors) {
      if (t.dtype == moefold::DType::F32 || t.dtype == moefold::DType::BF16 || t.dtype == moefold::DType::F16 ||
          t.dtype == moefold::DType::F8_E4M3) {
        std::vector<float> v = t.to_f32();
        volatile float sink = v.empty() ? 0.0f : v.back();
        (void)sink;
      }
      uint8_t acc = 0;
      for (size_t i = 0; i < t.nbytes; ++i) acc ^= static_cast<const uint8_t*>(t.data)[i];
      volatile uint8_t sink = acc;
      (void)sink;
    }
  });
  return 0;
}
