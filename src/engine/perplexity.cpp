// Windowed perplexity: log-softmax in double per scored position.
#include "engine/perplexity.h"

#include <chrono>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace sluice {

PerplexityResult perplexity(Model& model, std::span<const int32_t> ids, int64_t n_ctx,
                            const std::function<void(int64_t, int64_t)>& progress) {
  SLUICE_CHECK(n_ctx >= 2, Status::invalid_argument, "perplexity needs a context of at least 2 tokens");
  SLUICE_CHECK(ids.size() >= 2, Status::invalid_argument, "perplexity needs at least 2 tokens of text");
  auto t0 = std::chrono::steady_clock::now();
  const int64_t V = model.info().n_vocab, n = static_cast<int64_t>(ids.size());
  const int64_t n_windows = (n + n_ctx - 1) / n_ctx - ((n % n_ctx) == 1 ? 1 : 0);
  auto state = model.new_state(n_ctx);
  std::vector<float> logits;
  double nll = 0;
  PerplexityResult r;
  for (int64_t start = 0; start < n; start += n_ctx) {
    const int64_t len = std::min(n_ctx, n - start);
    if (len < 2) break;
    state->reset();
    logits.resize(len * V);
    model.forward(ids.subspan(start, len), *state, logits, true);
    for (int64_t i = 0; i + 1 < len; ++i) {
      const float* row = logits.data() + i * V;
      double mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      nll += mx + std::log(sum) - row[ids[start + i + 1]];
      ++r.n_scored;
    }
    ++r.n_windows;
    if (progress) progress(r.n_windows, n_windows);
  }
  r.mean_nll = nll / static_cast<double>(r.n_scored);
  r.perplexity = std::exp(r.mean_nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace sluice
