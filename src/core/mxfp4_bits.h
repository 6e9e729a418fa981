// The values of MXFP4's two codes (core/quant.h), built from their bits, exactly: for the
// CUDA kernels (no table: a per-lane table index would go to local memory) and the host
// tests that check them against core/quant's dequantizer.
//   e2m1 code (4 bits): bit 3 sign, bits 2-1 exponent e, bit 0 mantissa m; e >= 1 is
//       (1 + m/2) 2^(e - 1), e == 0 is m/2: 0, 0.5, 1, 1.5, 2, 3, 4, 6 with the sign (-0 kept)
//   e8m0 scale byte s: 2^(s - 127); 255 is NaN
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace sluice {

SLUICE_HOST_DEVICE inline float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}

SLUICE_HOST_DEVICE inline float e2m1_value(uint32_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  // e >= 1: an f32 exponent field of e - 1 + 127 and m as the top mantissa bit; e == 0: 0.5
  // (exponent field 126) or 0.
  const uint32_t mag = e != 0 ? ((e + 126u) << 23) | (m << 22) : (m != 0 ? 126u << 23 : 0u);
  return f32_from_bits(((code & 8u) << 28) | mag);
}

SLUICE_HOST_DEVICE inline float e8m0_value(uint32_t s) {
  // s >= 1 is a normal f32's exponent field; s == 0 is 2^-127, a subnormal (1 << 22).
  return s == 255u ? f32_from_bits(0x7fc00000u) : f32_from_bits(s != 0 ? s << 23 : 1u << 22);
}

}  // namespace sluice
