// Windowed perplexity: each window forwarded a chunk at a time, log-softmax in double per
// scored position.
#include "engine/perplexity.h"

#include <cmath>

#include "core/error.h"
#include "engine/sampler.h"

namespace sluice {

PerplexityScorer::PerplexityScorer(Model& model, int64_t n_ctx, int64_t chunk)
    : model_(model), n_ctx_(n_ctx), chunk_(chunk), t0_(std::chrono::steady_clock::now()) {
  SLUICE_CHECK(n_ctx >= 2, Status::invalid_argument, "perplexity needs a context of at least 2 tokens");
  SLUICE_CHECK(chunk >= 1, Status::invalid_argument, "perplexity: chunks of ", chunk, " tokens");
  model.check_context(n_ctx, str("--ctx ", n_ctx));
  state_ = model.new_state(n_ctx);
  pending_.reserve(static_cast<size_t>(n_ctx));
}

void PerplexityScorer::push(std::span<const int32_t> ids) {
  while (!ids.empty() && !interrupted_) {
    const size_t take = std::min(ids.size(), static_cast<size_t>(n_ctx_) - pending_.size());
    pending_.insert(pending_.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(take));
    ids = ids.subspan(take);
    if (static_cast<int64_t>(pending_.size()) == n_ctx_) {
      score_window(pending_);
      pending_.clear();
    }
  }
}

void PerplexityScorer::score_window(std::span<const int32_t> ids) {
  const int64_t V = model_.info().n_vocab, len = static_cast<int64_t>(ids.size());
  state_->reset();
  double nll = 0;
  for (int64_t c0 = 0; c0 < len; c0 += chunk_) {
    if (cancel && cancel->load()) {
      interrupted_ = true;  // the window is dropped whole
      return;
    }
    const int64_t n = std::min(chunk_, len - c0);
    logits_.resize(static_cast<size_t>(n * V));
    model_.forward(ids.subspan(static_cast<size_t>(c0), static_cast<size_t>(n)), *state_, logits_, true);
    // Row i predicts token c0 + i + 1; the window's last row predicts nothing.
    for (int64_t i = 0; i < n && c0 + i + 1 < len; ++i) {
      const std::span<const float> row(logits_.data() + i * V, static_cast<size_t>(V));
      const int64_t bad = first_non_finite(row);
      SLUICE_CHECK(bad < 0, Status::corrupt, "the model's logits are not finite in window ", r_.n_windows + 1,
                   " at position ", c0 + i, ": token ", bad, " has logit ", row[bad],
                   " (NaN or infinite weights or activations)");
      double mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      nll += mx + std::log(sum) - row[ids[c0 + i + 1]];
    }
  }
  nll_ += nll;
  r_.n_scored += len - 1;
  ++r_.n_windows;
  if (on_window) on_window(r_.n_windows);
}

PerplexityResult PerplexityScorer::finish() {
  if (cancel && cancel->load()) interrupted_ = true;
  if (!interrupted_ && pending_.size() >= 2) score_window(pending_);
  pending_.clear();
  r_.interrupted = interrupted_;
  SLUICE_CHECK(r_.n_scored > 0 || interrupted_, Status::invalid_argument, "perplexity needs at least 2 tokens of text");
  r_.mean_nll = r_.n_scored ? nll_ / static_cast<double>(r_.n_scored) : 0;
  r_.perplexity = std::exp(r_.mean_nll);
  r_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  return r_;
}

PerplexityResult perplexity(Model& model, std::span<const int32_t> ids, int64_t n_ctx,
                            const std::function<void(int64_t, int64_t)>& progress) {
  SLUICE_CHECK(ids.size() >= 2, Status::invalid_argument, "perplexity needs at least 2 tokens of text");
  PerplexityScorer scorer(model, n_ctx);
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t n_windows = (n + n_ctx - 1) / n_ctx - ((n % n_ctx) == 1 ? 1 : 0);
  if (progress) scorer.on_window = [&](int64_t done) { progress(done, n_windows); };
  scorer.push(ids);
  return scorer.finish();
}

}  // namespace sluice
