// WeightLoader: takes a model's tensors out of a checkpoint by name, checks each one's shape
// and dtype against what the family declares, uploads it to the backend, and at the end
// asserts that every tensor in the checkpoint was used (a leftover means the family table
// and the checkpoint disagree, which must not pass silently).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "models/weight_source.h"

namespace sluice {

class WeightLoader {
 public:
  WeightLoader(WeightSource& source, Backend& backend, std::string family, std::string prefix = "");

  // The tensor `prefix + name` with exactly this shape, in a float dtype (f32/bf16/f16).
  Tensor take(const std::string& name, std::initializer_list<int64_t> shape);
  std::optional<Tensor> take_optional(const std::string& name, std::initializer_list<int64_t> shape);
  // A matrix [rows, cols] that the family uses only as a matmul weight (Backend::matmul) or
  // an embedding table (Backend::get_rows): as take(), but a pack may hold it quantized (q8
  // or q4, `convert --dense int8|q4`), and the source hears of it (note_matrix) so that a
  // writer knows which tensors it may quantize.
  Tensor take_matrix(const std::string& name, std::initializer_list<int64_t> shape);
  // The same checks and accounting, but the host view itself, not uploaded: for a weight the
  // family transforms at load (upload the result with backend().upload). `hint`: see
  // WeightHint (only a source that makes weights up reads it).
  Tensor take_host(const std::string& name, std::initializer_list<int64_t> shape, WeightHint hint = WeightHint::none);
  // The host view of a tensor stored in exactly this integer dtype and shape (gpt-oss's MXFP4
  // blocks and scales, u8), not counted as parameters (the caller counts the weights).
  Tensor take_host_raw(const std::string& name, DType dtype, std::initializer_list<int64_t> shape);
  // Whether `prefix + name` exists.
  bool has(const std::string& name) const;
  // Marks tensors deliberately not used (for example a vision tower).
  void skip_matching(const std::string& name_prefix);
  // Throws if a checkpoint tensor was neither taken nor skipped.
  void finish();

  int64_t n_params() const { return n_params_; }
  void count_params(int64_t n) { n_params_ += n; }  // weights not taken through take() (pack experts)
  WeightSource& source() { return source_; }
  Backend& backend() { return backend_; }
  const std::string& family() const { return family_; }

 private:
  Tensor check(const std::string& full_name, Tensor t, std::initializer_list<int64_t> shape);
  void require(const std::string& full_name, std::initializer_list<int64_t> shape, WeightHint hint);
  Tensor check_host(const std::string& full_name, Tensor t, std::initializer_list<int64_t> shape,
                    bool quantized_ok = false);

  WeightSource& source_;
  Backend& backend_;
  std::string family_;
  std::string prefix_;
  int64_t n_params_ = 0;
};

}  // namespace sluice
