// Sampler: the next token from a row of logits, by the rule every backend shares
// (core/sampling.h: greedy at temperature 0 or below kGreedyTemperature; otherwise logits
// minus the largest over the temperature, top-k, softmax, top-p, one draw), with the uniform
// numbers from a generator seeded by the user, so a seed reproduces a run. The same draws
// feed Model::forward_sample when the step samples on the device.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/sampling.h"

namespace sluice {

struct SamplingParams {
  float temperature = 0.8f;  // 0 (or below kGreedyTemperature): greedy
  float top_p = 1.0f;        // (0, 1]; 1 keeps every token
  int32_t top_k = 0;         // 0 keeps every token
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // The next token from logits (all of them may be drawn). A row with NaN or +inf is an error
  // for the caller to catch first (first_non_finite); here it draws -1.
  int32_t sample(std::span<const float> logits);
  // The same draw among the tokens whose bit is set in allowed (engine/token_mask.h: bit t of
  // word t / 64; ids past the words are not allowed): the others count as -inf. -1 when no
  // token of logits is allowed.
  int32_t sample_masked(std::span<const float> logits, const std::vector<uint64_t>& allowed);
  // The rule, and the next uniform draw as u * 2^53 (u in [0, 1)), for a draw made elsewhere
  // (Model::forward_sample). sample() takes one draw per call too, greedy or not, so that a
  // run's draws do not depend on where its tokens were sampled.
  SampleRule rule() const;
  int64_t next_draw53();

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  SampleScratch scratch_;
  std::vector<float> masked_;  // sample_masked's copy of the row
};

int32_t argmax(std::span<const float> logits);

// The first id whose logit is NaN or infinite, or -1 when every logit is finite.
int64_t first_non_finite(std::span<const float> logits);

}  // namespace sluice
