// Helpers shared by the CPU op files: entry validation and dispatch on the weight dtype.
#pragma once

#include <cstdint>

#include "backends/cpu/simd.h"
#include "core/tensor.h"

namespace sluice::cpu {

inline bool is_weight_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Product of all but the innermost dimension (unlike Tensor::rows, also right when cols is 0).
inline int64_t lead_rows(const Tensor& t) {
  int64_t n = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) n *= t.shape[i];
  return t.ndim ? n : 0;
}

// True when the byte ranges of a and b overlap.
inline bool overlaps(const Tensor& a, const Tensor& b) {
  auto pa = static_cast<const char*>(a.data), pb = static_cast<const char*>(b.data);
  return a.nbytes() && b.nbytes() && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// Calls fn.template operator()<T>() with T the (f32, bf16 or f16) dtype of t.
template <typename Fn>
inline void dispatch_weight(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: fn.template operator()<DType::f32>(); return;
    case DType::bf16: fn.template operator()<DType::bf16>(); return;
    case DType::f16: fn.template operator()<DType::f16>(); return;
    default: break;
  }
  SLUICE_ASSERT(is_weight_dtype(t));
}

}  // namespace sluice::cpu
