// dtype names, sizes, the IEEE half-precision conversions and row conversions.
#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "core/error.h"

namespace sluice {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::i8: return "i8";
    case DType::q8: return "q8";
    case DType::q4: return "q4";
    case DType::q2: return "q2";
    case DType::mxfp4: return "mxfp4";
    case DType::f8_e4m3: return "f8_e4m3";
    case DType::f8_e5m2: return "f8_e5m2";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "f32") return DType::f32;
  if (lower == "f16") return DType::f16;
  if (lower == "bf16") return DType::bf16;
  if (lower == "i32") return DType::i32;
  if (lower == "i64") return DType::i64;
  if (lower == "u8") return DType::u8;
  if (lower == "i8") return DType::i8;
  if (lower == "q8") return DType::q8;
  if (lower == "q4") return DType::q4;
  if (lower == "q2") return DType::q2;
  if (lower == "mxfp4") return DType::mxfp4;
  return std::nullopt;
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::u8: case DType::i8: case DType::f8_e4m3: case DType::f8_e5m2: return 1;
    case DType::q8: case DType::q4: case DType::q2: case DType::mxfp4: return 0;
  }
  return 0;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp - 150); one f16 subnormal step is 2^-24: shift by 126 - exp,
    // rounding to nearest even (a carry into bit 10 correctly gives the smallest normal).
    uint32_t s = 126 - exp;
    uint32_t result = mant >> s;
    uint32_t rem = mant & ((1u << s) - 1);
    uint32_t halfway = 1u << (s - 1);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round mantissa to 10 bits, nearest even
  uint32_t exp = (rounded >> 23) - 127 + 15;
  if (exp >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (exp << 10) | ((rounded >> 13) & 0x3ffu));
}

float f8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  uint32_t bits;
  if (exp == 0xf && mant == 0x7) {
    bits = sign | 0x7fc00000u;  // NaN (the format has no infinity)
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant / 8 * 2^-6 = mant * 2^-9, normalized
      int e = 0;
      uint32_t m = mant;
      while ((m & 0x8u) == 0) {
        m <<= 1;
        ++e;
      }
      bits = sign | (static_cast<uint32_t>(127 - 6 - e) << 23) | ((m & 0x7u) << 20);
    }
  } else {
    bits = sign | ((exp + 127 - 7) << 23) | (mant << 20);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void dtype_row_to_f32(const void* src, DType from, int64_t count, float* dst) {
  const auto* h = static_cast<const uint16_t*>(src);
  const auto* b = static_cast<const uint8_t*>(src);
  switch (from) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(count) * 4); return;
    case DType::bf16: for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(h[i]); return;
    case DType::f16: for (int64_t i = 0; i < count; ++i) dst[i] = f16_to_f32(h[i]); return;
    case DType::f8_e4m3: for (int64_t i = 0; i < count; ++i) dst[i] = f8_e4m3_to_f32(b[i]); return;
    case DType::f8_e5m2: for (int64_t i = 0; i < count; ++i) dst[i] = f8_e5m2_to_f32(b[i]); return;
    default: break;
  }
  SLUICE_ASSERT(dtype_is_float(from));
}

void dtype_convert_row(const void* src, DType from, void* dst, DType to, int64_t count) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(count) * dtype_size(from));
    return;
  }
  SLUICE_ASSERT(dtype_is_float(from) && dtype_is_float(to));
  if (to == DType::f32) return dtype_row_to_f32(src, from, count, static_cast<float*>(dst));
  float tmp[256];  // converted in blocks through f32, which holds every bf16 and f16 value
  auto* o = static_cast<uint16_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t i0 = 0; i0 < count; i0 += 256) {
    const int64_t n = std::min<int64_t>(256, count - i0);
    dtype_row_to_f32(in + static_cast<size_t>(i0) * dtype_size(from), from, n, tmp);
    for (int64_t i = 0; i < n; ++i) o[i0 + i] = to == DType::bf16 ? f32_to_bf16(tmp[i]) : f32_to_f16(tmp[i]);
  }
}

}  // namespace sluice
