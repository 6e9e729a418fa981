// How a MoE router turns its logits into the chosen experts' weights. In core/ so that the
// backends (their device routing, Backend::make_expert_table) and the routing code
// (experts/routing.h) name it alike.
#pragma once

#include <cstdint>
#include <span>

namespace sluice {

enum class RouterScoring {
  softmax,  // the top-k of a softmax over all experts, their probabilities as weights
  sigmoid,  // the top-k of the logits, each weight the sigmoid of its logit (Llama 4)
  // Group-limited sigmoid routing (DeepSeek-V3, Kimi K2, GLM-4.5; MiniMax-M2 as one group):
  // scores s = sigmoid(logits); the choice on s + the layer's correction bias: the experts
  // in n_group equal groups, each group scored by the sum of its two best, the best topk_group
  // groups kept, the top k inside them; the weights are the chosen experts' s (not s + bias),
  // renormalized when norm_topk_prob (over their sum + norm_eps), times routed_scaling_factor.
  // core/router_group.h holds the arithmetic both backends share.
  sigmoid_grouped,
};

// The parameters of RouterScoring::sigmoid_grouped (the model's; the correction bias is each
// layer's own).
struct GroupedRouting {
  int64_t n_group = 1, topk_group = 1;  // groups of n_expert / n_group experts; groups kept
  float routed_scaling_factor = 1.0f;   // multiplies every chosen weight, after the renormalization
  float norm_eps = 0.0f;                // added to the chosen weights' sum before dividing by it
                                        // (DeepSeek-V3 and GLM-4.5: 1e-20; MiniMax-M2: none)
};

// What a device-side router does besides the top-k (Backend::make_expert_table).
struct TableRouting {
  RouterScoring scoring = RouterScoring::softmax;
  std::span<const float> expert_scale;  // [n_expert] multiplying each chosen expert's weight after
                                        // the top-k (Gemma 4's per_expert_scale), or empty
  GroupedRouting grouped = {};          // sigmoid_grouped: groups, scaling, normalization
  std::span<const float> score_bias = {};  // sigmoid_grouped: [n_expert] the layer's correction bias
                                        // (e_score_correction_bias), added for the choice only
  int64_t top_k = 0;                    // experts a token (RouterSpec::n_expert_used); 0: unknown
};

}  // namespace sluice
