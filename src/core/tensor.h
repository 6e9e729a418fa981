// Tensor: a row-major, contiguous block of elements in some backend's memory (host memory
// for the CPU backend, device memory for CUDA). Shape is outermost first. `storage` keeps
// the memory alive (an allocation or a file mapping); views share it.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace sluice {

struct Tensor {
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{0, 0, 0, 0};
  int ndim = 0;
  void* data = nullptr;
  void* scales = nullptr;         // quantized dtypes only (core/quant.h): per-row/group scales
  std::shared_ptr<void> storage;  // owner of the memory `data` points into (may be null for borrowed)

  Tensor() = default;
  Tensor(DType t, std::initializer_list<int64_t> dims, void* ptr, std::shared_ptr<void> owner = {});

  bool empty() const { return data == nullptr; }
  int64_t numel() const;
  int64_t cols() const { return ndim ? shape[ndim - 1] : 0; }  // innermost dimension
  int64_t rows() const { return cols() ? numel() / cols() : 0; }  // product of the others
  size_t nbytes() const;          // bytes of `data` (packed values for quantized dtypes)
  size_t scale_nbytes() const;    // bytes of `scales` (0 unless quantized)
  std::string shape_str() const;  // "[4, 64]"

  // Same memory, new shape with the same number of elements.
  Tensor reshape(std::initializer_list<int64_t> dims) const;
  // Rows [begin, begin + count) of the outermost dimension.
  Tensor slice_rows(int64_t begin, int64_t count) const;

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

}  // namespace sluice
