// routed_experts: the template body (the expert lookup is a callable so that resident
// weights and streamed expert slots share this code).
#pragma once

#include <unordered_map>

namespace sluice {

// Groups (row, rank) pairs by expert in first-seen order: order[i] is an expert id, and
// pairs_of[i] its pair indices (row * k + rank).
void group_pairs_by_expert(const Routing& routing, std::vector<int32_t>& order,
                           std::vector<std::vector<int32_t>>& pairs_of);

template <typename ExpertLookup>
void routed_experts(Backend& be, const Routing& routing, const Tensor& h, const Tensor& out, ExpertLookup&& expert) {
  const int64_t n = routing.n_rows, k = routing.k, d = h.cols();
  std::vector<int32_t> order;
  std::vector<std::vector<int32_t>> pairs_of;
  group_pairs_by_expert(routing, order, pairs_of);
  Tensor expert_out = be.alloc(DType::f32, {n * k, d});  // [n*k, n_embd], row = pair
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<int32_t>& pairs = pairs_of[i];
    const int64_t m = static_cast<int64_t>(pairs.size());
    std::vector<int32_t> rows(pairs.size());
    for (size_t j = 0; j < pairs.size(); ++j) rows[j] = static_cast<int32_t>(pairs[j] / k);
    Tensor xin = be.alloc(DType::f32, {m, d});
    be.gather_rows(h, rows, xin);
    Tensor y = be.alloc(DType::f32, {m, d});
    swiglu_mlp(be, expert(order[i]), xin, y);
    be.scatter_rows(y, pairs, expert_out);
  }
  be.moe_combine(expert_out, routing.weights, k, out);
}

}  // namespace sluice
