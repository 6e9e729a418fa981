// How a MoE router turns its logits into the chosen experts' weights. In core/ so that the
// backends (their device routing, Backend::make_expert_table) and the routing code
// (experts/routing.h) name it alike.
#pragma once

#include <cstdlib>
#include <cstring>
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

// SLUICE_CUDA_HOST_ROUTED=1: the CUDA backend and streamer route the experts the device
// kernels compute only since 2026-12-05 (gpt-oss's biased clamped SwiGLU and MXFP4, Gemma 4's
// GeGLU with per-expert scales, Llama 4's sigmoid routing with scaled inputs) on the host, as
// before, and compute them with the generic ops: to compare, and so that the GPU tests keep
// that path covered. Read at every call.
inline bool host_routing_forced() {
  const char* e = std::getenv("SLUICE_CUDA_HOST_ROUTED");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

}  // namespace sluice
