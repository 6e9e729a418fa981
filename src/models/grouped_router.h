// What DeepSeek-V3 (Kimi K2), GLM-4.5 and MiniMax-M2 share beside the decoder: the
// group-limited sigmoid router (RouterScoring::sigmoid_grouped: its config fields and each
// layer's correction bias), shared experts, and the multi-token-prediction layers their
// checkpoints carry after the last decoder layer.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "experts/routing.h"
#include "models/decoder.h"
#include "models/config_reader.h"
#include "models/weight_loader.h"

namespace sluice {

// transformers' defaults of a family's router fields.
struct GroupedRouterDefaults {
  int64_t n_expert = 0, n_expert_used = 0;  // n_routed_experts, num_experts_per_tok
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
};

// n_routed_experts (or num_local_experts), num_experts_per_tok, norm_topk_prob, n_group,
// topk_group, routed_scaling_factor, validated against each other: n_group divides the experts
// into groups of at least two (a group is scored by its two best), topk_group <= n_group, and
// the kept groups hold at least num_experts_per_tok experts. The renormalization adds 1e-20 to
// the sum, as transformers' DeepSeek-V3 and GLM-4.5 routers do.
RouterSpec read_grouped_router(const ConfigReader& c, const GroupedRouterDefaults& defaults);

// A layer's correction bias (e_score_correction_bias [n_expert]) as f32 on the backend, never
// rounded: a pack stores it in f32 whatever its dense dtype (WeightSource::note_exact), since
// rounding it would move the routing choice.
Tensor load_score_bias(WeightLoader& wl, const std::string& name, int64_t n_expert);

// The routed feed-forward of a DeepSeek-V3 / GLM-4.5 layer under prefix p ("model.layers.L."):
// the router mlp.gate [n_expert, n_embd] with its correction bias, the routed experts of width
// moe_ff, and n_shared shared experts (one MLP of width moe_ff * n_shared), into lw.
void load_grouped_moe(WeightLoader& wl, const std::string& p, int64_t n_expert, int64_t n_embd, int64_t moe_ff,
                      int64_t n_shared, DecoderLayerWeights& lw);

// Marks the multi-token-prediction layers of `config` (Family::mtp_prefixes) used, dense
// tensors and a pack's expert records alike, and says so once (-v). Returns the tensors skipped.
int64_t skip_mtp_layers(WeightLoader& wl, const nlohmann::json& config);

}  // namespace sluice
