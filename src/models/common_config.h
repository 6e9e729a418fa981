// Config fields every decoder family shares (hidden size, heads, vocabulary, norms, rope),
// read and validated once with messages that name the family and the field.
#pragma once

#include "models/blocks.h"
#include "models/config_reader.h"
#include "models/model.h"

namespace sluice {

// hidden_size, vocab_size, num_hidden_layers, max_position_embeddings, bos/eos ids; and
// hidden_act, which every family here reads through this: the shared blocks implement the
// SwiGLU MLP with SiLU only, so any other activation is refused, never silently replaced.
ModelInfo read_model_info(const ConfigReader& c);

// num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps.
AttentionSpec read_attention_spec(const ConfigReader& c, QkNorm qk_norm);

// num_experts (or num_local_experts), num_experts_per_tok, norm_topk_prob.
RouterSpec read_router_spec(const ConfigReader& c, bool norm_topk_default);

}  // namespace sluice
