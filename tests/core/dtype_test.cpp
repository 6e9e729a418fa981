// dtype conversions: exact where representable, round to nearest even otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dtype.h"

using namespace sluice;

TEST(DType, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65280.0f, std::ldexp(1.0f, -100)}) EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), f) << f;
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(DType, F16Rounding) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)), 1.0f);          // tie -> even
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_EQ(f16_to_f32(f32_to_f16(70000.0f)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -25))), 0.0f);        // tie at half the smallest subnormal -> 0
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.5f, -25))), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -14) * 0.99999f)), std::ldexp(1.0f, -14));
}
