// WeightLoader: name lookup, shape and dtype checks, and the all-consumed assertion.
#include "models/weight_loader.h"

#include "core/log.h"
#include "format/pack.h"

namespace sluice {

WeightLoader::WeightLoader(WeightSource& source, Backend& backend, std::string family, std::string prefix)
    : source_(source), backend_(backend), family_(std::move(family)), prefix_(std::move(prefix)) {}

bool WeightLoader::has(const std::string& name) const { return source_.has(prefix_ + name); }

Tensor WeightLoader::check_host(const std::string& full_name, Tensor t, std::initializer_list<int64_t> shape,
                                bool quantized_ok) {
  Tensor want(DType::f32, shape, nullptr);
  bool same = t.ndim == want.ndim;
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == want.shape[i];
  SLUICE_CHECK(same, Status::corrupt, family_, ": tensor ", full_name, " has shape ", t.shape_str(),
               ", expected ", want.shape_str(), " from config.json");
  if (quantized_ok && is_dense_quant_dtype(t.dtype)) {
    SLUICE_CHECK(t.ndim == 2 && t.scales, Status::corrupt, family_, ": tensor ", full_name, " is ", dtype_name(t.dtype),
                 " without scales");
  } else {
    SLUICE_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16, Status::unsupported,
                 family_, ": tensor ", full_name, " has dtype ", dtype_name(t.dtype), "; ",
                 dtype_is_quantized(t.dtype) ? "this weight is not a matrix the family may read quantized (norms, "
                                               "biases and small vectors stay float): "
                                             : "",
                 "weights must be f32, bf16 or f16");
  }
  n_params_ += t.numel();
  return t;
}

Tensor WeightLoader::check(const std::string& full_name, Tensor t, std::initializer_list<int64_t> shape) {
  return backend_.upload(check_host(full_name, std::move(t), shape));
}

void WeightLoader::require(const std::string& full, std::initializer_list<int64_t> shape, WeightHint hint) {
  if (!source_.has(full)) source_.declare(full, std::span<const int64_t>(shape.begin(), shape.size()), hint);
  SLUICE_CHECK(source_.has(full), Status::not_found, family_, ": checkpoint lacks tensor ", full);
}

Tensor WeightLoader::take_host(const std::string& name, std::initializer_list<int64_t> shape, WeightHint hint) {
  const std::string full = prefix_ + name;
  require(full, shape, hint);
  return check_host(full, source_.get(full), shape);
}

Tensor WeightLoader::take_host_raw(const std::string& name, DType dtype, std::initializer_list<int64_t> shape) {
  const std::string full = prefix_ + name;
  require(full, shape, WeightHint::none);
  Tensor t = source_.get(full);
  Tensor want(DType::f32, shape, nullptr);
  bool same = t.ndim == want.ndim;
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == want.shape[i];
  SLUICE_CHECK(same && t.dtype == dtype, Status::corrupt, family_, ": tensor ", full, " is ", dtype_name(t.dtype), " ",
               t.shape_str(), ", expected ", dtype_name(dtype), " ", want.shape_str(), " from config.json");
  return t;
}

Tensor WeightLoader::take(const std::string& name, std::initializer_list<int64_t> shape) {
  const std::string full = prefix_ + name;
  require(full, shape, WeightHint::none);
  return check(full, source_.get(full), shape);
}

Tensor WeightLoader::take_matrix(const std::string& name, std::initializer_list<int64_t> shape) {
  const std::string full = prefix_ + name;
  require(full, shape, WeightHint::none);
  source_.note_matrix(full);
  return backend_.upload(check_host(full, source_.get(full), shape, /*quantized_ok=*/true));
}

std::optional<Tensor> WeightLoader::take_optional(const std::string& name, std::initializer_list<int64_t> shape) {
  if (!has(name)) return std::nullopt;
  return take(name, shape);
}

void WeightLoader::skip_matching(const std::string& name_prefix) {
  int skipped = 0;
  for (const auto& n : source_.names()) {
    if (n.rfind(name_prefix, 0) == 0) {
      source_.consume(n);
      ++skipped;
    }
  }
  if (skipped) LOG_INFO(family_, ": skipped ", skipped, " tensors under ", name_prefix);
}

void WeightLoader::finish() {
  auto left = source_.unconsumed();
  if (left.empty()) return;
  std::string list;
  for (size_t i = 0; i < left.size() && i < 5; ++i) list += (i ? ", " : "") + left[i];
  if (left.size() > 5) list += str(", ... (", left.size(), " in all)");
  fail(Status::corrupt, family_, ": checkpoint holds tensors this family does not use: ", list);
}

}  // namespace sluice
