// gemma4_text: Gemma 4's text model (Gemma4ForCausalLM). Per layer: pre-norm attention whose
// output is normed again before the residual add (sliding layers: window, default rope on
// head_dim; full layers: their own head_dim and kv heads (global_head_dim and
// num_global_key_value_heads, or per_layer_config), proportional
// rope, and with attention_k_eq_v the values are the keys' projection), per-head q/k norms with
// weights and a weightless v norm, attention scale 1; then the MLP (gelu_tanh gated) beside the
// MoE block (a router over the pre-MLP residual with its own norm, scale and per-expert scales;
// gelu_tanh experts on their own pre-norm), each normed, summed and normed again; then the
// per-layer input (PLE: a gated projection of the layer's slice of the per-layer embeddings)
// and the layer scalar. The last num_kv_shared_layers layers attend over the KV cache of the
// last earlier layer of their type and hold no k/v projections; use_double_wide_mlp doubles
// their MLP. Embeddings scaled by sqrt(hidden_size), tied output head, final logit softcap.
// The published checkpoints are multimodal (model_type gemma4): the text config in
// text_config, the weights under "model.language_model.", the vision and audio towers beside
// them (skipped; the family's towers).
//
// A model of its own (not the shared decoder): its layer differs from the decoder's at every
// step. forward_batch runs a decode step of several sequences as one pass over the batch's
// rows (the MoE block's experts as one union), attention per sequence.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/hybrid_weights.h"
#include "models/moe_layer.h"
#include "models/multimodal.h"
#include "models/ple.h"
#include "models/rope.h"

namespace sluice {
namespace {

using json = nlohmann::json;

// ---- 1. config ----
struct Gemma4Layer {
  bool sliding = false;
  int64_t head_dim = 0, n_kv = 0;
  int64_t kv_source = -1;   // a KV-shared layer: the layer whose cache it reads; -1: its own
  bool k_eq_v = false;      // the values are the keys' projection (full layers, attention_k_eq_v)
  int64_t n_ff = 0;         // MLP width (doubled on KV-shared layers with use_double_wide_mlp)
};

struct Gemma4Config {
  ModelInfo info;
  int64_t n_head = 0, sliding_window = 0;
  float eps = 1e-6f;
  RopeConfig rope_sliding, rope_full;
  std::vector<Gemma4Layer> layers;
  bool moe = false;
  RouterSpec router;
  int64_t moe_ff = 0;
  int64_t ple_dim = 0, ple_vocab = 0;  // per-layer inputs (0: none)
  std::optional<float> softcap;        // final_logit_softcapping
  bool tie_word_embeddings = true;
  std::string prefix = "model.";       // of the text model's weights ("model.language_model." multimodal)
};

Gemma4Config parse_config(const json& config) {
  const TextModelConfig tm = text_model_config(config, "gemma4_text");
  const json& j = tm.text;
  ConfigReader c(j, "gemma4_text");
  Gemma4Config cfg;
  if (tm.multimodal) cfg.prefix = "model.language_model.";
  if (auto it = j.find("hidden_activation"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) c.invalid(str("hidden_activation ", it->dump(), " is not supported (gelu_pytorch_tanh)"));
    if (*it != "gelu_pytorch_tanh")
      c.invalid(str("hidden_activation '", it->get<std::string>(), "' is not supported (gelu_pytorch_tanh)"));
  }
  // read_model_info checks hidden_act, which Gemma 4 does not use.
  json without_act = j;
  without_act.erase("hidden_act");
  ConfigReader base(without_act, "gemma4_text");
  cfg.info = read_model_info(base);
  const int64_t L = cfg.info.n_layer, d = cfg.info.n_embd;
  cfg.n_head = c.integer({"num_attention_heads"}, {}, 1, 4096);
  const int64_t n_kv = c.integer({"num_key_value_heads"}, cfg.n_head, 1, 4096);
  const int64_t head_dim = c.integer({"head_dim"}, d / cfg.n_head, 1, 4096);
  cfg.eps = static_cast<float>(c.number({"rms_norm_eps"}, 1e-6));
  cfg.sliding_window = c.integer({"sliding_window"}, 512, 1);
  if (c.boolean({"attention_bias"}, false)) c.invalid("attention_bias is true (not supported)");
  // "vision": image tokens attend both ways among themselves; text tokens stay causal.
  if (auto it = j.find("use_bidirectional_attention"); it != j.end() && !it->is_null() && *it != "vision")
    c.invalid(str("use_bidirectional_attention is ", it->dump(), " (the text model runs causal: null or \"vision\")"));
  if (auto it = j.find("final_logit_softcapping"); it != j.end() && !it->is_null()) {
    cfg.softcap = static_cast<float>(c.number({"final_logit_softcapping"}));
    if (!(*cfg.softcap > 0)) c.invalid("final_logit_softcapping must be positive");
  }
  cfg.tie_word_embeddings = c.boolean({"tie_word_embeddings"}, true);

  // Layer types (default: every sliding_window_pattern-th layer full, the others sliding; the
  // last layer full), per-layer overrides.
  const std::vector<std::string> types = c.layer_types(L, {"sliding_attention", "full_attention"});
  const int64_t pattern = c.integer({"sliding_window_pattern"}, 6, 1, 1 << 20);
  const json* per_layer = j.contains("per_layer_config") && j["per_layer_config"].is_object() ? &j["per_layer_config"] : nullptr;
  const bool k_eq_v = c.boolean({"attention_k_eq_v"}, false);
  const int64_t n_shared = c.integer({"num_kv_shared_layers"}, 0, 0, L - 1);
  const bool double_wide = c.boolean({"use_double_wide_mlp"}, false);
  const int64_t n_ff = c.integer({"intermediate_size"}, {}, 1, 1 << 24);
  // Full layers' heads as the published configs spell them (transformers saves them as
  // per_layer_config entries, which take precedence): global_head_dim, and
  // num_global_key_value_heads where the keys are the values (attention_k_eq_v).
  const int64_t global_head_dim = c.integer({"global_head_dim"}, head_dim, 1, 4096);
  const int64_t global_n_kv = k_eq_v ? c.integer({"num_global_key_value_heads"}, n_kv, 1, 4096) : n_kv;
  for (int64_t l = 0; l < L; ++l) {
    Gemma4Layer ly;
    std::string type = types.empty() ? ((l + 1) % pattern ? "sliding_attention" : "full_attention") : types[static_cast<size_t>(l)];
    if (l == L - 1) type = "full_attention";  // as transformers forces it
    ly.sliding = type == "sliding_attention";
    ly.head_dim = ly.sliding ? head_dim : global_head_dim;
    ly.n_kv = ly.sliding ? n_kv : global_n_kv;
    if (per_layer) {
      if (auto it = per_layer->find(std::to_string(l)); it != per_layer->end() && it->is_object()) {
        ConfigReader o(*it, "gemma4_text per_layer_config." + std::to_string(l));
        ly.head_dim = o.integer({"head_dim"}, head_dim, 1, 4096);
        ly.n_kv = o.integer({"num_key_value_heads"}, n_kv, 1, 4096);
      }
    }
    if (cfg.n_head % ly.n_kv != 0)
      c.invalid(str("layer ", l, ": num_attention_heads (", cfg.n_head, ") is not a multiple of its ", ly.n_kv,
                    " key/value heads"));
    ly.k_eq_v = k_eq_v && !ly.sliding;
    ly.n_ff = n_ff;
    cfg.layers.push_back(ly);
  }
  // KV sharing: layers from L - n_shared on read the cache of the last earlier layer of their
  // type (transformers' store_full_length_kv layer).
  const int64_t first_shared = L - n_shared;
  for (int64_t l = first_shared; n_shared > 0 && l < L; ++l) {
    Gemma4Layer& ly = cfg.layers[static_cast<size_t>(l)];
    for (int64_t s = first_shared - 1; s >= 0; --s)
      if (cfg.layers[static_cast<size_t>(s)].sliding == ly.sliding) {
        ly.kv_source = s;
        break;
      }
    if (ly.kv_source < 0) c.invalid(str("layer ", l, " shares the KV cache of an earlier layer of its type, and there is none"));
    const Gemma4Layer& src = cfg.layers[static_cast<size_t>(ly.kv_source)];
    if (src.head_dim != ly.head_dim || src.n_kv != ly.n_kv)
      c.invalid(str("layer ", l, " shares layer ", ly.kv_source, "'s KV cache, whose heads differ"));
    if (double_wide) ly.n_ff = 2 * n_ff;
  }
  // Rope per layer type: rope_parameters {"sliding_attention": {...}, "full_attention": {...}}.
  const json rp = j.value("rope_parameters", json::object());
  auto rope_of = [&](const char* type, int64_t hd, const json& fallback) {
    json one = {{"rope_parameters", rp.contains(type) && rp[type].is_object() ? rp[type] : fallback}};
    return rope_config_from_json(one, "gemma4_text", hd, cfg.info.n_ctx_train, 10000.0);
  };
  int64_t full_hd = head_dim;
  for (const Gemma4Layer& ly : cfg.layers)
    if (!ly.sliding) full_hd = ly.head_dim;
  cfg.rope_sliding = rope_of("sliding_attention", head_dim, json{{"rope_type", "default"}, {"rope_theta", 10000.0}});
  cfg.rope_full = rope_of("full_attention", full_hd,
                          json{{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1e6}});
  for (const Gemma4Layer& ly : cfg.layers)
    if (!ly.sliding && ly.head_dim != full_hd) c.invalid("full attention layers of different head sizes are not supported");
  // The MoE block beside every layer's MLP.
  cfg.moe = c.boolean({"enable_moe_block"}, false);
  if (cfg.moe) {
    cfg.router.n_expert = c.integer({"num_experts"}, {}, 1, 1 << 16);
    cfg.router.n_expert_used = c.integer({"top_k_experts"}, {}, 1, cfg.router.n_expert);
    cfg.router.norm_topk_prob = true;  // top-k of the softmax, renormalized
    cfg.moe_ff = c.integer({"moe_intermediate_size", "expert_intermediate_size"}, {}, 1, 1 << 24);
  }
  cfg.ple_dim = c.integer({"hidden_size_per_layer_input"}, 0, 0, 1 << 20);
  if (cfg.ple_dim > 0) cfg.ple_vocab = c.integer({"vocab_size_per_layer_input"}, cfg.info.n_vocab, 1, 1 << 24);
  return cfg;
}

// ---- 2. weights ----
struct Gemma4LayerWeights {
  Tensor input_norm, post_attn_norm, pre_ff_norm, post_ff_norm;  // [n_embd]
  Tensor q, k, v, o;                   // q [n_head hd, n_embd]; k, v [n_kv hd, n_embd] (own KV only; v
                                       // absent with k_eq_v); o [n_embd, n_head hd]
  Tensor q_norm, k_norm;               // [hd]
  ExpertWeights mlp;
  // MoE block
  Tensor post_ff_norm_1, post_ff_norm_2, pre_ff_norm_2;  // [n_embd]
  Tensor router_proj, router_scale;    // [n_expert, n_embd], [n_embd]
  std::vector<float> expert_scale;     // [n_expert] per_expert_scale (host)
  std::vector<ExpertWeights> experts;  // [n_expert], or empty (streamed)
  // PLE
  Tensor ple_gate, ple_proj, ple_norm;  // [ple, n_embd], [n_embd, ple], [n_embd]
  float layer_scalar = 1.0f;
};

struct Gemma4Weights {
  Tensor tok_embd, output, output_norm;      // [V, n_embd] (output: the embedding when tied), [n_embd]
  std::shared_ptr<NgramTable> ple_embd;            // [V_ple, L ple] rows (models/ple.h: a pack's read row by
                                                   // row, a checkpoint's from its host mapping; never uploaded)
  Tensor ple_model_proj, ple_proj_norm;            // [L ple, n_embd], [ple]
  std::vector<Gemma4LayerWeights> layers;
};

float scalar_of(const Tensor& host) { return host_values_f32(host)[0]; }

Gemma4Weights declare_weights(const Gemma4Config& cfg, WeightLoader& wl) {
  const int64_t d = cfg.info.n_embd, V = cfg.info.n_vocab, L = cfg.info.n_layer, E = cfg.router.n_expert;
  Gemma4Weights w;
  const std::string& m = cfg.prefix;
  w.tok_embd = wl.take_matrix(m + "embed_tokens.weight", {V, d});
  w.output_norm = wl.take(m + "norm.weight", {d});
  w.output = load_output_head(wl, "lm_head.weight", w.tok_embd, cfg.tie_word_embeddings, V, d);
  if (cfg.ple_dim > 0) {
    const std::string table = m + "embed_tokens_per_layer.";
    if ((w.ple_embd = wl.source().ngram_table(table))) {
      SLUICE_CHECK(w.ple_embd->n_rows() == cfg.ple_vocab && w.ple_embd->dim() == L * cfg.ple_dim, Status::corrupt,
                   wl.family(), ": the per-layer embedding table ", table, " is [", w.ple_embd->n_rows(), ", ",
                   w.ple_embd->dim(), "], expected [", cfg.ple_vocab, ", ", L * cfg.ple_dim, "]");
      wl.count_params(cfg.ple_vocab * L * cfg.ple_dim);
    } else {
      w.ple_embd = std::make_shared<ResidentNgramTable>(
          std::vector<Tensor>{wl.take_host(table + "weight", {cfg.ple_vocab, L * cfg.ple_dim})});
    }
    w.ple_model_proj = wl.take_matrix(m + "per_layer_model_projection.weight", {L * cfg.ple_dim, d});
    w.ple_proj_norm = wl.take(m + "per_layer_projection_norm.weight", {cfg.ple_dim});
  }
  for (int64_t l = 0; l < L; ++l) {
    const Gemma4Layer& ly = cfg.layers[static_cast<size_t>(l)];
    const std::string p = m + "layers." + std::to_string(l) + ".";
    Gemma4LayerWeights lw;
    lw.input_norm = wl.take(p + "input_layernorm.weight", {d});
    lw.post_attn_norm = wl.take(p + "post_attention_layernorm.weight", {d});
    lw.pre_ff_norm = wl.take(p + "pre_feedforward_layernorm.weight", {d});
    lw.post_ff_norm = wl.take(p + "post_feedforward_layernorm.weight", {d});
    const int64_t hd = ly.head_dim;
    lw.q = wl.take_matrix(p + "self_attn.q_proj.weight", {cfg.n_head * hd, d});
    lw.o = wl.take_matrix(p + "self_attn.o_proj.weight", {d, cfg.n_head * hd});
    lw.q_norm = wl.take(p + "self_attn.q_norm.weight", {hd});
    if (ly.kv_source < 0) {
      lw.k = wl.take_matrix(p + "self_attn.k_proj.weight", {ly.n_kv * hd, d});
      if (!ly.k_eq_v) lw.v = wl.take_matrix(p + "self_attn.v_proj.weight", {ly.n_kv * hd, d});
      lw.k_norm = wl.take(p + "self_attn.k_norm.weight", {hd});
    }
    lw.mlp = load_mlp(wl, p + "mlp.", d, ly.n_ff);
    if (cfg.moe) {
      lw.post_ff_norm_1 = wl.take(p + "post_feedforward_layernorm_1.weight", {d});
      lw.post_ff_norm_2 = wl.take(p + "post_feedforward_layernorm_2.weight", {d});
      lw.pre_ff_norm_2 = wl.take(p + "pre_feedforward_layernorm_2.weight", {d});
      lw.router_proj = wl.take_matrix(p + "router.proj.weight", {E, d});
      lw.router_scale = wl.take(p + "router.scale", {d});
      lw.expert_scale = host_values_f32(wl.take_host(p + "router.per_expert_scale", {E}));
      lw.experts = load_experts(wl, p + "experts.", E, d, cfg.moe_ff);
    }
    if (cfg.ple_dim > 0) {
      lw.ple_gate = wl.take_matrix(p + "per_layer_input_gate.weight", {cfg.ple_dim, d});
      lw.ple_proj = wl.take_matrix(p + "per_layer_projection.weight", {d, cfg.ple_dim});
      lw.ple_norm = wl.take(p + "post_per_layer_input_norm.weight", {d});
    }
    lw.layer_scalar = scalar_of(wl.take_host(p + "layer_scalar", {1}));
    w.layers.push_back(std::move(lw));
  }
  return w;
}

// ---- 3. forward ----
struct Gemma4State final : SequenceState {
  std::vector<KvLayer> kv;  // [n_layer]; empty for a KV-shared layer (it reads its source's)
};

class Gemma4Model final : public Model {
 public:
  Gemma4Model(Backend& be, Gemma4Config cfg, Gemma4Weights w) : be_(be), cfg_(std::move(cfg)), w_(std::move(w)) {
    info_ = cfg_.info;
    info_.n_expert = cfg_.router.n_expert;
    info_.n_expert_used = cfg_.router.n_expert_used;
    std::vector<bool> is_moe(static_cast<size_t>(cfg_.info.n_layer), cfg_.moe);
    index_moe_layers(is_moe, moe_index_, next_moe_);
    // The backend's tables over resident experts (null where it routes on the host: the CPU,
    // or CUDA with SLUICE_CUDA_HOST_ROUTED=1, core/router_scoring.h).
    for (const Gemma4LayerWeights& lw : w_.layers)
      expert_tables_.push_back(cfg_.moe && !lw.experts.empty()
                                   ? be_.make_expert_table(lw.experts, kExpertMath,
                                                           TableRouting{cfg_.router.scoring, lw.expert_scale})
                                   : nullptr);
  }

  std::unique_ptr<SequenceState> new_state(int64_t n_ctx) override {
    SLUICE_CHECK(n_ctx > 0, Status::invalid_argument, "context size must be positive");
    auto st = std::make_unique<Gemma4State>();
    st->n_ctx = n_ctx;
    for (const Gemma4Layer& ly : cfg_.layers) {
      if (ly.kv_source >= 0) {
        st->kv.emplace_back();
        continue;
      }
      st->kv.push_back({be_.alloc(be_.kv_dtype(), {n_ctx, ly.n_kv, ly.head_dim}),
                        be_.alloc(be_.kv_dtype(), {n_ctx, ly.n_kv, ly.head_dim})});
    }
    return st;
  }

  uint64_t context_bytes(int64_t n_ctx) const override {
    uint64_t per_token = 0;
    for (const Gemma4Layer& ly : cfg_.layers)
      if (ly.kv_source < 0) per_token += 2 * static_cast<uint64_t>(ly.n_kv * ly.head_dim) * dtype_size(be_.kv_dtype());
    return saturating_product(per_token, n_ctx);
  }

  bool decode_step_rerunnable() const override { return true; }  // KV caches only

  // Prompt caching: the state is its KV caches only.
  bool prefix_copyable() const override { return true; }
  void copy_prefix(const SequenceState& src, SequenceState& dst, int64_t from, int64_t n,
                   const StateSnapshot* at) override {
    check_prefix_copy(src, dst, from, n, at);
    const auto& s = static_cast<const Gemma4State&>(src);
    auto& d = static_cast<Gemma4State&>(dst);
    for (size_t l = 0; l < d.kv.size(); ++l) copy_kv_rows(be_, s.kv[l], d.kv[l], from, n);  // shared layers: empty
    d.n_past = n;
  }
  Backend* state_backend() override { return &be_; }
  std::vector<Tensor> prefix_tensors(const SequenceState& prefix) const override {
    std::vector<Tensor> out;
    for (const KvLayer& kv : static_cast<const Gemma4State&>(prefix).kv) {
      if (kv.k.empty()) continue;  // a KV-shared layer
      out.push_back(kv.k);
      out.push_back(kv.v);
    }
    return out;
  }

  void forward(std::span<const int32_t> tokens, SequenceState& state_base, std::span<float> logits,
               bool all_logits) override {
    auto& st = static_cast<Gemma4State&>(state_base);
    check_forward_inputs(tokens, st, logits, all_logits);
    const int64_t n = static_cast<int64_t>(tokens.size());
    const Segment seg{0, n, &st};
    const Rope rope{rope_tables_for(be_, cfg_.rope_sliding, st.n_past, n), rope_tables_for(be_, cfg_.rope_full, st.n_past, n)};
    Tensor x = run(tokens, std::span<const Segment>(&seg, 1), rope);
    st.n_past += n;
    finish(all_logits ? x : x.slice_rows(n - 1, 1), logits);
  }

  // One decode step of several sequences: every product over the batch's rows, the MoE block's
  // experts as one union, attention per sequence against its own cache.
  void forward_batch(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                     std::span<float> logits) override {
    check_batch_inputs(tokens, states, logits);
    const int64_t B = static_cast<int64_t>(tokens.size());
    DecodePhase decode(*this);
    std::vector<int64_t> positions;
    std::vector<Segment> segs;
    for (int64_t b = 0; b < B; ++b) {
      auto* st = static_cast<Gemma4State*>(states[static_cast<size_t>(b)]);
      positions.push_back(st->n_past);
      segs.push_back({b, 1, st});
    }
    const Rope rope{rope_tables_at(be_, cfg_.rope_sliding, positions), rope_tables_at(be_, cfg_.rope_full, positions)};
    Tensor x = run(tokens, segs, rope);
    for (SequenceState* s : states) s->n_past += 1;
    finish(x, logits);
  }

 private:
  // Rows [row0, row0 + n) of a forward's tokens: one sequence's, at its n_past onwards.
  struct Segment {
    int64_t row0 = 0, n = 0;
    Gemma4State* state = nullptr;
  };
  // The rotary tables of the forward's rows, per layer type.
  struct Rope {
    RopeTables sliding, full;
  };

  // The residual stream [n, n_embd] after every layer, for the tokens of `segs`.
  Tensor run(std::span<const int32_t> tokens, std::span<const Segment> segs, const Rope& rope) {
    const int64_t n = static_cast<int64_t>(tokens.size()), d = cfg_.info.n_embd;
    Tensor x = be_.alloc(DType::f32, {n, d});  // the residual stream
    be_.get_rows(w_.tok_embd, tokens, x);
    scale(x, std::sqrt(static_cast<float>(d)));
    const Tensor ple = per_layer_inputs(tokens, x);  // [n, L ple], or empty

    Tensor h = be_.alloc(DType::f32, {n, d}), y = be_.alloc(DType::f32, {n, d});
    for (size_t l = 0; l < cfg_.layers.size(); ++l) {
      const Gemma4Layer& ly = cfg_.layers[l];
      Gemma4LayerWeights& lw = w_.layers[l];
      // Attention: x += post_attention_norm(attention(input_norm(x))).
      be_.rms_norm(x, lw.input_norm, cfg_.eps, h);
      attention(l, h, segs, ly.sliding ? rope.sliding : rope.full, y);
      be_.rms_norm(y, lw.post_attn_norm, cfg_.eps, y);
      be_.add(x, y);
      // Feed-forward: x += post_ff_norm(post_ff_norm_1(mlp) + post_ff_norm_2(moe)).
      be_.rms_norm(x, lw.pre_ff_norm, cfg_.eps, h);
      expert_forward(be_, kExpertMath, lw.mlp, h, y);
      if (cfg_.moe) {
        be_.rms_norm(y, lw.post_ff_norm_1, cfg_.eps, y);
        Tensor m = be_.alloc(DType::f32, {n, d});
        moe(l, x, segs.front().state->n_past, m);
        be_.rms_norm(m, lw.post_ff_norm_2, cfg_.eps, m);
        be_.add(y, m);
      }
      be_.rms_norm(y, lw.post_ff_norm, cfg_.eps, y);
      be_.add(x, y);
      // Per-layer input: x += norm(proj(gelu(gate(x)) * ple_l)).
      if (cfg_.ple_dim > 0) {
        const int64_t pd = cfg_.ple_dim;
        Tensor g = be_.alloc(DType::f32, {n, pd}), pl = be_.alloc(DType::f32, {n, pd});
        be_.matmul(x, lw.ple_gate, g);
        be_.activate(g, Activation::gelu_tanh);
        be_.copy_cols(ple, static_cast<int64_t>(l) * pd, pl, 0, pd);
        be_.mul(g, pl);
        be_.matmul(g, lw.ple_proj, y);
        be_.rms_norm(y, lw.ple_norm, cfg_.eps, y);
        be_.add(x, y);
      }
      if (lw.layer_scalar != 1.0f) scale(x, lw.layer_scalar);
    }
    return x;
  }

  // The final norm, the (tied) output head and the softcap of the rows xs, to the host.
  void finish(const Tensor& xs, std::span<float> logits) {
    const int64_t d = cfg_.info.n_embd, V = cfg_.info.n_vocab;
    Tensor xn = be_.alloc(DType::f32, {xs.rows(), d});
    be_.rms_norm(xs, w_.output_norm, cfg_.eps, xn);
    Tensor out = be_.alloc(DType::f32, {xs.rows(), V});
    be_.matmul(xn, w_.output, out);
    if (cfg_.softcap) be_.activate(out, Activation::tanh, *cfg_.softcap, *cfg_.softcap);  // cap tanh(z / cap)
    be_.to_host(out, logits.data());
    if (expert_provider_) expert_provider_->forward_done();
  }

  // x *= s, every element (one rounding each).
  void scale(const Tensor& x, float s) {
    Tensor f = be_.alloc(DType::f32, {x.rows(), 1});
    be_.fill(f, s);
    be_.mul(x, f);
  }

  // PLE's per-layer inputs [n, L ple]: (norm(x_embd . proj^T / sqrt(n_embd)) + ple_embd(ids)
  // sqrt(ple)) / sqrt(2), the norm over each layer's ple values.
  Tensor per_layer_inputs(std::span<const int32_t> tokens, const Tensor& x) {
    if (cfg_.ple_dim == 0) return {};
    const int64_t n = x.rows(), L = cfg_.info.n_layer, pd = cfg_.ple_dim;
    for (int32_t t : tokens)
      SLUICE_CHECK(t < cfg_.ple_vocab, Status::invalid_argument, "token ", t, " is outside the per-layer embeddings' ",
                   cfg_.ple_vocab, " rows");
    Tensor tok = be_.alloc(DType::f32, {n, L * pd}), proj = be_.alloc(DType::f32, {n, L * pd});
    w_.ple_embd->gather(be_, std::vector<int64_t>(tokens.begin(), tokens.end()), tok);
    scale(tok, std::sqrt(static_cast<float>(pd)));
    be_.matmul(x, w_.ple_model_proj, proj);
    scale(proj, 1.0f / std::sqrt(static_cast<float>(cfg_.info.n_embd)));
    be_.rms_norm(proj.reshape({n * L, pd}), w_.ple_proj_norm, cfg_.eps, proj.reshape({n * L, pd}));
    be_.add(proj, tok);
    scale(proj, 1.0f / std::sqrt(2.0f));
    return proj;
  }

  // out [n, n_embd] = o . attention of layer l over h [n, n_embd] (scale 1), each segment's
  // rows against its own sequence's cache.
  void attention(size_t l, const Tensor& h, std::span<const Segment> segs, const RopeTables& rope, const Tensor& out) {
    const Gemma4Layer& ly = cfg_.layers[l];
    const Gemma4LayerWeights& lw = w_.layers[l];
    const int64_t n = h.rows(), nh = cfg_.n_head, hd = ly.head_dim, nkv = ly.n_kv;
    const RopeConfig& rc = ly.sliding ? cfg_.rope_sliding : cfg_.rope_full;
    const size_t cache_layer = static_cast<size_t>(ly.kv_source >= 0 ? ly.kv_source : static_cast<int64_t>(l));
    Tensor q = be_.alloc(DType::f32, {n, nh * hd});
    be_.matmul(h, lw.q, q);
    const Tensor q3 = q.reshape({n, nh, hd});
    Tensor k, v;
    if (ly.kv_source < 0) {
      k = be_.alloc(DType::f32, {n, nkv * hd});
      v = be_.alloc(DType::f32, {n, nkv * hd});
      be_.matmul(h, lw.k, k);
      if (ly.k_eq_v) be_.copy(k, v);  // the keys' projection, before the k norm
      else be_.matmul(h, lw.v, v);
      be_.rms_norm(v.reshape({n * nkv, hd}), Tensor{}, cfg_.eps, v.reshape({n * nkv, hd}));  // weightless
    } else {  // the keys and values are the source layer's, already in its cache
      be_.rms_norm(q.reshape({n * nh, hd}), lw.q_norm, cfg_.eps, q.reshape({n * nh, hd}));
      be_.rope(q3, rope.cos, rope.sin, rc.rot_dim, rc.interleaved);
    }
    Tensor att = be_.alloc(DType::f32, {n, nh, hd});
    for (const Segment& s : segs) {
      const KvLayer& kv = s.state->kv[cache_layer];
      const int64_t n_past = s.state->n_past;
      SLUICE_CHECK(n_past + s.n <= kv.k.shape[0], Status::invalid_argument, "context full: ", n_past + s.n,
                   " tokens exceed the context size ", kv.k.shape[0]);
      const Tensor qs = q3.slice_rows(s.row0, s.n);
      if (ly.kv_source < 0)
        be_.attention_inputs(qs, k.reshape({n, nkv, hd}).slice_rows(s.row0, s.n),
                             v.reshape({n, nkv, hd}).slice_rows(s.row0, s.n), lw.q_norm, lw.k_norm, cfg_.eps,
                             rope.cos.slice_rows(s.row0, s.n), rope.sin.slice_rows(s.row0, s.n), rc.rot_dim,
                             rc.interleaved, kv.k, kv.v, n_past, {});
      AttentionParams p;
      p.n_past = n_past;
      p.scale = 1.0f;
      p.sliding_window = ly.sliding ? cfg_.sliding_window : 0;
      be_.attention(qs, kv.k, kv.v, att.slice_rows(s.row0, s.n), p);
    }
    be_.matmul(att.reshape({n, nh * hd}), lw.o, out);
  }

  // out [n, n_embd] = the MoE block of layer l over the residual x [n, n_embd]: routed on x
  // (norm, * scale / sqrt(n_embd), proj, softmax top-k renormalized, * per_expert_scale), the
  // experts on pre_ff_norm_2(x).
  void moe(size_t l, const Tensor& x, int64_t first_position, const Tensor& out) {
    const Gemma4LayerWeights& lw = w_.layers[l];
    const int64_t n = x.rows(), d = cfg_.info.n_embd, E = cfg_.router.n_expert;
    Tensor r = be_.alloc(DType::f32, {n, d});
    be_.rms_norm(x, lw.router_scale, cfg_.eps, r);
    scale(r, 1.0f / std::sqrt(static_cast<float>(d)));
    Tensor logits = be_.alloc(DType::f32, {n, E});
    be_.matmul(r, lw.router_proj, logits);
    Tensor in = be_.alloc(DType::f32, {n, d});
    be_.rms_norm(x, lw.pre_ff_norm_2, cfg_.eps, in);
    // Lookahead predicts with the next layer's router projection over this layer's expert input
    // (its own router norms the residual with its own scale: a prediction, not the routing).
    const int64_t next = next_moe_[l];
    MoeLayerRefs refs{static_cast<int64_t>(l), moe_index_[l], first_position, &cfg_.router, lw.router_proj, Tensor{},
                      next >= 0 ? w_.layers[static_cast<size_t>(next)].router_proj : Tensor{}, Tensor{}, &lw.experts,
                      expert_tables_[l].get(), kExpertMath, forward_phase_, next, routing_predict_next_, logits,
                      lw.expert_scale, {}, {}, routing_replay_.get()};
    moe_routed_half(be_, refs, expert_provider_.get(), routing_observer_, in, out);
  }

  static constexpr ExpertMath kExpertMath{ExpertActivation::geglu_tanh};  // experts and MLP: gelu_tanh(gate) * up

  Backend& be_;
  Gemma4Config cfg_;
  Gemma4Weights w_;
  std::vector<int64_t> moe_index_, next_moe_;
  std::vector<std::unique_ptr<ExpertTable>> expert_tables_;  // [n_layer]
};

}  // namespace

std::unique_ptr<Model> load_gemma4(const json& j, WeightSource& source, Backend& backend) {
  Gemma4Config cfg = parse_config(j);
  WeightLoader wl(source, backend, "gemma4_text");
  if (cfg.prefix != "model.") skip_towers(wl, j);
  Gemma4Weights weights = declare_weights(cfg, wl);
  wl.finish();
  cfg.info.n_params = wl.n_params();
  return std::make_unique<Gemma4Model>(backend, std::move(cfg), std::move(weights));
}

}  // namespace sluice
