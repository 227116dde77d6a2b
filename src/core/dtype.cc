#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace moefold {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::F8_E4M3: case DType::U8: case DType::F8_E8M0: case DType::I8: return 1;
    case DType::I64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::F8_E8M0: return "F8_E8M0";
    case DType::I8: return "I8";
  }
  return "?";
}

DType dtype_from_safetensors(std::string_view s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  if (s == "F8_E8M0") return DType::F8_E8M0;
  if (s == "I8") return DType::I8;
  fail("unsupported safetensors dtype '{}' (supported: F32, F16, BF16, F8_E4M3, F8_E8M0, I32, I64, U8, I8)", s);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);
    return sign ? -f : f;
  }
  uint32_t u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) {  // subnormal: quantise to multiples of 2^-24
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  uint32_t v = u & 0x7fffffffu;
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | uint16_t((v >> 13) - (112u << 10));
}

float f8e8m0_to_f32(uint8_t v) { return v == 0xff ? NAN : std::ldexp(1.0f, int(v) - 127); }

float f8e4m3_to_f32(uint8_t v) {
  int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 15 && man == 7) return NAN;
  float f = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + man / 8.0f, exp - 7);
  return sign ? -f : f;
}

uint8_t f32_to_f8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  // Find the nearest representable value by exhaustive rounding over the 126 finite magnitudes.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + 7;  // biased exponent of a normal number
  float step = exp <= 0 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, e - 1 - 3);
  float q = std::nearbyint(a / step) * step;  // ties to even in units of `step`
  if (q >= 448.0f) return sign | 0x7e;
  // Re-encode q.
  if (q < std::ldexp(1.0f, -6)) return sign | uint8_t(std::lround(q / std::ldexp(1.0f, -9)));
  int qe;
  float qm = std::frexp(q, &qe);
  int be = qe - 1 + 7;
  int m = int(std::lround((qm * 2.0f - 1.0f) * 8.0f));
  return sign | uint8_t(be << 3) | uint8_t(m);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      auto s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F8_E4M3: {
      auto s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(s[i]);
      return;
    }
    case DType::F8_E8M0: {
      auto s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e8m0_to_f32(s[i]);
      return;
    }
    default: fail("cannot convert dtype {} to F32", dtype_name(t));
  }
}

}  // namespace moefold
