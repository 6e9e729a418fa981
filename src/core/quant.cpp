// Quantizers and dequantizers of the pack's expert kinds (layouts and rules in quant.h).
// Plain scalar code that the compiler vectorizes: deterministic (round half to even through
// rint in the default rounding mode, which compiles to one roundps; explicit fma where the
// layout says fma), and fast enough that convert is bound by IO, not by this. Rows are
// checked finite first, so the clamps can use plain min/max.
#include "core/quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace sluice {
namespace {

inline bool finite(float x) { return std::fabs(x) <= FLT_MAX; }  // false for NaN and +-inf

inline void store_f16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }  // little-endian host
inline uint16_t load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

bool quantize_q8(const float* x, int64_t cols, uint8_t* data, uint8_t* scales) {
  float amax = 0;
  bool ok = true;
  for (int64_t i = 0; i < cols; ++i) {
    ok &= finite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (!ok) return false;
  const float scale = amax / 127.0f;
  std::memcpy(scales, &scale, 4);
  auto* q = reinterpret_cast<int8_t*>(data);
  if (scale == 0) {
    std::memset(q, 0, static_cast<size_t>(cols));
    return true;
  }
  for (int64_t i = 0; i < cols; ++i) q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, std::rint(x[i] / scale))));
  return true;
}

bool quantize_q4(const float* x, int64_t cols, uint8_t* data, uint8_t* scales) {
  const int64_t groups = quant_groups(DType::q4, cols);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kQ4Group, n = std::min<int64_t>(kQ4Group, cols - begin);
    const float* xg = x + begin;
    float m = 0, amax = 0;  // the value of largest magnitude (first on ties)
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      ok &= finite(xg[i]);
      if (std::fabs(xg[i]) > amax) {
        amax = std::fabs(xg[i]);
        m = xg[i];
      }
    }
    if (!ok) return false;
    const uint16_t dh = f32_to_f16(m / -8.0f);
    const float d = f16_to_f32(dh);
    if (!finite(d)) return false;
    store_f16(scales + 2 * g, dh);
    uint8_t q[kQ4Group] = {};  // the padding of a partial group stays 0
    if (d == 0) {
      std::memset(q, 8, static_cast<size_t>(n));
    } else {
      for (int64_t i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(std::min(15.0f, std::max(0.0f, std::rint(xg[i] / d) + 8.0f)));
    }
    uint8_t* out = data + g * (kQ4Group / 2);
    for (int64_t j = 0; j < kQ4Group / 2; ++j) out[j] = static_cast<uint8_t>(q[2 * j] | (q[2 * j + 1] << 4));
  }
  return true;
}

bool quantize_q2(const float* x, int64_t cols, uint8_t* data, uint8_t* scales) {
  const int64_t groups = quant_groups(DType::q2, cols);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kQ2Group, n = std::min<int64_t>(kQ2Group, cols - begin);
    const float* xg = x + begin;
    float lo = xg[0], hi = xg[0];
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      ok &= finite(xg[i]);
      lo = std::min(lo, xg[i]);
      hi = std::max(hi, xg[i]);
    }
    if (!ok) return false;
    const uint16_t sh = f32_to_f16((hi - lo) / 3.0f), mh = f32_to_f16(lo);
    const float scale = f16_to_f32(sh), mn = f16_to_f32(mh);
    if (!finite(scale) || !finite(mn)) return false;
    store_f16(scales + 4 * g, sh);
    store_f16(scales + 4 * g + 2, mh);
    uint8_t q[kQ2Group] = {};
    if (scale > 0)
      for (int64_t i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(std::min(3.0f, std::max(0.0f, std::rint((xg[i] - mn) / scale))));
    uint8_t* out = data + g * (kQ2Group / 4);
    for (int64_t j = 0; j < kQ2Group / 4; ++j)
      out[j] = static_cast<uint8_t>(q[4 * j] | (q[4 * j + 1] << 2) | (q[4 * j + 2] << 4) | (q[4 * j + 3] << 6));
  }
  return true;
}

// The e2m1 values of the 16 codes (sign << 3 | magnitude index).
constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The e2m1 code nearest to v (ties to the even magnitude index, beyond 6 saturated).
inline uint8_t e2m1_code(float v) {
  constexpr float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};  // between neighbours
  const float a = std::fabs(v);
  uint8_t idx = 0;
  for (int i = 0; i < 7; ++i)
    if (a > mid[i] || (a == mid[i] && (i + 1) % 2 == 0)) idx = static_cast<uint8_t>(i + 1);
  return static_cast<uint8_t>((std::signbit(v) ? 8 : 0) | idx);
}

bool quantize_mxfp4(const float* x, int64_t cols, uint8_t* data, uint8_t* scales) {
  const int64_t groups = quant_groups(DType::mxfp4, cols);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kMxfp4Group, n = std::min<int64_t>(kMxfp4Group, cols - begin);
    float amax = 0;
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      ok &= finite(x[begin + i]);
      amax = std::max(amax, std::fabs(x[begin + i]));
    }
    if (!ok) return false;
    int exp = 0;  // amax = m 2^exp, m in [0.5, 1): floor(log2(amax)) = exp - 1
    if (amax > 0) std::frexp(amax, &exp);
    const int s = amax > 0 ? std::clamp(exp - 1 - 2 + 127, 0, 254) : 0;
    scales[g] = static_cast<uint8_t>(s);
    uint8_t codes[kMxfp4Group] = {};
    for (int64_t i = 0; i < n; ++i) codes[i] = e2m1_code(std::ldexp(x[begin + i], 127 - s));
    uint8_t* out = data + g * (kMxfp4Group / 2);
    for (int64_t j = 0; j < kMxfp4Group / 2; ++j) out[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
  }
  return true;
}

}  // namespace

bool quantize_row(DType t, const float* src, int64_t cols, uint8_t* data, uint8_t* scales) {
  switch (t) {
    case DType::q8: return quantize_q8(src, cols, data, scales);
    case DType::q4: return quantize_q4(src, cols, data, scales);
    case DType::q2: return quantize_q2(src, cols, data, scales);
    case DType::mxfp4: return quantize_mxfp4(src, cols, data, scales);
    default: break;
  }
  fail(Status::internal, "quantize_row: ", dtype_name(t), " is not a quantized dtype");
}

void dequantize_row(DType t, const uint8_t* data, const uint8_t* scales, int64_t cols, float* dst) {
  switch (t) {
    case DType::q8: {
      float scale;
      std::memcpy(&scale, scales, 4);
      const auto* q = reinterpret_cast<const int8_t*>(data);
      for (int64_t i = 0; i < cols; ++i) dst[i] = static_cast<float>(q[i]) * scale;
      return;
    }
    case DType::q4: {
      const int64_t groups = quant_groups(t, cols);
      for (int64_t g = 0; g < groups; ++g) {
        const float d = f16_to_f32(load_f16(scales + 2 * g));
        const uint8_t* in = data + g * (kQ4Group / 2);
        float* out = dst + g * kQ4Group;
        if ((g + 1) * kQ4Group <= cols) {
          for (int64_t j = 0; j < kQ4Group / 2; ++j) {
            out[2 * j] = static_cast<float>(static_cast<int>(in[j] & 15) - 8) * d;
            out[2 * j + 1] = static_cast<float>(static_cast<int>(in[j] >> 4) - 8) * d;
          }
        } else {
          for (int64_t i = 0; g * kQ4Group + i < cols; ++i)
            out[i] = static_cast<float>(static_cast<int>((in[i / 2] >> (4 * (i & 1))) & 15) - 8) * d;
        }
      }
      return;
    }
    case DType::q2: {
      const int64_t groups = quant_groups(t, cols);
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = f16_to_f32(load_f16(scales + 4 * g)), mn = f16_to_f32(load_f16(scales + 4 * g + 2));
        const uint8_t* in = data + g * (kQ2Group / 4);
        float* out = dst + g * kQ2Group;
        const int64_t n = std::min<int64_t>(kQ2Group, cols - g * kQ2Group);
        for (int64_t i = 0; i < n; ++i)
          out[i] = std::fma(static_cast<float>((in[i / 4] >> (2 * (i & 3))) & 3), scale, mn);
      }
      return;
    }
    case DType::mxfp4: {
      const int64_t groups = quant_groups(t, cols);
      for (int64_t g = 0; g < groups; ++g) {
        const int e = static_cast<int>(scales[g]) - 127;
        const uint8_t* in = data + g * (kMxfp4Group / 2);
        float* out = dst + g * kMxfp4Group;
        const int64_t n = std::min<int64_t>(kMxfp4Group, cols - g * kMxfp4Group);
        for (int64_t i = 0; i < n; ++i) {
          const float v = kE2m1[(in[i / 2] >> (4 * (i & 1))) & 15];
          out[i] = scales[g] == 255 ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(v, e);
        }
      }
      return;
    }
    default: break;
  }
  fail(Status::internal, "dequantize_row: ", dtype_name(t), " is not a quantized dtype");
}

}  // namespace sluice
