// The math of one routed expert, described by data (ExpertMath, core/expert_weights.h) so
// that the streamers (experts/streamer.h, experts/cuda/) compute what the family asks for
// without including model code: SwiGLU (most families) or gpt-oss's clamped SwiGLU, each with
// the biases the weights carry. A family whose experts differ again (Llama 4's input scaling)
// adds its fields to ExpertMath and its case to expert_forward, and every streamer follows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backends/backend.h"
#include "core/expert_weights.h"
#include "experts/routing.h"

namespace sluice {

// out[n, n_embd] = silu(h W_gate^T) * (h W_up^T) W_down^T (also the dense SwiGLU MLP).
void swiglu_mlp(Backend& be, const ExpertWeights& w, const Tensor& h, const Tensor& out);

// out[n, n_embd] = the expert `w` applied to h[n, n_embd] as `math` says.
void expert_forward(Backend& be, const ExpertMath& math, const ExpertWeights& w, const Tensor& h, const Tensor& out);

// One expert over the pairs routed to it: expert_out[p, :] = expert(h[p / k, :]) for each pair
// index p (row * k + rank) of `pairs` (with math.scale_input: expert(weights[p] h[p / k, :]);
// weights [n_rows * k], the routing's). expert_out [n_rows * k, n_embd] f32.
void expert_pairs_forward(Backend& be, const ExpertMath& math, const ExpertWeights& w, const Tensor& h,
                          std::span<const int32_t> pairs, int64_t k, std::span<const float> weights,
                          const Tensor& expert_out);

// The weights moe_combine applies to the pairs' outputs: the routing's, or all 1 when the
// weights scaled the experts' inputs (math.scale_input). `ones` holds them when it must.
std::span<const float> combine_weights(const ExpertMath& math, std::span<const float> weights, std::vector<float>& ones);

// Groups (row, rank) pairs by expert in first-seen order: order[i] is an expert id, and
// pairs_of[i] its pair indices (row * k + rank).
void group_pairs_by_expert(const Routing& routing, std::vector<int32_t>& order,
                           std::vector<std::vector<int32_t>>& pairs_of);

// Routed experts for n rows of h: every (row, rank) pair is computed by its expert, grouped
// by expert in first-seen order, then combined per row in rank order (Backend::moe_combine),
// so the result does not depend on grouping or order. expert(e) returns the weights of
// expert e.
template <typename ExpertLookup>
void routed_experts(Backend& be, const ExpertMath& math, const Routing& routing, const Tensor& h, const Tensor& out,
                    ExpertLookup&& expert) {
  const int64_t n = routing.n_rows, k = routing.k, d = h.cols();
  std::vector<int32_t> order;
  std::vector<std::vector<int32_t>> pairs_of;
  group_pairs_by_expert(routing, order, pairs_of);
  Tensor expert_out = be.alloc(DType::f32, {n * k, d});  // [n*k, n_embd], row = pair
  for (size_t i = 0; i < order.size(); ++i)
    expert_pairs_forward(be, math, expert(order[i]), h, pairs_of[i], k, routing.weights, expert_out);
  std::vector<float> ones;
  be.moe_combine(expert_out, combine_weights(math, routing.weights, ones), k, out);
}

}  // namespace sluice
