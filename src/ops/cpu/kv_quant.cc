#include "ops/cpu/kv_quant.h"

#include <array>
#include <cmath>

#include "core/dtype.h"

namespace moefold::cpu {

const float* kv_fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[size_t(i)] = f8e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table.data();
}

uint8_t kv_fp8_store(float x, float scale, bool* saturated) {
  const float y = x / scale;
  if (saturated && std::fabs(y) > kKvFp8Max) *saturated = true;  // false for NaN
  return f32_to_f8e4m3(y);  // RNE, saturating to +-448, NaN -> 0x7f
}

float kv_fp8_load(uint8_t q, float scale) { return kv_fp8_table()[q] * scale; }

}  // namespace moefold::cpu
