// How a MoE router turns its logits into the chosen experts' weights. In core/ so that the
// backends (their device routing, Backend::make_expert_table) and the routing code
// (experts/routing.h) name it alike.
#pragma once

#include <span>

namespace sluice {

enum class RouterScoring {
  softmax,  // the top-k of a softmax over all experts, their probabilities as weights
  sigmoid,  // the top-k of the logits, each weight the sigmoid of its logit (Llama 4)
};

// What a device-side router does besides the top-k (Backend::make_expert_table).
struct TableRouting {
  RouterScoring scoring = RouterScoring::softmax;
  std::span<const float> expert_scale;  // [n_expert] multiplying each chosen expert's weight after
                                        // the top-k (Gemma 4's per_expert_scale), or empty
};

}  // namespace sluice
