// route_topk (routing.h).
#include "experts/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/router_group.h"

namespace sluice {

namespace {

// RouterScoring::sigmoid_grouped for one row l[E] into ids[k], weights[k]
// (core/router_group.h; the CUDA router, backends/cuda/router_group_topk.cu, makes the same
// comparisons and operations in the same order). s, c: scratch [E].
void route_grouped_row(const RouterSpec& spec, const float* l, std::span<const float> bias, int32_t* ids,
                       float* weights, std::vector<float>& s, std::vector<float>& c) {
  namespace rg = router_group;
  const int64_t E = spec.n_expert, k = spec.n_expert_used, G = spec.grouped.n_group, per = E / G;
  for (int64_t e = 0; e < E; ++e) {
    s[e] = rg::sigmoid(l[e]);
    c[e] = rg::choice_value(s[e], bias.empty() ? 0.0f : bias[e]);
  }
  // Groups: each scored by its two best choice values; the topk_group best kept (equal
  // scores: the lower group), the experts of the others out of the choice.
  std::vector<bool> open(static_cast<size_t>(E), true);
  if (G > 1) {
    std::vector<float> g(static_cast<size_t>(G));
    for (int64_t j = 0; j < G; ++j) {
      float best = -INFINITY, second = -INFINITY;
      for (int64_t e = j * per; e < (j + 1) * per; ++e) {
        if (c[e] > best) {
          second = best;
          best = c[e];
        } else if (c[e] > second) {
          second = c[e];
        }
      }
      g[j] = rg::group_value(best, second);
    }
    std::vector<bool> kept(static_cast<size_t>(G), false);
    for (int64_t r = 0; r < spec.grouped.topk_group; ++r) {
      int64_t pick = -1;
      for (int64_t j = 0; j < G; ++j)
        if (!kept[j] && (pick < 0 || g[j] > g[pick])) pick = j;
      kept[pick] = true;
    }
    for (int64_t e = 0; e < E; ++e) open[e] = kept[e / per];
  }
  // The top k of the open experts by choice value (equal values: the lower id), strongest first.
  float sum = 0.0f;
  for (int64_t r = 0; r < k; ++r) {
    int64_t pick = -1;
    for (int64_t e = 0; e < E; ++e)
      if (open[e] && (pick < 0 || c[e] > c[pick])) pick = e;
    open[pick] = false;
    ids[r] = static_cast<int32_t>(pick);
    sum = rg::add(sum, s[pick]);  // in rank order
  }
  for (int64_t r = 0; r < k; ++r)
    weights[r] = rg::weight(s[ids[r]], sum, spec.norm_topk_prob, spec.grouped.norm_eps,
                            spec.grouped.routed_scaling_factor);
}

}  // namespace

Routing route_topk(const RouterSpec& spec, std::span<const float> logits, int64_t n_rows,
                   std::span<const float> score_bias) {
  const int64_t E = spec.n_expert, k = spec.n_expert_used;
  SLUICE_ASSERT(static_cast<int64_t>(logits.size()) == n_rows * E);
  SLUICE_ASSERT(score_bias.empty() || static_cast<int64_t>(score_bias.size()) == E);
  Routing r;
  r.n_rows = n_rows;
  r.k = k;
  r.ids.resize(n_rows * k);
  r.weights.resize(n_rows * k);
  std::vector<float> p(E), c(E);
  std::vector<int32_t> idx(E);
  for (int64_t row = 0; row < n_rows; ++row) {
    const float* l = logits.data() + row * E;
    if (spec.scoring == RouterScoring::sigmoid_grouped) {
      route_grouped_row(spec, l, score_bias, r.ids.data() + row * k, r.weights.data() + row * k, p, c);
      continue;
    }
    if (spec.scoring == RouterScoring::sigmoid) {  // torch.topk of the logits, then sigmoid(top value)
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                        [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
      for (int64_t j = 0; j < k; ++j) {
        r.ids[row * k + j] = idx[j];
        r.weights[row * k + j] = 1.0f / (1.0f + std::exp(-l[idx[j]]));
      }
      continue;
    }
    float mx = *std::max_element(l, l + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float top_sum = 0;
    for (int64_t j = 0; j < k; ++j) top_sum += p[idx[j]];
    for (int64_t j = 0; j < k; ++j) {
      r.ids[row * k + j] = idx[j];
      r.weights[row * k + j] = spec.norm_topk_prob ? p[idx[j]] / top_sum : p[idx[j]];
    }
  }
  return r;
}

}  // namespace sluice
