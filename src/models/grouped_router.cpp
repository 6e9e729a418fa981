// The giant families' router, correction bias and MTP layers (grouped_router.h).
#include "models/grouped_router.h"

#include <vector>

#include "core/dtype.h"
#include "core/log.h"
#include "models/common_weights.h"
#include "models/hybrid_weights.h"
#include "models/registry.h"

namespace sluice {

RouterSpec read_grouped_router(const ConfigReader& c, const GroupedRouterDefaults& d) {
  RouterSpec r;
  r.scoring = RouterScoring::sigmoid_grouped;
  r.n_expert = c.integer({"n_routed_experts", "num_local_experts", "num_experts"}, d.n_expert, 1, 1 << 16);
  r.n_expert_used = c.integer({"num_experts_per_tok"}, d.n_expert_used, 1, 1 << 16);
  if (r.n_expert_used > r.n_expert)
    c.invalid(str("num_experts_per_tok (", r.n_expert_used, ") exceeds n_routed_experts (", r.n_expert, ")"));
  r.norm_topk_prob = c.boolean({"norm_topk_prob"}, d.norm_topk_prob);
  GroupedRouting& g = r.grouped;
  g.n_group = c.integer({"n_group"}, d.n_group, 1, 1 << 16);
  g.topk_group = c.integer({"topk_group"}, d.topk_group, 1, 1 << 16);
  if (r.n_expert % g.n_group != 0)
    c.invalid(str("n_routed_experts (", r.n_expert, ") is not a multiple of n_group (", g.n_group, ")"));
  if (r.n_expert / g.n_group < 2)
    c.invalid(str("n_group (", g.n_group, ") leaves fewer than 2 experts a group (", r.n_expert,
                  " experts; a group is scored by its two best)"));
  if (g.topk_group > g.n_group) c.invalid(str("topk_group (", g.topk_group, ") exceeds n_group (", g.n_group, ")"));
  if (r.n_expert_used > g.topk_group * (r.n_expert / g.n_group))
    c.invalid(str("num_experts_per_tok (", r.n_expert_used, ") exceeds the ", g.topk_group * (r.n_expert / g.n_group),
                  " experts of the topk_group (", g.topk_group, ") groups kept"));
  const double scale = c.number({"routed_scaling_factor"}, d.routed_scaling_factor);
  if (!(scale > 0) || scale > 1e6) c.invalid(str("routed_scaling_factor (", scale, ") must be positive"));
  g.routed_scaling_factor = static_cast<float>(scale);
  g.norm_eps = 1e-20f;
  return r;
}

Tensor load_score_bias(WeightLoader& wl, const std::string& name, int64_t n_expert) {
  wl.source().note_exact(name);
  const Tensor stored = wl.take_host(name, {n_expert});
  Tensor f32 = host_tensor(DType::f32, {n_expert});
  dtype_row_to_f32(stored.data, stored.dtype, n_expert, f32.ptr<float>());
  return wl.backend().upload(f32);
}

void load_grouped_moe(WeightLoader& wl, const std::string& p, int64_t n_expert, int64_t n_embd, int64_t moe_ff,
                      int64_t n_shared, DecoderLayerWeights& lw) {
  lw.router = wl.take_matrix(p + "mlp.gate.weight", {n_expert, n_embd});
  lw.router_score_bias = load_score_bias(wl, p + "mlp.gate.e_score_correction_bias", n_expert);
  lw.experts = load_experts(wl, p + "mlp.experts.", n_expert, n_embd, moe_ff);
  if (n_shared > 0) lw.shared = load_mlp(wl, p + "mlp.shared_experts.", n_embd, moe_ff * n_shared);
}

int64_t skip_mtp_layers(WeightLoader& wl, const nlohmann::json& config) {
  const std::vector<std::string> prefixes = find_family(config).mtp_prefixes(config);
  int64_t n = 0;
  std::string which;
  for (const std::string& p : prefixes) {
    int64_t here = 0;
    for (const std::string& name : wl.source().names())
      if (name.rfind(p, 0) == 0) {
        wl.source().consume(name);
        ++here;
      }
    if (const Pack* pack = wl.source().pack(); pack && pack->moe_layer_of_prefix(p + "mlp.experts.") >= 0)
      wl.source().consume(p + "mlp.experts.");
    if (here) which += (which.empty() ? "" : ", ") + p + "*";
    n += here;
  }
  if (n > 0)
    LOG_INFO(wl.family(), ": skipping the multi-token-prediction layer", prefixes.size() > 1 ? "s " : " ", which, " (", n,
             " tensors): decoding does not use it");
  return n;
}

}  // namespace sluice
