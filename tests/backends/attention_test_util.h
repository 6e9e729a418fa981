// The attention parameters the op tests vary (CPU and CUDA), the others at their defaults:
// set by name, so that AttentionParams can grow without every test's aggregate changing.
#pragma once

#include <cstdint>

#include "backends/backend.h"

namespace sluice::test {

inline AttentionParams attention_params(int64_t n_past, float scale, int64_t window, Tensor sinks = {}) {
  AttentionParams p;
  p.n_past = n_past;
  p.scale = scale;
  p.sliding_window = window;
  p.sinks = sinks;
  return p;
}

}  // namespace sluice::test
