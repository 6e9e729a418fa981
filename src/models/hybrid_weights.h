// Weight helpers of the hybrid families: weights transformed once at load rather than at
// every step. Zero-centered RMSNorm weights become f32 (1 + w) (transformers' Qwen3NextRMSNorm
// computes norm(x) * (1 + w.float())), the small per-channel tensors of the DeltaNet and PLE
// (conv taps, A_log, dt_bias) become f32, and fused projections are regrouped by rows.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "models/weight_loader.h"

namespace sluice {

// A host tensor that owns its memory (uninitialized).
Tensor host_tensor(DType dtype, std::initializer_list<int64_t> shape);

// The values of a host f32/bf16/f16 tensor as f32 (exact).
std::vector<float> host_values_f32(const Tensor& host);

// The weight `name` of this shape, converted to f32, uploaded.
Tensor take_f32(WeightLoader& wl, const std::string& name, std::initializer_list<int64_t> shape);

// A zero-centered RMSNorm weight: f32 1 + w, uploaded.
Tensor take_norm_plus_one(WeightLoader& wl, const std::string& name, std::initializer_list<int64_t> shape);

// Rows `rows` of the 2-D host tensor `src` (any dtype), in that order, as a new uploaded
// tensor [rows.size(), src.cols()].
Tensor upload_rows(Backend& be, const Tensor& src, std::span<const int64_t> rows);

}  // namespace sluice
