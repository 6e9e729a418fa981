// Shared config parsing and validation.
#include "models/common_config.h"

#include <cmath>

namespace sluice {

namespace {

// hidden_act: absent (transformers' default for these families is silu), "silu", or "swish"
// (transformers' other name for the same function).
void check_hidden_act(const ConfigReader& c) {
  const auto it = c.json().find("hidden_act");
  if (it == c.json().end() || it->is_null()) return;
  if (!it->is_string()) c.invalid(str("hidden_act ", it->dump(), " is not supported (silu only)"));
  const std::string& act = it->get_ref<const std::string&>();
  if (act != "silu" && act != "swish") c.invalid(str("hidden_act '", act, "' is not supported (silu only)"));
}

}  // namespace

ModelInfo read_model_info(const ConfigReader& c) {
  check_hidden_act(c);
  ModelInfo info;
  info.family = c.family();
  info.n_embd = c.integer({"hidden_size"}, {}, 1, 1 << 20);
  info.n_vocab = c.integer({"vocab_size"}, {}, 1, 1 << 24);
  info.n_layer = c.integer({"num_hidden_layers"}, {}, 1, 4096);
  info.n_ctx_train = c.integer({"max_position_embeddings"}, 4096, 1, int64_t{1} << 31);
  auto id = [&](const char* name) -> std::optional<int32_t> {
    auto v = c.optional_id(name);
    if (v && *v >= 0 && *v < info.n_vocab) return static_cast<int32_t>(*v);
    return std::nullopt;  // absent or outside the vocabulary (some configs carry stale ids)
  };
  info.bos_id = id("bos_token_id");
  info.eos_id = id("eos_token_id");
  return info;
}

AttentionSpec read_attention_spec(const ConfigReader& c, QkNorm qk_norm) {
  AttentionSpec a;
  a.n_embd = c.integer({"hidden_size"}, {}, 1, 1 << 20);
  a.n_head = c.integer({"num_attention_heads"}, {}, 1, 4096);
  a.n_head_kv = c.integer({"num_key_value_heads"}, a.n_head, 1, 4096);
  if (a.n_head % a.n_head_kv != 0)
    c.invalid(str("num_attention_heads (", a.n_head, ") is not a multiple of num_key_value_heads (", a.n_head_kv, ")"));
  int64_t default_hd = a.n_embd / a.n_head;
  a.head_dim = c.integer({"head_dim"}, default_hd, 1, 4096);
  a.norm_eps = static_cast<float>(c.number({"rms_norm_eps"}, 1e-6));
  if (!(a.norm_eps > 0)) c.invalid("rms_norm_eps must be positive");
  a.scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  a.qk_norm = qk_norm;
  return a;
}

RouterSpec read_router_spec(const ConfigReader& c, bool norm_topk_default) {
  RouterSpec r;
  r.n_expert = c.integer({"num_experts", "num_local_experts", "n_routed_experts"}, {}, 1, 1 << 16);
  r.n_expert_used = c.integer({"num_experts_per_tok", "top_k", "moe_topk"}, {}, 1, 1 << 16);
  if (r.n_expert_used > r.n_expert)
    c.invalid(str("num_experts_per_tok (", r.n_expert_used, ") exceeds num_experts (", r.n_expert, ")"));
  r.norm_topk_prob = c.boolean({"norm_topk_prob"}, norm_topk_default);
  return r;
}

}  // namespace sluice
