// Element-type conversions: exhaustive round trips and rounding against fp64 definitions.
#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

using namespace moefold;

TEST(DType, Fp8E4m3EveryCodeRoundTrips) {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    float f = f8e4m3_to_f32(uint8_t(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    ++finite;
    EXPECT_EQ(f32_to_f8e4m3(f), uint8_t(c)) << "code " << c << " value " << f;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_f8e4m3(1e6f), 0x7e);    // saturates
  EXPECT_EQ(f32_to_f8e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), f32_to_f8e4m3(1.0f));  // tie to even (1.0 = mantissa 000)
  EXPECT_EQ(f8e4m3_to_f32(f32_to_f8e4m3(1.1875f)), 1.25f);  // tie between 1.125 (odd) and 1.25 (even)
}

TEST(DType, Fp16EveryCodeRoundTrips) {
  for (int c = 0; c < 65536; ++c) {
    float f = f16_to_f32(uint16_t(c));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), uint16_t(c)) << c;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(70000.0f), 0x7c00);
}

TEST(DType, Bf16RoundsToNearestEven) {
  for (int c = 0; c < 65536; ++c) {
    float f = bf16_to_f32(uint16_t(c));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), uint16_t(c));
  }
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}
