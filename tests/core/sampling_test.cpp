// core/sampling.h, the rule the host sampler, the CPU backend and the CUDA kernel share:
// greedy ties, the kept sets of top-k and top-p (ties: lower ids first), frequencies of many
// draws against the softmax of the kept tokens (within 5 standard deviations), broken logits,
// and the backend op's default implementation.
#include "core/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backends/backend.h"

using namespace sluice;

namespace {

// Probability of each token under the rule, computed independently of sample_row: sort all
// tokens by (value desc, id asc), keep k, softmax in double, keep the nucleus.
std::vector<double> rule_probabilities(const std::vector<float>& logits, const SampleRule& rule) {
  const size_t V = logits.size();
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<double> s(V);
  for (size_t i = 0; i < V; ++i) s[i] = static_cast<double>(logits[i]) / rule.temperature;
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
  size_t keep = rule.top_k > 0 && static_cast<size_t>(rule.top_k) < V ? static_cast<size_t>(rule.top_k) : V;
  double z = 0;
  for (size_t j = 0; j < keep; ++j) z += std::exp(s[ids[j]] - s[ids[0]]);
  std::vector<double> p(V, 0.0);
  double cum = 0;
  for (size_t j = 0; j < keep; ++j) {
    if (rule.top_p < 1.0f && cum >= rule.top_p) break;
    p[ids[j]] = std::exp(s[ids[j]] - s[ids[0]]) / z;
    cum += p[ids[j]];
  }
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= total;
  return p;
}

void expect_frequencies(const std::vector<float>& logits, const SampleRule& rule, int draws) {
  const std::vector<double> p = rule_probabilities(logits, rule);
  std::vector<int64_t> h(logits.size(), 0);
  SampleScratch sc;
  for (int d = 0; d < draws; ++d) {
    const int32_t id = sample_row(logits, rule, (d + 0.5) / draws, sc);  // a uniform grid of u
    ASSERT_GE(id, 0);
    ++h[static_cast<size_t>(id)];
  }
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(h[i], 0) << "token " << i << " is outside the kept set";
      continue;
    }
    const double mean = p[i] * draws, sd = std::sqrt(draws * p[i] * (1 - p[i]));
    EXPECT_NEAR(static_cast<double>(h[i]), mean, 5 * sd + 1) << "token " << i;
  }
}

TEST(Sampling, GreedyTakesTheLowestIdAmongEqualMaxima) {
  SampleScratch sc;
  EXPECT_EQ(sample_row(std::vector<float>{1, 3, 2, 3}, SampleRule{}, 0.5, sc), 1);
  EXPECT_EQ(sample_row(std::vector<float>{-1, -1}, SampleRule{}, 0.5, sc), 0);
}

TEST(Sampling, BrokenLogitsAreMinusOne) {
  SampleScratch sc;
  EXPECT_EQ(sample_row(std::vector<float>{1, NAN, 2}, SampleRule{}, 0.5, sc), -1);
  EXPECT_EQ(sample_row(std::vector<float>{1, INFINITY}, SampleRule{1.0f, 0, 1.0f}, 0.5, sc), -1);
  EXPECT_EQ(sample_row(std::vector<float>{}, SampleRule{}, 0.5, sc), -1);
  // -inf is a token that can never be drawn, not an error.
  EXPECT_EQ(sample_row(std::vector<float>{-INFINITY, 0.0f}, SampleRule{1.0f, 0, 1.0f}, 0.01, sc), 1);
}

TEST(Sampling, FrequenciesFollowTheKeptSoftmax) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 2.0f);
  std::vector<float> logits(50);
  for (auto& x : logits) x = g(rng);
  logits[7] = logits[9] = logits[11] = 4.0f;  // ties across the top-k and top-p boundaries
  for (const SampleRule rule : {SampleRule{1.0f, 0, 1.0f}, SampleRule{0.7f, 0, 1.0f}, SampleRule{1.0f, 2, 1.0f},
                                SampleRule{1.0f, 5, 1.0f}, SampleRule{1.0f, 0, 0.5f}, SampleRule{1.3f, 10, 0.8f}})
    expect_frequencies(logits, rule, 20000);
}

TEST(Sampling, TiesKeepTheLowerIds) {
  SampleScratch sc;
  const std::vector<float> flat(10, 1.0f);
  std::set<int32_t> seen;
  for (int d = 0; d < 1000; ++d) seen.insert(sample_row(flat, SampleRule{1.0f, 3, 1.0f}, d / 1000.0, sc));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2}));
  seen.clear();  // top-p 0.25 of ten equal tokens: the mass before a token must be below 0.25
  for (int d = 0; d < 1000; ++d) seen.insert(sample_row(flat, SampleRule{1.0f, 0, 0.25f}, d / 1000.0, sc));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2}));
}

// The nucleus by the rule's definition: the probabilities as the rule computes them (float
// exp over the float z of the top-k kept tokens, added in id order), every token sorted by
// (probability desc, id asc), kept while the fixed-point mass before it is below top_p.
std::vector<uint8_t> sorted_walk_kept(const std::vector<float>& logits, const SampleRule& rule) {
  const size_t V = logits.size();
  SampleScratch sc;
  const SampleRule k_only{rule.temperature, rule.top_k, 1.0f};
  std::vector<uint8_t> kept = sample_kept(logits, k_only, sc);  // top-k's set (tested above)
  const float top = *std::max_element(logits.begin(), logits.end());
  float z = 0.0f;
  for (size_t i = 0; i < V; ++i)
    if (kept[i]) z += std::exp((logits[i] - top) / rule.temperature);
  std::vector<std::pair<float, int32_t>> order;
  for (size_t i = 0; i < V; ++i)
    if (kept[i]) order.push_back({std::exp((logits[i] - top) / rule.temperature) / z, static_cast<int32_t>(i)});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  const uint64_t target = std::max<uint64_t>(sample_fixed_target(rule.top_p), 1);
  uint64_t mass = 0;
  size_t n = 0;
  while (n < order.size() && mass < target) mass += sample_fixed_mass(order[n++].first);
  for (size_t j = n; j < order.size(); ++j) kept[static_cast<size_t>(order[j].second)] = 0;
  return kept;
}

// The nucleus found without a sort is the sorted walk's, bit for bit: rows peaked and nearly
// flat, with runs of equal values (ties at the boundary), many top_p values.
TEST(Sampling, TopPKeepsTheSortedWalksNucleus) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t V = trial % 3 == 0 ? 5000 : trial % 3 == 1 ? 257 : 3;
    std::normal_distribution<float> g(0.0f, trial % 2 ? 0.3f : 4.0f);
    std::vector<float> logits(V);
    for (auto& x : logits) x = g(rng);
    for (size_t i = 0; i < V; i += 1 + trial % 7) logits[i] = std::round(logits[i]);  // equal values
    for (const float top_p : {1e-13f, 0.05f, 0.3f, 0.5f, 0.9f, 0.95f, 0.999f, 0.99999994f})
      for (const int64_t top_k : {int64_t{0}, int64_t{40}}) {
        const SampleRule rule{trial % 4 == 0 ? 2.0f : 0.8f, top_k, top_p};
        SampleScratch sc;
        EXPECT_EQ(sample_kept(logits, rule, sc), sorted_walk_kept(logits, rule))
            << "trial " << trial << " top_p " << top_p << " top_k " << top_k;
      }
  }
}

TEST(Sampling, TheBackendOpDrawsWhatTheRuleDraws) {
  auto be = make_cpu_backend();
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t n = 3, V = 40, n_valid = 33;
  std::vector<float> logits(n * V);
  for (auto& x : logits) x = g(rng);
  logits[V + 35] = 100.0f;  // a padded id (>= n_valid) is never drawn, even when it is the largest
  std::vector<int64_t> draws = {int64_t{1} << 50, int64_t{3} << 51, (int64_t{1} << 53) - 1};
  Tensor tl = be->alloc(DType::f32, {n, V}), tu = be->alloc(DType::i64, {n}), ti = be->alloc(DType::i32, {n});
  be->from_host(tl, logits.data());
  be->from_host(tu, draws.data());
  for (const SampleRule rule : {SampleRule{}, SampleRule{0.9f, 4, 0.9f}}) {
    be->sample(tl, n_valid, rule, tu, ti);
    std::vector<int32_t> got(n);
    be->to_host(ti, got.data());
    SampleScratch sc;
    for (int64_t r = 0; r < n; ++r) {
      const std::span<const float> row = std::span<const float>(logits).subspan(r * V, n_valid);
      EXPECT_EQ(got[r], sample_row(row, rule, static_cast<double>(draws[r]) * 0x1p-53, sc)) << r;
      EXPECT_LT(got[r], n_valid);
    }
  }
}

}  // namespace
