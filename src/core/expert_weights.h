// ExpertWeights: the three projections of one SwiGLU expert (routed, shared or a dense MLP).
// Tensors may be any weight dtype, quantized kinds included.
#pragma once

#include "core/tensor.h"

namespace sluice {

struct ExpertWeights {
  Tensor gate, up;  // [n_ff, n_embd]
  Tensor down;      // [n_embd, n_ff]
};

}  // namespace sluice
