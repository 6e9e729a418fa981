// Sampler: the shared rule (core/sampling.h) with a seeded generator.
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

SampleRule Sampler::rule() const { return {params_.temperature, params_.top_k, params_.top_p}; }

int64_t Sampler::next_draw53() { return static_cast<int64_t>(rng_() >> 11); }

int32_t Sampler::sample(std::span<const float> logits) {
  SLUICE_ASSERT(!logits.empty());
  const double u = static_cast<double>(next_draw53()) * 0x1p-53;
  return sample_row(logits, rule(), u, scratch_);
}

int32_t Sampler::sample_masked(std::span<const float> logits, const std::vector<uint64_t>& allowed) {
  SLUICE_ASSERT(!logits.empty());
  const double u = static_cast<double>(next_draw53()) * 0x1p-53;
  masked_.assign(logits.size(), -INFINITY);
  int32_t best = -1;  // the largest allowed logit, lowest id first
  const size_t n_words = std::min(allowed.size(), (logits.size() + 63) / 64);
  for (size_t w = 0; w < n_words; ++w)
    for (uint64_t bits = allowed[w]; bits != 0; bits &= bits - 1) {
      const size_t t = w * 64 + static_cast<size_t>(__builtin_ctzll(bits));
      if (t >= logits.size()) break;
      masked_[t] = logits[t];
      if (best < 0 || logits[t] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(t);
    }
  if (best < 0) return -1;
  const int32_t t = sample_row(masked_, rule(), u, scratch_);
  // The draw's last-token fallback (rounding at the end of the walk) may land on a token of
  // probability 0; the most likely allowed one stands in.
  if (t < 0 || masked_[static_cast<size_t>(t)] == -INFINITY) return best;
  return t;
}

}  // namespace sluice
