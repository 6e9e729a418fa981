// Sampler: the next token from a row of logits. Temperature 0 is greedy (the lowest id among
// equal maxima, as torch.argmax). Otherwise temperature, then top-k, then top-p (nucleus),
// then a draw from a seeded generator, so a seed reproduces a run exactly. Without top-k and
// top-p nothing is sorted (a draw costs two passes over the vocabulary); top-p sorts only the
// nucleus.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace sluice {

struct SamplingParams {
  float temperature = 0.8f;  // 0: greedy
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

}  // namespace sluice
