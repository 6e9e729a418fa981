// The sampling rule (sampling.h), sequentially: the reference for the CUDA kernel.
#include "core/sampling.h"

#include <algorithm>
#include <cmath>

namespace sluice {

uint64_t sample_fixed_mass(float p) {
  return static_cast<uint64_t>(std::nearbyint(static_cast<double>(p) * kSampleMassOne));
}

namespace {

// exp((l_i - top) / T) / z over the kept tokens: the same expression everywhere it is needed,
// the exponential taken once a token (e, kept tokens only: the others are never read).
struct KeptSoftmax {
  std::span<const float> logits;
  const float* e;
  float T, top, z;
  float scaled(int64_t i) const { return (logits[i] - top) / T; }
  float operator()(int64_t i) const { return e[i] / z; }
};

KeptSoftmax kept_tokens(std::span<const float> logits, const SampleRule& rule, SampleScratch& sc) {
  const int64_t V = static_cast<int64_t>(logits.size());
  float top = logits[0];
  for (float x : logits) top = std::max(top, x);
  sc.e.resize(static_cast<size_t>(V));
  KeptSoftmax prob{logits, sc.e.data(), rule.temperature, top, 0.0f};
  // Top-k: by value, then id; the first k.
  sc.kept.assign(static_cast<size_t>(V), 1);
  auto by_value = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (rule.top_k > 0 && rule.top_k < V) {
    sc.order.resize(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) sc.order[i] = {prob.scaled(i), static_cast<int32_t>(i)};
    std::nth_element(sc.order.begin(), sc.order.begin() + (rule.top_k - 1), sc.order.end(), by_value);
    std::fill(sc.kept.begin(), sc.kept.end(), 0);
    for (int64_t j = 0; j < rule.top_k; ++j) sc.kept[static_cast<size_t>(sc.order[j].second)] = 1;
  }
  for (int64_t i = 0; i < V; ++i)
    if (sc.kept[i]) {
      sc.e[static_cast<size_t>(i)] = std::exp(prob.scaled(i));
      prob.z += sc.e[static_cast<size_t>(i)];
    }
  // Top-p: kept tokens by probability, then id, while the mass before them is below top_p.
  if (rule.top_p < 1.0f) {
    sc.order.clear();
    for (int64_t i = 0; i < V; ++i)
      if (sc.kept[i]) sc.order.push_back({prob(i), static_cast<int32_t>(i)});
    // The nucleus is the first n tokens of that order, n the least whose masses reach the
    // target. Found without sorting: each round partitions the range [lo, hi) the boundary
    // lies in at its middle k (nth_element) and keeps the half holding it, knowing the mass
    // ordered before lo; [0, n) then holds the n first tokens. O(V) in all (a full sort of a
    // nearly flat 151936-token row took ~20 ms); masses are exact integers, so n is the sorted
    // walk's.
    const uint64_t target = std::max<uint64_t>(sample_fixed_target(rule.top_p), 1);  // the first token always
    const size_t n_all = sc.order.size();
    size_t lo = 0, hi = n_all, n = n_all;  // the boundary n in (lo, hi], or none (every token)
    uint64_t before = 0;                   // mass ordered before lo: below the target
    while (lo < hi) {
      const size_t k = lo + (hi - lo) / 2;
      std::nth_element(sc.order.begin() + static_cast<std::ptrdiff_t>(lo), sc.order.begin() + static_cast<std::ptrdiff_t>(k),
                       sc.order.begin() + static_cast<std::ptrdiff_t>(hi), by_value);
      uint64_t mass = 0;
      for (size_t j = lo; j < k; ++j) mass += sample_fixed_mass(sc.order[j].first);
      if (before + mass >= target) {
        hi = k;
        n = k;
        continue;
      }
      before += mass + sample_fixed_mass(sc.order[k].first);
      if (before >= target) {
        n = k + 1;
        break;
      }
      lo = k + 1;
    }
    for (size_t j = n; j < n_all; ++j) sc.kept[static_cast<size_t>(sc.order[j].second)] = 0;
  }
  return prob;
}

}  // namespace

const std::vector<uint8_t>& sample_kept(std::span<const float> logits, const SampleRule& rule, SampleScratch& sc) {
  kept_tokens(logits, rule, sc);
  return sc.kept;
}

int32_t sample_row(std::span<const float> logits, const SampleRule& rule, double u, SampleScratch& sc) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (V == 0) return -1;
  // A NaN or +inf anywhere: -1. Else the first id of the largest value. Three passes without
  // a loop-carried index (vectorized: 0.22 against 0.56 ms on 151669 ids, bench_sample).
  bool bad = false;
  for (const float x : logits) bad |= std::isnan(x) || x == INFINITY;
  if (bad) return -1;
  float top = logits[0];
  for (const float x : logits) top = x > top ? x : top;
  int32_t best = 0;
  while (logits[best] != top) ++best;
  if (rule.temperature < kGreedyTemperature) return best;
  const KeptSoftmax prob = kept_tokens(logits, rule, sc);

  // The draw, in id order.
  float total = 0.0f;
  int32_t last = -1;
  for (int64_t i = 0; i < V; ++i)
    if (sc.kept[i]) {
      total += prob(i);
      last = static_cast<int32_t>(i);
    }
  const float r = static_cast<float>(u * static_cast<double>(total));
  float acc = 0.0f;
  for (int64_t i = 0; i < V; ++i)
    if (sc.kept[i]) {
      acc += prob(i);
      if (r < acc) return static_cast<int32_t>(i);
    }
  return last;
}

}  // namespace sluice
