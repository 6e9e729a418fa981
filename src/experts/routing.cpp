// route_topk (routing.h).
#include "experts/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace sluice {

Routing route_topk(const RouterSpec& spec, std::span<const float> logits, int64_t n_rows) {
  const int64_t E = spec.n_expert, k = spec.n_expert_used;
  SLUICE_ASSERT(static_cast<int64_t>(logits.size()) == n_rows * E);
  Routing r;
  r.n_rows = n_rows;
  r.k = k;
  r.ids.resize(n_rows * k);
  r.weights.resize(n_rows * k);
  std::vector<float> p(E);
  std::vector<int32_t> idx(E);
  for (int64_t row = 0; row < n_rows; ++row) {
    const float* l = logits.data() + row * E;
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
