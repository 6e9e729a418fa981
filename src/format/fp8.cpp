// Block-scaled FP8 weights: the config, the scale matrix's shape and the dequantization.
#include "format/fp8.h"

#include <cmath>

#include "core/error.h"

namespace sluice {

namespace {

constexpr int64_t kBlockMax = int64_t{1} << 20;  // far beyond any published block (128); bounds the arithmetic

// quantization_config at the top of config.json, else under text_config (a multimodal
// checkpoint's text model).
const nlohmann::json* find_quantization_config(const nlohmann::json& config) {
  if (!config.is_object()) return nullptr;
  if (auto it = config.find("quantization_config"); it != config.end() && !it->is_null()) return &*it;
  if (auto tc = config.find("text_config"); tc != config.end() && tc->is_object())
    if (auto it = tc->find("quantization_config"); it != tc->end() && !it->is_null()) return &*it;
  return nullptr;
}

}  // namespace

std::optional<Fp8Config> fp8_config_from_json(const nlohmann::json& config, const std::string& where) {
  const nlohmann::json* q = find_quantization_config(config);
  if (!q) return std::nullopt;
  SLUICE_CHECK(q->is_object(), Status::corrupt, where, ": quantization_config is not a JSON object");
  const auto method = q->find("quant_method");
  const std::string m = method != q->end() && method->is_string() ? method->get<std::string>() : std::string("(none)");
  SLUICE_CHECK(m == "fp8", Status::unsupported, where, ": quantization_config.quant_method '", m,
               "' is not supported for F8 tensors (sluice reads block-scaled \"fp8\" checkpoints)");
  if (auto a = q->find("activation_scheme"); a != q->end() && !a->is_null())
    SLUICE_CHECK(a->is_string() && a->get<std::string>() == "dynamic", Status::unsupported, where,
                 ": quantization_config.activation_scheme ", a->dump(),
                 " is not supported (static activation scales; sluice reads \"dynamic\" fp8 checkpoints)");
  Fp8Config c;
  const auto b = q->find("weight_block_size");
  if (b == q->end() || b->is_null()) {  // one scale a matrix
    c.block_rows = c.block_cols = 0;
    return c;
  }
  auto dim = [&](size_t i) -> int64_t {
    const nlohmann::json& v = (*b)[i];
    SLUICE_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= kBlockMax, Status::corrupt, where,
                 ": quantization_config.weight_block_size ", b->dump(), " is not two positive block sizes");
    return v.get<int64_t>();
  };
  SLUICE_CHECK(b->is_array() && b->size() == 2, Status::corrupt, where, ": quantization_config.weight_block_size ",
               b->dump(), " is not [rows, cols]");
  c.block_rows = dim(0);
  c.block_cols = dim(1);
  return c;
}

std::string fp8_scale_name(const std::string& weight) { return weight + "_scale_inv"; }

int64_t fp8_scale_rows(const Fp8Config& c, int64_t rows) { return c.block_rows ? (rows + c.block_rows - 1) / c.block_rows : 1; }

int64_t fp8_scale_cols(const Fp8Config& c, int64_t cols) { return c.block_cols ? (cols + c.block_cols - 1) / c.block_cols : 1; }

void fp8_dequantize_rows(DType format, const uint8_t* q, int64_t r0, int64_t n, int64_t rows, int64_t cols,
                         const float* scales, const Fp8Config& c, float* out, const std::string& where) {
  SLUICE_ASSERT(dtype_is_fp8(format) && r0 >= 0 && r0 + n <= rows);
  const int64_t br = c.block_rows ? c.block_rows : rows, bc = c.block_cols ? c.block_cols : cols;
  const int64_t scale_cols = fp8_scale_cols(c, cols), first_block = r0 / br;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = r0 + i;
    const float* s = scales + (r / br - first_block) * scale_cols;
    float* o = out + i * cols;
    dtype_row_to_f32(q + i * cols, format, cols, o);
    for (int64_t j0 = 0, b = 0; j0 < cols; j0 += bc, ++b) {
      const float scale = s[b];
      if (!std::isfinite(scale))
        fail(Status::corrupt, where, ": the scale of block (", r / br, ", ", b, ") is ", scale,
             " (a block scale must be finite)");
      const int64_t j1 = std::min(cols, j0 + bc);
      for (int64_t j = j0; j < j1; ++j) o[j] *= scale;
    }
  }
}

}  // namespace sluice
