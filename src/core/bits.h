// Small integer helpers shared by every layer: rounding up to an alignment, and the
// 16-digit hex form of a 64-bit value that checksums are printed in.
#pragma once

#include <cstdint>
#include <string>

namespace sluice {

// v rounded up to a multiple of a (a > 0).
constexpr uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// "00000000deadbeef": v as 16 lower-case hex digits (checksums in manifests and messages).
inline std::string hex16(uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

}  // namespace sluice
