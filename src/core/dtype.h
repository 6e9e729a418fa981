// Element types of tensors and the scalar conversions between them. Conversions are exact
// where the target can hold the value and round to nearest even otherwise (as torch does).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace sluice {

// f32 .. i8 are plain element types. q8, q4, q2 and mxfp4 are the quantized weight kinds of
// the pack format (bit layouts in core/quant.h and docs/pack-format.md): a quantized Tensor's
// `data` holds the packed values and its `scales` the per-row / per-group scales.
// f8_e4m3 and f8_e5m2 are the stored dtypes of FP8 checkpoints (safetensors F8_E4M3 /
// F8_E5M2, one byte a value): only the checkpoint readers see them (format/fp8.h dequantizes
// them with their block scales); no Tensor that a model or a pack holds has them.
enum class DType : uint8_t { f32, f16, bf16, i32, i64, u8, i8, q8, q4, q2, mxfp4, f8_e4m3, f8_e5m2 };

inline bool dtype_is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }
inline bool dtype_is_quantized(DType t) {
  return t == DType::q8 || t == DType::q4 || t == DType::q2 || t == DType::mxfp4;
}
inline bool dtype_is_fp8(DType t) { return t == DType::f8_e4m3 || t == DType::f8_e5m2; }

std::string_view dtype_name(DType t);          // "f32", "bf16", ...
std::optional<DType> dtype_from_name(std::string_view name);  // accepts "F32" and "f32"
size_t dtype_size(DType t);                    // bytes per element (0 for quantized kinds)

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// The FP8 formats as torch defines them, to f32 (exact: f32 holds every value). e4m3 is
// float8_e4m3fn: bias 7, 3 mantissa bits, no infinities, S.1111.111 is NaN, largest 448.
// e5m2 is float8_e5m2: IEEE-style (bias 15, 2 mantissa bits, infinities), the top byte of
// an f16.
float f8_e4m3_to_f32(uint8_t v);
inline float f8_e5m2_to_f32(uint8_t v) { return f16_to_f32(static_cast<uint16_t>(v << 8)); }

// dst[0, count) = the `count` elements at src (f32, bf16, f16, or an FP8 format without its
// scale) as f32 (exact).
void dtype_row_to_f32(const void* src, DType from, int64_t count, float* dst);
// dst[0, count) in dtype `to` = the `count` elements at src in dtype `from` (both f32, bf16 or
// f16; through f32, rounding to nearest even), or a copy when the dtypes are equal (any
// plain dtype).
void dtype_convert_row(const void* src, DType from, void* dst, DType to, int64_t count);

}  // namespace sluice
