// The sampling rule shared by the host sampler (engine/sampler.h), the CPU backend and the
// CUDA kernel (backends/cuda/sample.cu): one row of logits and one uniform number in, one token
// out. Temperature 0 is greedy (the lowest id among equal maxima, as torch.argmax), and so is
// any temperature below kGreedyTemperature. Otherwise: s = (logit - the largest) /
// temperature (<= 0, so no temperature overflows it); top-k keeps the k largest s (equal values: lower ids first);
// softmax over the kept tokens; top-p keeps the most likely of those (equal probabilities:
// lower ids first) until their mass reaches top_p; the draw walks the kept tokens in id order
// and takes the first whose cumulative probability exceeds u times their total. Nothing is
// sorted to draw, so the device needs no sort either; masses for top-p are summed in 2^-40
// fixed point (exact, order-free) on every implementation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sluice {

// Below this temperature a draw is greedy: a logit gap of 1e-4 (about the float resolution of
// logits near 100) already scales to 100 nats, a probability ratio of e^-100 (~4e-44), so
// only exact ties could differ, and smaller temperatures only push the scaling to overflow.
constexpr float kGreedyTemperature = 1e-6f;

struct SampleRule {
  float temperature = 0.0f;  // 0 (or below kGreedyTemperature): greedy
  int64_t top_k = 0;         // 0 (or >= the vocabulary): every token
  float top_p = 1.0f;        // (0, 1]; 1: every token
};

// Scratch a caller keeps between rows (no allocation per token after the first).
struct SampleScratch {
  std::vector<std::pair<float, int32_t>> order;  // (value, id)
  std::vector<uint8_t> kept;
  std::vector<float> e;  // exp((l_i - max) / T) of the kept tokens, each computed once a row
};

// The token for logits (only these ids can be drawn; padded output rows are left out by the
// caller) and u in [0, 1). Returns -1 when a logit is NaN or +inf (a broken model: the caller
// reports it).
int32_t sample_row(std::span<const float> logits, const SampleRule& rule, double u, SampleScratch& scratch);

// The tokens the rule may draw (1: kept) for a sampled rule (temperature > 0) and finite
// logits; sample_row draws among them. For tests and tools.
const std::vector<uint8_t>& sample_kept(std::span<const float> logits, const SampleRule& rule, SampleScratch& scratch);

// 2^-40 fixed point of a probability in [0, 1] (the top-p masses), rounded to nearest even
// as the device's __double2ll_rn; and of top_p itself, truncated (the nucleus takes at least
// one 2^-40 unit, so a top_p below that keeps the most likely token).
constexpr double kSampleMassOne = 1099511627776.0;
uint64_t sample_fixed_mass(float p);
inline uint64_t sample_fixed_target(float top_p) { return static_cast<uint64_t>(static_cast<double>(top_p) * kSampleMassOne); }

}  // namespace sluice
