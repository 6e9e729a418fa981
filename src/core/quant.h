// Quantized weight layouts (the pack format's expert kinds). All quantize along the input
// dimension (a weight row [cols] is one output feature). Row r's packed values start at
// r * quant_row_bytes(t, cols) in `data`, its scales at r * quant_scale_row_bytes(t, cols)
// in `scales`. A row's last group may be partial: its missing elements are stored as zero.
//
//   q8: int8 values [cols], scale f32 [1] per row:         w = q * scale
//   q4: groups of 32; per group 16 bytes of 4-bit values (byte j: element 2j in the low
//       nibble, 2j+1 in the high nibble) and an f16 scale:   w = (q - 8) * scale
//   q2: groups of 16; per group 4 bytes of 2-bit values (byte j: elements 4j..4j+3 in bits
//       0-1, 2-3, 4-5, 6-7) and two f16 values (scale, min): w = q * scale + min
//   mxfp4: the OCP microscaling FP4 of gpt-oss checkpoints (their *_blocks / *_scales kept
//       bit for bit): groups of 32; per group 16 bytes of 4-bit e2m1 codes (byte j: element
//       2j in the low nibble, 2j+1 in the high one; code = sign << 3 | magnitude index into
//       0, 0.5, 1, 1.5, 2, 3, 4, 6) and one e8m0 byte s: w = e2m1(code) * 2^(s - 127)
//
// The quantizers (quant.cpp) are deterministic: the same f32 row gives the same bytes on
// every machine (round half to even, no dependence on threads or SIMD width).
//   q8: scale = absmax / 127, q = rne(w / scale) in [-127, 127].
//   q4: as llama.cpp's Q4_0: d = m / -8 where m is the group's value of largest magnitude
//       (the first one on ties), rounded to f16; q = clamp(rne(w / d) + 8, 0, 15). All 16
//       levels are used and m itself is exact (q = 0); see docs/quantization.md for why this
//       beats absmax / 7.
//   q2: scale = (max - min) / 3 and min, both rounded to f16; q = clamp(rne((w - min) / scale), 0, 3).
//   mxfp4: as the OCP MX spec: s = floor(log2(amax)) - 2 + 127 (amax 0: s = 0), clamped to
//       [0, 254]; each w / 2^(s - 127) to the nearest e2m1 value (ties to the even code,
//       beyond 6 saturated), -0 kept as its sign bit.
// Dequantization computes exactly w = (q - 8) * scale (q4, exact in f32), q * scale (q8, one
// f32 multiply), fma(q, scale, min) (q2, one fused multiply-add) and ldexp(e2m1, s - 127)
// (mxfp4, exact; s = 255, NaN in the spec, gives NaN), so any backend that dequantizes the
// same way gets the same f32 weights bit for bit.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace sluice {

constexpr int64_t kQ4Group = 32;
constexpr int64_t kQ2Group = 16;
constexpr int64_t kMxfp4Group = 32;

inline int64_t quant_groups(DType t, int64_t cols) {
  if (t == DType::q4) return (cols + kQ4Group - 1) / kQ4Group;
  if (t == DType::mxfp4) return (cols + kMxfp4Group - 1) / kMxfp4Group;
  if (t == DType::q2) return (cols + kQ2Group - 1) / kQ2Group;
  return 1;  // q8: one scale per row
}

// Bytes of packed values per row.
inline int64_t quant_row_bytes(DType t, int64_t cols) {
  switch (t) {
    case DType::q8: return cols;
    case DType::q4: return quant_groups(t, cols) * (kQ4Group / 2);
    case DType::q2: return quant_groups(t, cols) * (kQ2Group / 4);
    case DType::mxfp4: return quant_groups(t, cols) * (kMxfp4Group / 2);
    default: return cols * static_cast<int64_t>(dtype_size(t));
  }
}

// Bytes of scales per row.
inline int64_t quant_scale_row_bytes(DType t, int64_t cols) {
  switch (t) {
    case DType::q8: return 4;
    case DType::q4: return quant_groups(t, cols) * 2;
    case DType::q2: return quant_groups(t, cols) * 4;
    case DType::mxfp4: return quant_groups(t, cols);
    default: return 0;
  }
}

// Quantizes one row of `cols` f32 weights into `data` (quant_row_bytes) and `scales`
// (quant_scale_row_bytes); t is q8, q4, q2 or mxfp4. Returns false (and writes unspecified bytes)
// when the row holds a NaN or an infinity, or a scale would overflow f16: the caller names
// the tensor in its error.
bool quantize_row(DType t, const float* src, int64_t cols, uint8_t* data, uint8_t* scales);

// The f32 weights of one quantized row (cols values; the zero padding of a partial last
// group is not written).
void dequantize_row(DType t, const uint8_t* data, const uint8_t* scales, int64_t cols, float* dst);

}  // namespace sluice
