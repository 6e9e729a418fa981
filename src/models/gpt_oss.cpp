// gpt_oss: OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b). Grouped-query attention with biases
// and a learned sink per head (a logit in each head's softmax denominator that takes no
// value), layers alternating sliding-window and full attention (layer_types), YaRN rotary
// (with or without truncate); a router with a bias whose top-k logits are softmaxed over the
// chosen k (= the renormalized top-k of the full softmax); experts with biases and the clamped
// SwiGLU (ExpertActivation::swiglu_clamped), gate and up interleaved in the checkpoint, as bf16
// or as MXFP4 blocks (kept bit for bit as the mxfp4 kind); RMSNorm; untied output head.
#include <cstring>
#include <tuple>

#include "core/quant.h"
#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/decoder.h"
#include "models/hybrid_weights.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct GptOssConfig {
  ModelInfo info;
  AttentionSpec attn;
  RopeConfig rope;
  RouterSpec router;
  int64_t intermediate_size = 0;             // expert width
  std::vector<int64_t> layer_window;         // [n_layer] sliding window of each layer (0: full attention)
  bool attention_bias = true;
  ExpertMath math{ExpertActivation::swiglu_clamped};
};

GptOssConfig parse_config(const nlohmann::json& j) {
  ConfigReader c(j, "gpt_oss");
  GptOssConfig cfg;
  cfg.info = read_model_info(c);
  cfg.attn = read_attention_spec(c, QkNorm::none);
  cfg.router = read_router_spec(c, true);
  // torch.topk over the logits, then a softmax over those k: the chosen experts of the full
  // softmax, renormalized (the same order; the same weights up to rounding).
  cfg.router.norm_topk_prob = true;
  cfg.intermediate_size = c.integer({"intermediate_size"}, {}, 1, 1 << 24);
  cfg.attention_bias = c.boolean({"attention_bias"}, true);
  if (c.boolean({"tie_word_embeddings"}, false)) c.invalid("tie_word_embeddings is true (gpt-oss has an untied head)");
  // transformers 5.17 fixes alpha and the limit in GptOssExperts; later configs carry them.
  cfg.math.alpha = static_cast<float>(c.number({"swiglu_alpha"}, 1.702));
  cfg.math.limit = static_cast<float>(c.number({"swiglu_limit"}, 7.0));
  if (!(cfg.math.limit > 0)) c.invalid("swiglu_limit must be positive");
  const int64_t window = c.has({"sliding_window"}) ? c.integer({"sliding_window"}, 0, 0) : 128;
  // layer_types, by default sliding on even layers (0, 2, ...) and full on odd ones.
  const std::vector<std::string> types = c.layer_types(cfg.info.n_layer, {"sliding_attention", "full_attention"});
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const std::string type = types.empty() ? (l % 2 == 0 ? "sliding_attention" : "full_attention")
                                           : types[static_cast<size_t>(l)];
    cfg.layer_window.push_back(type == "sliding_attention" ? window : 0);
  }
  // Without rope settings transformers gives gpt-oss its YaRN defaults (GptOssConfig).
  nlohmann::json rj = j;
  if (!rj.contains("rope_parameters") && !rj.contains("rope_scaling"))
    rj["rope_parameters"] = {{"rope_type", "yarn"},     {"factor", 32.0},    {"beta_fast", 32.0},
                             {"beta_slow", 1.0},        {"truncate", false}, {"original_max_position_embeddings", 4096},
                             {"rope_theta", rj.value("rope_theta", 150000.0)}};
  cfg.rope = rope_config_from_json(rj, "gpt_oss", cfg.attn.head_dim, cfg.info.n_ctx_train, 150000.0);
  return cfg;
}

// ---- 2. weights ----

// The routed experts of one layer as a checkpoint stores them (a pack's records go through
// load_experts): gate_up_proj [E, n_embd, 2 n_ff] with gate and up interleaved by column and
// down_proj [E, n_ff, n_embd] (inputs first), or the same as MXFP4 rows (*_blocks [E, out,
// in / 32, 16], *_scales [E, out, in / 32], gate and up interleaved by row); biases
// gate_up_proj_bias [E, 2 n_ff] (interleaved) and down_proj_bias [E, n_embd]. Each expert
// becomes gate / up [n_ff, n_embd] and down [n_embd, n_ff] in the stored dtype (mxfp4 bytes
// copied unchanged) and f32 biases.
std::vector<ExpertWeights> load_gpt_oss_experts(WeightLoader& wl, const std::string& p, int64_t E, int64_t d,
                                                int64_t ff) {
  if (wl.source().pack()) return load_experts(wl, p, E, d, ff);
  Backend& be = wl.backend();
  // A dry run (values_needed false): tensors of the right shapes over the stored bytes, not
  // transformed (a real gpt-oss-120b would otherwise be read and copied whole).
  const bool dry = !wl.source().values_needed();
  std::vector<ExpertWeights> experts(static_cast<size_t>(E));
  const std::vector<float> gu_bias = host_values_f32(wl.take_host(p + "gate_up_proj_bias", {E, 2 * ff}));
  const std::vector<float> dn_bias = host_values_f32(wl.take_host(p + "down_proj_bias", {E, d}));
  for (int64_t e = 0; e < E; ++e) {
    Tensor gb = host_tensor(DType::f32, {ff}), ub = host_tensor(DType::f32, {ff}), db = host_tensor(DType::f32, {d});
    for (int64_t f = 0; f < ff; ++f) {
      gb.ptr<float>()[f] = gu_bias[static_cast<size_t>(e * 2 * ff + 2 * f)];
      ub.ptr<float>()[f] = gu_bias[static_cast<size_t>(e * 2 * ff + 2 * f + 1)];
    }
    std::memcpy(db.data, dn_bias.data() + e * d, static_cast<size_t>(d) * sizeof(float));
    ExpertWeights& w = experts[static_cast<size_t>(e)];
    w.gate_bias = be.upload(gb);
    w.up_bias = be.upload(ub);
    w.down_bias = be.upload(db);
  }
  if (wl.has(p + "gate_up_proj_blocks")) {  // MXFP4 as it ships
    SLUICE_CHECK(d % 32 == 0 && ff % 32 == 0, Status::corrupt, "gpt_oss: MXFP4 experts need hidden_size (", d,
                 ") and intermediate_size (", ff, ") to be multiples of 32");
    const int64_t rb_gu = quant_row_bytes(DType::mxfp4, d), sb_gu = quant_scale_row_bytes(DType::mxfp4, d);
    const int64_t rb_dn = quant_row_bytes(DType::mxfp4, ff), sb_dn = quant_scale_row_bytes(DType::mxfp4, ff);
    Tensor gu = wl.take_host_raw(p + "gate_up_proj_blocks", DType::u8, {E, 2 * ff, d / 32, 16});
    Tensor gu_s = wl.take_host_raw(p + "gate_up_proj_scales", DType::u8, {E, 2 * ff, d / 32});
    Tensor dn = wl.take_host_raw(p + "down_proj_blocks", DType::u8, {E, d, ff / 32, 16});
    Tensor dn_s = wl.take_host_raw(p + "down_proj_scales", DType::u8, {E, d, ff / 32});
    wl.count_params(E * 3 * ff * d);
    // Rows [row0, row0 + step * rows) of a blocks / scales pair, every step-th, as an mxfp4
    // tensor [rows, cols] of its own (the bytes copied unchanged).
    auto rows_of = [&](const Tensor& blocks, const Tensor& scales, int64_t row0, int64_t step, int64_t rows,
                       int64_t cols, int64_t rb, int64_t sb) {
      Tensor t = host_tensor(DType::u8, {rows * (rb + sb)});  // values, then scales, one allocation
      t.dtype = DType::mxfp4;
      t.shape = {rows, cols, 0, 0};
      t.ndim = 2;
      t.scales = static_cast<uint8_t*>(t.data) + rows * rb;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t src = row0 + step * r;
        std::memcpy(static_cast<uint8_t*>(t.data) + r * rb, blocks.ptr<uint8_t>() + src * rb, static_cast<size_t>(rb));
        std::memcpy(static_cast<uint8_t*>(t.scales) + r * sb, scales.ptr<uint8_t>() + src * sb, static_cast<size_t>(sb));
      }
      return be.upload(t);
    };
    for (int64_t e = 0; e < E; ++e) {
      ExpertWeights& w = experts[static_cast<size_t>(e)];
      if (dry) {
        for (auto [t, b, s, rows, cols] : {std::tuple{&w.gate, &gu, &gu_s, ff, d}, {&w.up, &gu, &gu_s, ff, d},
                                           {&w.down, &dn, &dn_s, d, ff}}) {
          *t = Tensor(DType::mxfp4, {rows, cols}, b->data, b->storage);
          t->scales = s->data;
        }
        continue;
      }
      w.gate = rows_of(gu, gu_s, e * 2 * ff, 2, ff, d, rb_gu, sb_gu);
      w.up = rows_of(gu, gu_s, e * 2 * ff + 1, 2, ff, d, rb_gu, sb_gu);
      w.down = rows_of(dn, dn_s, e * d, 1, d, ff, rb_dn, sb_dn);
    }
    return experts;
  }
  // Float: gate_up [E, n_embd, 2 n_ff] (interleaved columns), down [E, n_ff, n_embd].
  std::vector<ExpertWeights> mats = load_experts_inputs_first(wl, p, E, d, ff, /*interleaved=*/true);
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights& w = experts[static_cast<size_t>(e)];
    const ExpertWeights& m = mats[static_cast<size_t>(e)];
    w.gate = m.gate;
    w.up = m.up;
    w.down = m.down;
  }
  return experts;
}

DecoderWeights declare_weights(const GptOssConfig& cfg, WeightLoader& wl) {
  const int64_t d = cfg.info.n_embd, V = cfg.info.n_vocab, E = cfg.router.n_expert;
  DecoderWeights w;
  w.tok_embd = wl.take_matrix("model.embed_tokens.weight", {V, d});
  w.output_norm = wl.take("model.norm.weight", {d});
  w.output = wl.take_matrix("lm_head.weight", {V, d});
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DecoderLayerWeights lw;
    lw.attn_norm = wl.take(p + "input_layernorm.weight", {d});
    lw.attn = load_attention(wl, p + "self_attn.", cfg.attn, cfg.attention_bias);
    lw.attn.sinks = take_f32(wl, p + "self_attn.sinks", {cfg.attn.n_head});  // f32: what the CUDA kernels read
    lw.ffn_norm = wl.take(p + "post_attention_layernorm.weight", {d});
    lw.router = wl.take_matrix(p + "mlp.router.weight", {E, d});
    lw.router_bias = wl.take(p + "mlp.router.bias", {E});
    lw.experts = load_gpt_oss_experts(wl, p + "mlp.experts.", E, d, cfg.intermediate_size);
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared decoder ----
std::unique_ptr<Model> load_gpt_oss(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  GptOssConfig cfg = parse_config(j);
  WeightLoader wl(source, backend, "gpt_oss");
  DecoderWeights weights = declare_weights(cfg, wl);
  wl.finish();
  DecoderSpec spec{cfg.info, cfg.attn, cfg.rope, cfg.router, cfg.attn.norm_eps, {}, cfg.math};
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    AttentionSpec attn = cfg.attn;
    attn.sliding_window = cfg.layer_window[static_cast<size_t>(l)];
    spec.layers.push_back({true, cfg.intermediate_size, attn});
  }
  spec.info.n_params = wl.n_params();
  return std::make_unique<DecoderModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
