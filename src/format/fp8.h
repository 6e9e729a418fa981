// Block-scaled FP8 weights, as DeepSeek-V3 / R1, Kimi K2 and MiniMax-M2 ship them: a
// projection `<name>` [rows, cols] stored as F8_E4M3 (or F8_E5M2) beside a float tensor
// `<name>_scale_inv` [ceil(rows / block_rows), ceil(cols / block_cols)], one scale a block of
// config.json's quantization_config.weight_block_size (edge blocks partial), quant_method
// "fp8". The value of element (r, c) is f32(q[r, c]) * scale[r / block_rows, c / block_cols],
// multiplied in f32 (one rounding: what torch's `q.float() * scale` gives).
//
// Checkpoint (format/checkpoint.h) pairs the tensors and hands the weights out dequantized;
// these are its pieces, and the converter's row reader's (format/checkpoint_reader.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace sluice {

// quantization_config of an FP8 checkpoint. block_rows / block_cols of 0: one scale for the
// whole matrix (weight_block_size null: a per-tensor scale of shape [] or [1]).
struct Fp8Config {
  int64_t block_rows = 128, block_cols = 128;
};

// The FP8 quantization of a config.json (its quantization_config, or text_config's): nullopt
// when it has none; Error(unsupported) naming `where` for a quant_method other than "fp8" or
// static activation scales, Error(corrupt) for a malformed weight_block_size. A missing
// weight_block_size means [128, 128] (transformers' default).
std::optional<Fp8Config> fp8_config_from_json(const nlohmann::json& config, const std::string& where);

// The scale tensor of an FP8 weight: name + "_scale_inv" ("...proj.weight_scale_inv").
std::string fp8_scale_name(const std::string& weight);

// The scale matrix's shape for a weight [rows, cols]: [ceil(rows / block_rows),
// ceil(cols / block_cols)] ([1, 1] for a per-tensor scale).
int64_t fp8_scale_rows(const Fp8Config& c, int64_t rows);
int64_t fp8_scale_cols(const Fp8Config& c, int64_t cols);

// out[i * cols + j] = value of element (r0 + i, j), i < n: `q` holds the n rows' codes
// (format f8_e4m3 or f8_e5m2), `scales` the scale matrix's rows from block row
// r0 / block_rows on (as many as rows [r0, r0 + n) touch), each scale_cols floats.
// Error(corrupt) naming `where` for a scale that is NaN or infinite.
void fp8_dequantize_rows(DType format, const uint8_t* q, int64_t r0, int64_t n, int64_t rows, int64_t cols,
                         const float* scales, const Fp8Config& c, float* out, const std::string& where);

}  // namespace sluice
