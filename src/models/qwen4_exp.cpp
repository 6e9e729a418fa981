// qwen4_exp: Qwen4-Exp. The qwen3_5_moe hybrid (Gated DeltaNet + gated full attention, routed
// experts with a sigmoid-gated shared expert; 512 experts, top-10 in the real model) with:
//   - hyper-connections: hc_count residual streams, a gated residual (grouped RMSNorm, low-rank
//     input mixer, injection weights) around every block, a final mixer instead of the norm;
//   - QSA on the full-attention layers (indexer_* fields): each query attends to the top
//     indexer_budget / indexer_compress_ratio key blocks plus the uncompressed tail;
//   - PLE on the DeltaNet layers listed in ple_layer_ids (1-indexed): hashed n-gram embeddings
//     gated into every stream, with a dilated causal conv.
// Checkpoints are multimodal (Qwen4ExpForConditionalGeneration): the text model runs, the
// vision tower is skipped. Without indexer_* fields the attention layers run dense.
#include <algorithm>

#include "models/common_weights.h"
#include "models/hybrid_config.h"
#include "models/hybrid_weights.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct Qwen4ExpConfig {
  HybridSpec spec;
  std::vector<int64_t> ple_layer_ids;  // 1-indexed
  int64_t ngram_vocab_size_base = 0;
  int64_t make_ngram_vocab_size_divisible_by = 0;
  int64_t seed = 0;
};

Qwen4ExpConfig parse_config(const HybridCheckpoint& ck) {
  ConfigReader c(ck.text, "qwen4_exp");
  HybridCommon h = read_hybrid_common(c, ck, {"full_attention", "qwen_sparse_attention"});
  Qwen4ExpConfig cfg;
  HybridSpec& spec = cfg.spec;
  spec.info = h.info;
  spec.attn.attn = h.attn;
  spec.attn.bias = h.attention_bias;
  spec.rope = h.rope;
  spec.delta = h.delta;
  spec.norm_eps = h.attn.norm_eps;
  const std::string gate = c.string({"output_gate_type"}, c.string({"hidden_act"}, "silu"));
  if (gate != "silu" && gate != "sigmoid") c.invalid("output_gate_type '" + gate + "' is not silu or sigmoid");
  spec.delta.out_gate = gate == "silu" ? Activation::silu : Activation::sigmoid;

  spec.router = read_router_spec(c, true);
  const int64_t moe_intermediate_size = c.integer({"moe_intermediate_size"}, 512, 1, 1 << 24);
  spec.n_ff_shared = c.integer({"shared_expert_intermediate_size"}, 512, 1, 1 << 24);

  spec.hyper.n_stream = c.integer({"hc_count"}, 4, 1, 64);
  if (spec.hyper.n_stream < 2) c.invalid(str("hc_count (", spec.hyper.n_stream, ") must be at least 2"));
  spec.hyper.n_embd = h.info.n_embd;
  spec.hyper.lowrank = c.integer({"hc_lowrank"}, 320, 1, 1 << 20);
  spec.hyper.norm_eps = h.attn.norm_eps;

  // QSA: all five fields or none.
  const bool any_qsa = c.has({"indexer_n_heads"}) || c.has({"indexer_kv_heads"}) || c.has({"indexer_head_dim"}) ||
                       c.has({"indexer_budget"}) || c.has({"indexer_compress_ratio"});
  if (any_qsa) {
    QsaSpec q;
    q.n_embd = h.info.n_embd;
    q.n_head = c.integer({"indexer_n_heads"}, {}, 1, 4096);
    if (c.integer({"indexer_kv_heads"}, {}, 1, 4096) != 1) c.invalid("indexer_kv_heads must be 1 (one QSA key head)");
    q.head_dim = c.integer({"indexer_head_dim"}, {}, 1, 4096);
    q.budget = c.integer({"indexer_budget"}, {}, 1, int64_t{1} << 31);
    q.compress_ratio = c.integer({"indexer_compress_ratio"}, {}, 1, int64_t{1} << 20);
    q.norm_eps = h.attn.norm_eps;
    if (q.budget % q.compress_ratio != 0)
      c.invalid(str("indexer_budget (", q.budget, ") is not a multiple of indexer_compress_ratio (", q.compress_ratio,
                    ")"));
    if (h.rope.rot_dim > q.head_dim)
      c.invalid(str("the rotary dimension (", h.rope.rot_dim, ") exceeds indexer_head_dim (", q.head_dim, ")"));
    spec.attn.qsa = q;
  }

  // PLE.
  cfg.ple_layer_ids = c.integer_list({"ple_layer_ids"});
  std::sort(cfg.ple_layer_ids.begin(), cfg.ple_layer_ids.end());
  cfg.ple_layer_ids.erase(std::unique(cfg.ple_layer_ids.begin(), cfg.ple_layer_ids.end()), cfg.ple_layer_ids.end());
  PleSpec& p = spec.ple;
  p.n_embd = h.info.n_embd;
  p.n_stream = spec.hyper.n_stream;
  p.embed_dim = c.integer({"ple_embed_dim"}, h.info.n_embd, 1, 1 << 20);
  p.ngram_size = c.integer({"ngram_size"}, 3, 2, 64);
  p.heads_per_ngram = c.integer({"heads_per_ngram"}, 8, 1, 4096);
  p.conv_kernel = c.integer({"ple_conv_kernel_size"}, 4, 1, 64);
  p.norm_eps = h.attn.norm_eps;
  cfg.ngram_vocab_size_base = c.integer({"ngram_vocab_size_base"}, 20000000, 2, int64_t{1} << 40);
  cfg.make_ngram_vocab_size_divisible_by = c.integer({"make_ngram_vocab_size_divisible_by"}, 128, 1, 1 << 20);
  cfg.seed = c.integer({"seed"}, 1234, -(int64_t{1} << 62), int64_t{1} << 62);
  if (!cfg.ple_layer_ids.empty()) {
    if (p.embed_dim % p.n_heads() != 0)
      c.invalid(str("ple_embed_dim (", p.embed_dim, ") is not a multiple of the n-gram heads ((ngram_size - 1) * ",
                    "heads_per_ngram = ", p.n_heads(), ")"));
    for (int64_t id : cfg.ple_layer_ids) {
      if (id < 1 || id > h.info.n_layer) c.invalid(str("ple_layer_ids holds ", id, ", outside [1, num_hidden_layers]"));
      if (h.mixers[id - 1] != TokenMixer::delta_net)
        c.invalid(str("ple_layer_ids holds ", id, ", which is not a linear_attention layer (PLE needs one)"));
    }
    if (!h.info.eos_id) c.invalid("eos_token_id (in the vocabulary) is needed by the PLE layers");
    p.eos = *h.info.eos_id;
  }

  for (int64_t l = 0; l < h.info.n_layer; ++l) {
    const bool ple = std::find(cfg.ple_layer_ids.begin(), cfg.ple_layer_ids.end(), l + 1) != cfg.ple_layer_ids.end();
    spec.layers.push_back({h.mixers[l], true, moe_intermediate_size, ple});
  }
  return cfg;
}

// ---- 2. weights ----
HybridWeights declare_weights(const Qwen4ExpConfig& cfg, const HybridCheckpoint& ck, WeightLoader& wl) {
  const HybridSpec& spec = cfg.spec;
  HybridWeights w;
  load_embeddings(wl, ck, spec.info, w);
  w.output_hyper = load_hyper(wl, ck.prefix + "hyper_connection_mixer.", spec.hyper, false);
  const int64_t n_ple = static_cast<int64_t>(cfg.ple_layer_ids.size());
  const std::vector<int64_t> primes = primes_from(cfg.ngram_vocab_size_base, n_ple * spec.ple.n_heads());
  int64_t ple_index = 0;
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const HybridLayerSpec& ls = spec.layers[l];
    const std::string p = ck.prefix + "layers." + std::to_string(l) + ".";
    HybridLayerWeights lw;
    lw.attn_hyper = load_hyper(wl, p + "attn_hyper_connection.", spec.hyper, true);
    lw.ffn_hyper = load_hyper(wl, p + "mlp_hyper_connection.", spec.hyper, true);
    if (ls.mixer == TokenMixer::attention) lw.attn = load_gated_attention(wl, p + "self_attn.", spec.attn);
    else lw.delta = load_delta_net(wl, p + "linear_attn.", spec.delta);
    load_moe_with_shared(wl, p + "mlp.", spec, ls.n_ff, lw);
    if (ls.ple) {
      NgramHash hash = ngram_hash(spec.ple, spec.info.n_vocab, cfg.seed, ple_index++, primes,
                                  cfg.make_ngram_vocab_size_divisible_by);
      lw.ple = load_ple(wl, p + "ple.", spec.ple, std::move(hash));
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared hybrid decoder ----
std::unique_ptr<Model> load_qwen4_exp(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  HybridCheckpoint ck = hybrid_checkpoint(j, "qwen4_exp");
  Qwen4ExpConfig cfg = parse_config(ck);
  WeightLoader wl(source, backend, "qwen4_exp");
  skip_unused_parts(wl, j, ck);
  HybridWeights weights = declare_weights(cfg, ck, wl);
  wl.finish();
  cfg.spec.info.n_params = wl.n_params();
  return std::make_unique<HybridModel>(backend, std::move(cfg.spec), std::move(weights));
}

}  // namespace sluice
