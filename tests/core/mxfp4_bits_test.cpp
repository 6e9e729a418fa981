// core/mxfp4_bits.h (the CUDA kernels' MXFP4 decoding) against core/quant's dequantizer: every
// code at every scale byte, bit for bit, as the kernels multiply them (code value x scale).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/mxfp4_bits.h"
#include "core/quant.h"

using namespace sluice;

namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace

TEST(Mxfp4Bits, EveryCodeAtEveryScaleIsTheDequantizers) {
  // One group of 32 a scale byte: element j holds code j % 16.
  std::vector<uint8_t> vals(16);
  for (int j = 0; j < 16; ++j) vals[static_cast<size_t>(j)] = static_cast<uint8_t>((2 * j % 16) | ((2 * j + 1) % 16) << 4);
  std::vector<float> want(32);
  for (int s = 0; s < 256; ++s) {
    const uint8_t scale = static_cast<uint8_t>(s);
    dequantize_row(DType::mxfp4, vals.data(), &scale, 32, want.data());
    for (int j = 0; j < 32; ++j) {
      const float got = e2m1_value(static_cast<uint32_t>(j % 16)) * e8m0_value(static_cast<uint32_t>(s));
      if (s == 255) {
        EXPECT_TRUE(std::isnan(got)) << "code " << j % 16;
        EXPECT_TRUE(std::isnan(want[static_cast<size_t>(j)]));
      } else {
        EXPECT_EQ(bits(got), bits(want[static_cast<size_t>(j)])) << "code " << j % 16 << " scale byte " << s << ": " << got
                                                                  << " vs " << want[static_cast<size_t>(j)];
      }
    }
  }
  // The table itself, signs and -0 included.
  const float table[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (uint32_t c = 0; c < 16; ++c) EXPECT_EQ(bits(e2m1_value(c)), bits(table[c])) << c;
  EXPECT_EQ(e8m0_value(127), 1.0f);
  EXPECT_EQ(e8m0_value(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_value(254), std::ldexp(1.0f, 127));
}
