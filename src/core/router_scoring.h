// How a MoE router turns its logits into the chosen experts' weights. In core/ so that the
// backends (their device routing, Backend::make_expert_table) and the routing code
// (experts/routing.h) name it alike.
#pragma once

namespace sluice {

enum class RouterScoring {
  softmax,  // the top-k of a softmax over all experts, their probabilities as weights
  sigmoid,  // the top-k of the logits, each weight the sigmoid of its logit (Llama 4)
};

}  // namespace sluice
