// Load-time weight transforms of the hybrid families.
#include "models/hybrid_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace sluice {

Tensor host_tensor(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t(dtype, shape, nullptr);
  const size_t bytes = std::max<size_t>(t.nbytes(), 1);
  void* p = std::malloc(bytes);
  SLUICE_CHECK(p != nullptr, Status::out_of_memory, "host_tensor: ", bytes, " bytes for ", t.shape_str());
  t.data = p;
  t.storage = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

std::vector<float> host_values_f32(const Tensor& host) {
  const int64_t n = host.numel();
  std::vector<float> out(static_cast<size_t>(n));
  switch (host.dtype) {
    case DType::f32: std::memcpy(out.data(), host.data, static_cast<size_t>(n) * sizeof(float)); break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(host.ptr<uint16_t>()[i]);
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(host.ptr<uint16_t>()[i]);
      break;
    default: fail(Status::internal, "host_values_f32: dtype ", dtype_name(host.dtype), " is not a float weight");
  }
  return out;
}

namespace {

Tensor upload_f32(Backend& be, const std::vector<float>& values, std::initializer_list<int64_t> shape) {
  Tensor t = host_tensor(DType::f32, shape);
  std::memcpy(t.data, values.data(), values.size() * sizeof(float));
  return be.upload(t);
}

}  // namespace

Tensor take_f32(WeightLoader& wl, const std::string& name, std::initializer_list<int64_t> shape) {
  return upload_f32(wl.backend(), host_values_f32(wl.take_host(name, shape)), shape);
}

Tensor take_norm_plus_one(WeightLoader& wl, const std::string& name, std::initializer_list<int64_t> shape) {
  std::vector<float> w = host_values_f32(wl.take_host(name, shape, WeightHint::zero_centered_norm));
  for (float& x : w) x = 1.0f + x;  // f32, as the reference's 1.0 + weight.float()
  return upload_f32(wl.backend(), w, shape);
}

Tensor upload_rows(Backend& be, const Tensor& src, std::span<const int64_t> rows) {
  SLUICE_ASSERT(src.ndim == 2 && !dtype_is_quantized(src.dtype));
  const size_t row_bytes = static_cast<size_t>(src.cols()) * dtype_size(src.dtype);
  Tensor t = host_tensor(src.dtype, {static_cast<int64_t>(rows.size()), src.cols()});
  for (size_t i = 0; i < rows.size(); ++i) {
    SLUICE_ASSERT(rows[i] >= 0 && rows[i] < src.shape[0]);
    std::memcpy(static_cast<char*>(t.data) + i * row_bytes,
                static_cast<const char*>(src.data) + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  }
  return be.upload(t);
}

}  // namespace sluice
