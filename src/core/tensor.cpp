// Tensor shape arithmetic and views.
#include "core/tensor.h"

#include "core/quant.h"

namespace sluice {

Tensor::Tensor(DType t, std::initializer_list<int64_t> dims, void* ptr, std::shared_ptr<void> owner)
    : dtype(t), data(ptr), storage(std::move(owner)) {
  SLUICE_ASSERT(dims.size() >= 1 && dims.size() <= 4);
  for (int64_t d : dims) shape[ndim++] = d;
}

int64_t Tensor::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Tensor::reshape(std::initializer_list<int64_t> dims) const {
  Tensor t(dtype, dims, data, storage);
  SLUICE_CHECK(t.numel() == numel(), Status::internal, "reshape ", shape_str(), " to ", t.shape_str());
  return t;
}

size_t Tensor::nbytes() const {
  if (dtype_is_quantized(dtype)) return static_cast<size_t>(rows() * quant_row_bytes(dtype, cols()));
  return static_cast<size_t>(numel()) * dtype_size(dtype);
}

size_t Tensor::scale_nbytes() const {
  return dtype_is_quantized(dtype) ? static_cast<size_t>(rows() * quant_scale_row_bytes(dtype, cols())) : 0;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
  SLUICE_CHECK(ndim >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0], Status::internal,
               "slice_rows [", begin, ", ", begin + count, ") of ", shape_str());
  Tensor t = *this;
  t.shape[0] = count;
  // Rows of the innermost matrix per outer row (1 for a 2-D tensor).
  int64_t inner_rows = shape[0] ? rows() / shape[0] : 0;
  if (dtype_is_quantized(dtype)) {
    t.data = static_cast<char*>(data) + static_cast<size_t>(begin * inner_rows * quant_row_bytes(dtype, cols()));
    t.scales = static_cast<char*>(scales) + static_cast<size_t>(begin * inner_rows * quant_scale_row_bytes(dtype, cols()));
  } else {
    int64_t row_elems = shape[0] ? numel() / shape[0] : 0;
    t.data = static_cast<char*>(data) + static_cast<size_t>(begin * row_elems) * dtype_size(dtype);
  }
  return t;
}

}  // namespace sluice
