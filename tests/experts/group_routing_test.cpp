// Group-limited sigmoid routing (RouterScoring::sigmoid_grouped: DeepSeek-V3, GLM-4.5,
// MiniMax-M2): route_topk against a direct transcription of transformers' DeepseekV3TopkRouter
// (in double, torch.topk's choices by sorting) on random logits and biases, and small cases
// worked by hand: the bias moves the choice but not the weights, a group's score is its two
// best, an expert of a dropped group never wins, renormalization and the scaling factor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/router_group.h"
#include "experts/routing.h"

using namespace sluice;

namespace {

RouterSpec grouped_spec(int64_t E, int64_t k, int64_t groups, int64_t keep, bool norm, float scale) {
  RouterSpec s;
  s.n_expert = E;
  s.n_expert_used = k;
  s.norm_topk_prob = norm;
  s.scoring = RouterScoring::sigmoid_grouped;
  s.grouped = GroupedRouting{groups, keep, scale, 1e-20f};
  return s;
}

// transformers' router for one row, in double: the chosen set (ascending ids) and each chosen
// expert's weight.
std::vector<std::pair<int32_t, double>> reference_row(const RouterSpec& s, const float* l, const float* bias) {
  const int64_t E = s.n_expert, G = s.grouped.n_group, per = E / G;
  std::vector<double> score(E), choice(E);
  for (int64_t e = 0; e < E; ++e) {
    score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e])));
    choice[e] = score[e] + bias[e];
  }
  std::vector<double> group(G);
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    std::sort(v.rbegin(), v.rend());
    group[g] = v[0] + v[1];
  }
  std::vector<int64_t> gi(G);
  std::iota(gi.begin(), gi.end(), 0);
  std::stable_sort(gi.begin(), gi.end(), [&](int64_t a, int64_t b) { return group[a] > group[b]; });
  std::vector<double> masked(E, -INFINITY);
  for (int64_t r = 0; r < s.grouped.topk_group; ++r)
    for (int64_t e = gi[r] * per; e < (gi[r] + 1) * per; ++e) masked[e] = choice[e];
  std::vector<int32_t> ei(E);
  std::iota(ei.begin(), ei.end(), 0);
  std::stable_sort(ei.begin(), ei.end(), [&](int32_t a, int32_t b) { return masked[a] > masked[b]; });
  double sum = 0;
  for (int64_t r = 0; r < s.n_expert_used; ++r) sum += score[ei[r]];
  std::vector<std::pair<int32_t, double>> out;
  for (int64_t r = 0; r < s.n_expert_used; ++r) {
    const double w = s.norm_topk_prob ? score[ei[r]] / (sum + 1e-20) : score[ei[r]];
    out.push_back({ei[r], w * s.grouped.routed_scaling_factor});
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(GroupRouting, SigmoidMatchesTheExponentialWithinTwoUlp) {
  for (float x = -90.0f; x <= 90.0f; x += 0.0137f) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    const float got = router_group::sigmoid(x);
    EXPECT_NEAR(got, want, 2.5e-7 * want + 1e-37) << x;
  }
  EXPECT_EQ(router_group::sigmoid(0.0f), 0.5f);
  EXPECT_TRUE(std::isnan(router_group::sigmoid(NAN)));
}

TEST(GroupRouting, MatchesTransformersRouterOnRandomRows) {
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 2.0f), bias(0.0f, 0.1f);
  struct Case {
    int64_t E, k, groups, keep;
    bool norm;
    float scale;
  };
  const Case cases[] = {{16, 4, 4, 2, true, 2.5f},   {16, 4, 1, 1, false, 1.0f}, {16, 4, 2, 1, true, 2.5f},
                        {64, 8, 8, 4, true, 2.5f},   {256, 8, 8, 4, true, 2.5f}, {12, 3, 3, 2, false, 1.5f},
                        {8, 8, 1, 1, true, 1.0f},    {160, 8, 1, 1, true, 1.0f}};
  int rows = 0;
  for (const Case& c : cases) {
    const RouterSpec s = grouped_spec(c.E, c.k, c.groups, c.keep, c.norm, c.scale);
    const int64_t n = 40;
    std::vector<float> l(n * c.E), b(c.E);
    for (float& v : l) v = logit(rng);
    for (float& v : b) v = bias(rng);
    const Routing r = route_topk(s, l, n, b);
    ASSERT_EQ(r.ids.size(), static_cast<size_t>(n * c.k));
    for (int64_t row = 0; row < n; ++row) {
      const auto want = reference_row(s, l.data() + row * c.E, b.data());
      std::vector<std::pair<int32_t, double>> got;
      for (int64_t j = 0; j < c.k; ++j) got.push_back({r.ids[row * c.k + j], r.weights[row * c.k + j]});
      // Strongest first by score + bias.
      for (int64_t j = 1; j < c.k; ++j) {
        const int32_t a = r.ids[row * c.k + j - 1], z = r.ids[row * c.k + j];
        EXPECT_GE(router_group::sigmoid(l[row * c.E + a]) + b[a], router_group::sigmoid(l[row * c.E + z]) + b[z]);
      }
      std::sort(got.begin(), got.end());
      ASSERT_EQ(got.size(), want.size());
      for (size_t j = 0; j < got.size(); ++j) {
        EXPECT_EQ(got[j].first, want[j].first) << "row " << row << " of E=" << c.E;
        EXPECT_NEAR(got[j].second, want[j].second, 1e-6 * want[j].second) << "row " << row;
      }
      ++rows;
    }
  }
  EXPECT_EQ(rows, 8 * 40);
}

// Worked by hand: 8 experts in 4 groups of 2, keep 2 groups, top-2.
//   logits 0 for all but: e0 = 3 (group 0), e2 = 2, e3 = 2 (group 1), e6 = 2.5 (group 3).
//   group scores (sigmoid sums): g0 = s(3) + s(0) = 1.4526, g1 = 2 s(2) = 1.7616,
//   g2 = 1.0, g3 = s(2.5) + s(0) = 1.4241 -> groups 1 and 0 kept; e6 (score 0.924) is out.
//   Top-2 in groups 0 and 1: e0 (0.9526), then e2 / e3 (0.8808, equal: the lower id, e2).
// With a bias of +0.2 on e3 it wins over e2 and e0; the weights stay unbiased scores.
TEST(GroupRouting, BiasChoosesGroupsLimitWeightsStayUnbiased) {
  RouterSpec s = grouped_spec(8, 2, 4, 2, false, 1.0f);
  std::vector<float> l = {3, 0, 2, 2, 0, 0, 2.5f, 0};
  std::vector<float> zero(8, 0.0f);
  Routing r = route_topk(s, l, 1, zero);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(r.weights[0], router_group::sigmoid(3.0f));
  EXPECT_EQ(r.weights[1], router_group::sigmoid(2.0f));

  std::vector<float> bias(8, 0.0f);
  bias[3] = 0.2f;
  r = route_topk(s, l, 1, bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(r.weights[0], router_group::sigmoid(2.0f));  // s, not s + bias

  // Renormalized and scaled: w = s / (s0 + s1 + 1e-20) * 2.5.
  s = grouped_spec(8, 2, 4, 2, true, 2.5f);
  r = route_topk(s, l, 1, bias);
  const float s3 = router_group::sigmoid(2.0f), s0 = router_group::sigmoid(3.0f);
  EXPECT_EQ(r.weights[0], s3 / (s3 + s0) * 2.5f);
  EXPECT_EQ(r.weights[1], s0 / (s3 + s0) * 2.5f);

  // A large bias on a dropped group's expert lifts its group: e6 + 1.0 makes g3 the best.
  bias.assign(8, 0.0f);
  bias[6] = 1.0f;
  s = grouped_spec(8, 2, 4, 1, false, 1.0f);
  r = route_topk(s, l, 1, bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{6, 7}));
}
