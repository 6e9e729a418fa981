// ExpertWeights: the three projections of one gated expert (routed, shared or a dense MLP),
// with optional biases (gpt-oss), and ExpertMath: what the expert computes from them. Tensors
// may be any weight dtype, quantized kinds included; biases are f32 (or any float dtype the
// backend's add_bias takes).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace sluice {

struct ExpertWeights {
  Tensor gate, up;  // [n_ff, n_embd]
  Tensor down;      // [n_embd, n_ff]
  Tensor gate_bias, up_bias;  // [n_ff], optional (empty: none)
  Tensor down_bias;           // [n_embd], optional

  bool has_biases() const { return !gate_bias.empty() || !up_bias.empty() || !down_bias.empty(); }
};

enum class ExpertActivation : uint8_t {
  swiglu,          // down(silu(gate(x)) * up(x))
  swiglu_clamped,  // gpt-oss: g = min(gate(x), limit), u = clamp(up(x), -limit, limit),
                   // down((u + 1) * g * sigmoid(alpha * g))
  geglu_tanh,      // Gemma 4: down(gelu_tanh(gate(x)) * up(x))
};

// What one expert computes; biases (where the weights have them) are added to each
// projection's output before the activation and to the expert's output.
struct ExpertMath {
  ExpertActivation activation = ExpertActivation::swiglu;
  float alpha = 1.702f;  // swiglu_clamped: the sigmoid's gain (gpt-oss's value)
  float limit = 7.0f;    // swiglu_clamped: the clamp (gpt-oss's value)
  // Llama 4: the routing weight scales the expert's input (expert(w x)), and the outputs of a
  // row's experts are summed unweighted; otherwise the output is scaled (w expert(x)).
  bool scale_input = false;
  bool operator==(const ExpertMath&) const = default;
};

}  // namespace sluice
