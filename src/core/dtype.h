// Element types of checkpoint tensors and their exact conversions to and from fp32.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace moefold {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, I32, I64, U8, F8_E8M0, I8 };

/// Bytes per element.
size_t dtype_size(DType t);
/// Canonical name as safetensors spells it ("F32", "BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
/// Parses a safetensors dtype string; throws Error for an unsupported one.
DType dtype_from_safetensors(std::string_view s);

/// bf16 -> fp32: exact (bf16 is the high half of an fp32).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// fp32 -> bf16 with round-to-nearest-even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
/// IEEE half -> fp32 (exact, subnormals included).
float f16_to_f32(uint16_t h);
/// fp32 -> IEEE half, round-to-nearest-even, overflow to inf.
uint16_t f32_to_f16(float f);
/// float8 e4m3fn (OCP FP8, no infinities, 0x7f/0xff = NaN, max 448) -> fp32, exact.
float f8e4m3_to_f32(uint8_t v);
/// fp32 -> float8 e4m3fn, round-to-nearest-even, saturating to +-448; NaN -> NaN.
uint8_t f32_to_f8e4m3(float f);

/// float8 e8m0fnu (a bare exponent, the scales of MX / DeepSeek-V4 FP8 and FP4 weights) -> fp32: 2^(v - 127);
/// 0xff is NaN.
float f8e8m0_to_f32(uint8_t v);

/// Converts n elements of type `t` at `src` into fp32 at `dst`.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace moefold
