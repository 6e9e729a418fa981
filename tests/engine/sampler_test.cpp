// Sampler: greedy ties, seeded reproducibility, and that each mode draws from the distribution
// it claims (frequencies over many draws against the softmax, within 5 standard deviations).
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

using namespace sluice;

namespace {

SamplingParams params(float temperature, float top_p = 1.0f, int32_t top_k = 0, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.seed = seed;
  return p;
}

std::vector<int64_t> histogram(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<int64_t> h(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    const int32_t id = s.sample(logits);
    EXPECT_GE(id, 0);
    EXPECT_LT(id, static_cast<int32_t>(logits.size()));
    ++h[static_cast<size_t>(id)];
  }
  return h;
}

// Expects counts h to follow probabilities p (zero where p is zero), each within 5 sigma.
void expect_frequencies(const std::vector<int64_t>& h, const std::vector<double>& p, int draws) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(h[i], 0) << "token " << i << " is outside the kept set";
      continue;
    }
    const double mean = draws * p[i], sd = std::sqrt(draws * p[i] * (1 - p[i]));
    EXPECT_NEAR(static_cast<double>(h[i]), mean, 5 * sd + 1) << "token " << i;
  }
}

}  // namespace

TEST(Sampler, GreedyTakesTheLowestIdAmongEqualMaxima) {
  Sampler s(params(0));
  EXPECT_EQ(s.sample(std::vector<float>{1, 3, 2, 3}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-5}), 0);
}

TEST(Sampler, ASeedReproducesTheDraws) {
  std::vector<float> logits(1000, 0.0f);
  Sampler a(params(1, 1, 0, 42)), b(params(1, 1, 0, 42)), c(params(1, 1, 0, 43));
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 64; ++i) {
    da.push_back(a.sample(logits));
    db.push_back(b.sample(logits));
    dc.push_back(c.sample(logits));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
}

TEST(Sampler, FullDistributionMatchesTheSoftmax) {
  // No top-k, no top-p: the unsorted path. Temperature 2 halves the logits.
  const std::vector<float> logits = {0.0f, 2.0f, -1.0f, 4.0f, 1.0f, 0.5f};
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / 2.0);
  for (double& v : p) v /= sum;
  Sampler s(params(2));
  const int draws = 40000;
  expect_frequencies(histogram(s, logits, draws), p, draws);
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f, 2.5f};
  Sampler s(params(1, 1, 2));
  const double a = std::exp(3.0), b = std::exp(2.5);
  const int draws = 20000;
  expect_frequencies(histogram(s, logits, draws), {0, a / (a + b), 0, 0, b / (a + b)}, draws);
  Sampler one(params(1, 1, 1));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one.sample(logits), 1);
}

TEST(Sampler, TopPKeepsTheNucleusInOrderOfProbability) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (ids shuffled): top-p 0.75 keeps the first two (0.8
  // itself would sit on the rounding of 0.5 + 0.3).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  Sampler s(params(1, 0.75f));
  const int draws = 20000;
  expect_frequencies(histogram(s, logits, draws), {0, 0.5 / 0.8, 0, 0.3 / 0.8}, draws);
}

TEST(Sampler, TopPOverALargeVocabularyGrowsThePrefix) {
  // 5000 equal logits of probability 0.0002: a nucleus of 0.4999 is 2500 tokens, ties
  // ordered by id, so the kept set is ids 0..2499 (a prefix far past the first sorted block
  // of 64).
  std::vector<float> logits(5000, 0.0f);
  Sampler s(params(1, 0.4999f, 0, 3));
  int32_t max_id = 0;
  for (int i = 0; i < 4000; ++i) max_id = std::max(max_id, s.sample(logits));
  EXPECT_LT(max_id, 2500);
  EXPECT_GT(max_id, 2400);  // the draw reaches the end of the nucleus
}
