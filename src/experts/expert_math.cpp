// The expert computation (expert_math.h).
#include "experts/expert_math.h"

#include <unordered_map>

namespace sluice {

void swiglu_mlp(Backend& be, const ExpertWeights& w, const Tensor& h, const Tensor& out) {
  const int64_t n = h.rows(), ff = w.gate.shape[0];
  Tensor g = be.alloc(DType::f32, {n, ff});
  Tensor u = be.alloc(DType::f32, {n, ff});
  be.matmul(h, w.gate, g);
  be.matmul(h, w.up, u);
  be.swiglu(g, u, g);
  be.matmul(g, w.down, out);
}

void expert_forward(Backend& be, const ExpertMath& math, const ExpertWeights& w, const Tensor& h, const Tensor& out) {
  if (math.activation == ExpertActivation::swiglu && !w.has_biases()) return swiglu_mlp(be, w, h, out);
  const int64_t n = h.rows(), ff = w.gate.shape[0];
  Tensor g = be.alloc(DType::f32, {n, ff});  // [n, n_ff]
  Tensor u = be.alloc(DType::f32, {n, ff});  // [n, n_ff]
  be.matmul(h, w.gate, g);
  be.matmul(h, w.up, u);
  if (!w.gate_bias.empty()) be.add_bias(g, w.gate_bias);
  if (!w.up_bias.empty()) be.add_bias(u, w.up_bias);
  switch (math.activation) {
    case ExpertActivation::swiglu: be.swiglu(g, u, g); break;
    case ExpertActivation::swiglu_clamped: be.swiglu_clamped(g, u, g, math.alpha, math.limit); break;
    case ExpertActivation::geglu_tanh:
      be.activate(g, Activation::gelu_tanh);
      be.mul(g, u);
      break;
  }
  be.matmul(g, w.down, out);
  if (!w.down_bias.empty()) be.add_bias(out, w.down_bias);
}

void expert_pairs_forward(Backend& be, const ExpertMath& math, const ExpertWeights& w, const Tensor& h,
                          std::span<const int32_t> pairs, int64_t k, std::span<const float> weights,
                          const Tensor& expert_out) {
  const int64_t m = static_cast<int64_t>(pairs.size()), d = h.cols();
  std::vector<int32_t> rows(pairs.size());
  for (size_t j = 0; j < pairs.size(); ++j) rows[j] = static_cast<int32_t>(pairs[j] / k);
  Tensor xin = be.alloc(DType::f32, {m, d});
  be.gather_rows(h, rows, xin);
  if (math.scale_input) {  // Llama 4: expert(w x), one rounding per element as transformers' h * score
    std::vector<float> scale(pairs.size());
    for (size_t j = 0; j < pairs.size(); ++j) scale[j] = weights[static_cast<size_t>(pairs[j])];
    Tensor s = be.alloc(DType::f32, {m, 1});  // [m, 1]: a weight a row
    be.from_host(s, scale.data());
    be.mul(xin, s);
  }
  Tensor y = be.alloc(DType::f32, {m, d});
  expert_forward(be, math, w, xin, y);
  be.scatter_rows(y, pairs, expert_out);
}

std::span<const float> combine_weights(const ExpertMath& math, std::span<const float> weights, std::vector<float>& ones) {
  if (!math.scale_input) return weights;
  ones.assign(weights.size(), 1.0f);
  return ones;
}

void group_pairs_by_expert(const Routing& routing, std::vector<int32_t>& order,
                           std::vector<std::vector<int32_t>>& pairs_of) {
  std::unordered_map<int32_t, size_t> slot;
  order.clear();
  pairs_of.clear();
  for (size_t p = 0; p < routing.ids.size(); ++p) {
    int32_t e = routing.ids[p];
    auto [it, inserted] = slot.try_emplace(e, order.size());
    if (inserted) {
      order.push_back(e);
      pairs_of.emplace_back();
    }
    pairs_of[it->second].push_back(static_cast<int32_t>(p));
  }
}

}  // namespace sluice
