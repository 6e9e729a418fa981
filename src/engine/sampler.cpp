// Sampling: greedy, temperature, top-k, top-p.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sluice {

int32_t argmax(std::span<const float> logits) {
  SLUICE_ASSERT(!logits.empty());
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

int64_t first_non_finite(std::span<const float> logits) {
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i])) return static_cast<int64_t>(i);
  return -1;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  SLUICE_CHECK(params.temperature >= 0 && std::isfinite(params.temperature), Status::invalid_argument,
               "temperature must be >= 0 (got ", params.temperature, ")");
  SLUICE_CHECK(params.top_p > 0 && params.top_p <= 1, Status::invalid_argument, "top-p must be in (0, 1] (got ",
               params.top_p, ")");
  SLUICE_CHECK(params.top_k >= 0, Status::invalid_argument, "top-k must be >= 0 (got ", params.top_k, ")");
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature < kGreedyTemperature) return argmax(logits);
  const size_t V = logits.size();
  SLUICE_ASSERT(V > 0);
  // (logit - max) / T: <= 0 whatever T, so nothing overflows to inf (inf - inf would be NaN);
  // a logit of -inf (a masked id) stays -inf and gets probability 0.
  const float top = logits[static_cast<size_t>(argmax(logits))];
  candidates_.resize(V);
  for (size_t i = 0; i < V; ++i) candidates_[i] = {(logits[i] - top) / params_.temperature, static_cast<int32_t>(i)};
  // Most likely first; equal values keep the lower id first, so the order is total.
  auto by_value = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < V) {
    const size_t keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep), candidates_.end(),
                      by_value);
    candidates_.resize(keep);
  }
  // softmax over the kept candidates (in whatever order they are)
  float mx = candidates_[0].first;
  for (const auto& c : candidates_) mx = std::max(mx, c.first);
  double sum = 0;
  for (auto& c : candidates_) sum += c.first = std::exp(c.first - mx);
  for (auto& c : candidates_) c.first = static_cast<float>(c.first / sum);
  if (params_.top_p < 1.0f) {
    // The nucleus: the most likely candidates until their mass reaches top_p. Only a prefix
    // is sorted: the m most likely (nth_element, then a sort of those m), m growing 8x until
    // the nucleus ends inside it. The prefix equals that of a full sort (the order is total);
    // a 151936-token vocabulary is then a few linear passes, not a sort of every token.
    const size_t n_all = candidates_.size();
    size_t m = std::min<size_t>(n_all, 64);
    for (;;) {
      auto mid = candidates_.begin() + static_cast<std::ptrdiff_t>(m);
      if (m < n_all) std::nth_element(candidates_.begin(), mid, candidates_.end(), by_value);
      std::sort(candidates_.begin(), mid, by_value);
      double cum = 0;
      size_t n = 0;
      while (n < m) {
        cum += candidates_[n++].first;
        if (cum >= params_.top_p) break;
      }
      if (cum >= params_.top_p || m == n_all) {
        candidates_.resize(n);
        break;
      }
      m = std::min(n_all, m * 8);
    }
  }
  // The draw walks the candidates in their order: most likely first after top-k or top-p,
  // else by token id (no sort at all).
  double total = 0;
  for (const auto& c : candidates_) total += c.first;
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r < 0) return c.second;
  }
  return candidates_.back().second;
}

}  // namespace sluice
