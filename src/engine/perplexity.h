// Perplexity of a model on a token sequence, by the procedure tools/train_demo.py documents:
// consecutive windows of n_ctx tokens (the last may be shorter, at least 2), each run from an
// empty context; every token but the first of a window is scored; perplexity = exp(mean NLL).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "models/model.h"

namespace sluice {

struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;      // nats per scored token
  int64_t n_scored = 0;     // tokens scored
  int64_t n_windows = 0;
  double seconds = 0;
};

// progress(windows_done, windows_total) after each window, if given.
PerplexityResult perplexity(Model& model, std::span<const int32_t> ids, int64_t n_ctx,
                            const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace sluice
