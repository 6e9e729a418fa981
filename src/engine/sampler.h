// Sampler: the next token from a row of logits. Temperature 0 is greedy (the lowest id among
// equal maxima, as torch.argmax), and so is any temperature below kGreedyTemperature.
// Otherwise temperature (applied to each logit minus the largest, so that no scaling
// overflows: the values are <= 0 and exp() of them in [0, 1]), then top-k, then top-p (nucleus),
// then a draw from a seeded generator, so a seed reproduces a run exactly. Without top-k and
// top-p nothing is sorted (a draw costs two passes over the vocabulary); top-p sorts only the
// nucleus.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace sluice {

// Below this temperature a draw is greedy: a logit gap of 1e-4 (about the float resolution of
// logits near 100) already scales to 100 nats, a probability ratio of e^-100 (~4e-44), so
// only exact ties could differ, and smaller temperatures only push the scaling to overflow.
constexpr float kGreedyTemperature = 1e-6f;

struct SamplingParams {
  float temperature = 0.8f;  // 0 (or below kGreedyTemperature): greedy
  float top_p = 1.0f;        // (0, 1]; 1 keeps every token
  int32_t top_k = 0;         // 0 keeps every token
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch: (probability, id)
};

int32_t argmax(std::span<const float> logits);

// The first id whose logit is NaN or infinite, or -1 when every logit is finite.
int64_t first_non_finite(std::span<const float> logits);

}  // namespace sluice
