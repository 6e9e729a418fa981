// The models `sluice synth --like` knows, as config.json objects, and the config shrinking of
// --layers / --experts. Real models carry their published config; tiny ones exist so tests
// run synth end to end in well under a second.
#include <algorithm>

#include "convert/synth.h"
#include "core/error.h"

namespace sluice {

namespace {

using json = nlohmann::json;

// Qwen3-30B-A3B's config.json as published (Qwen/Qwen3-30B-A3B): 48 layers, all MoE, 128
// experts of width 768, top-8, per-head q/k RMSNorm, rope theta 1e6.
json qwen3_30b_a3b() {
  return json{{"architectures", {"Qwen3MoeForCausalLM"}},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"decoder_sparse_step", 1},
              {"eos_token_id", 151645},
              {"head_dim", 128},
              {"hidden_act", "silu"},
              {"hidden_size", 2048},
              {"initializer_range", 0.02},
              {"intermediate_size", 6144},
              {"max_position_embeddings", 40960},
              {"max_window_layers", 48},
              {"mlp_only_layers", json::array()},
              {"model_type", "qwen3_moe"},
              {"moe_intermediate_size", 768},
              {"norm_topk_prob", true},
              {"num_attention_heads", 32},
              {"num_experts", 128},
              {"num_experts_per_tok", 8},
              {"num_hidden_layers", 48},
              {"num_key_value_heads", 4},
              {"output_router_logits", false},
              {"rms_norm_eps", 1e-6},
              {"rope_scaling", nullptr},
              {"rope_theta", 1000000.0},
              {"router_aux_loss_coef", 0.001},
              {"sliding_window", nullptr},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"use_cache", true},
              {"use_sliding_window", false},
              {"vocab_size", 151936}};
}

// gpt-oss's config.json as published (openai/gpt-oss-120b with layers and experts as given;
// openai/gpt-oss-20b: 24 layers, 32 experts): hidden 2880, 64 query heads of 64 over 8 kv
// heads, sliding window 128 on even layers, YaRN x32 from 4096, 4 experts a token of width
// 2880, the clamped SwiGLU at 7. The checkpoints' quantization_config (MXFP4 experts) is left
// out: a synthetic pack's experts are whatever --kinds says (mxfp4 for the real layout).
json gpt_oss(int64_t n_layer, int64_t n_expert) {
  json types = json::array();
  for (int64_t l = 0; l < n_layer; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  return json{{"architectures", {"GptOssForCausalLM"}},
              {"attention_bias", true},
              {"attention_dropout", 0.0},
              {"eos_token_id", 200002},
              {"head_dim", 64},
              {"hidden_act", "silu"},
              {"hidden_size", 2880},
              {"initializer_range", 0.02},
              {"intermediate_size", 2880},
              {"layer_types", types},
              {"max_position_embeddings", 131072},
              {"model_type", "gpt_oss"},
              {"num_attention_heads", 64},
              {"num_experts_per_tok", 4},
              {"num_hidden_layers", n_layer},
              {"num_key_value_heads", 8},
              {"num_local_experts", n_expert},
              {"output_router_logits", false},
              {"pad_token_id", 199999},
              {"rms_norm_eps", 1e-5},
              {"rope_scaling",
               {{"beta_fast", 32.0},
                {"beta_slow", 1.0},
                {"factor", 32.0},
                {"original_max_position_embeddings", 4096},
                {"rope_type", "yarn"},
                {"truncate", false}}},
              {"rope_theta", 150000},
              {"router_aux_loss_coef", 0.9},
              {"sliding_window", 128},
              {"swiglu_limit", 7.0},
              {"tie_word_embeddings", false},
              {"use_cache", true},
              {"vocab_size", 201088}};
}

json gpt_oss_120b() { return gpt_oss(36, 128); }
json gpt_oss_20b() { return gpt_oss(24, 32); }

// A tiny gpt-oss for tests: 3 layers (sliding, full, sliding; window 4), 8 experts of [64, 64], top-2.
json tiny_gpt_oss() {
  json c = gpt_oss(3, 8);
  c.update(json{{"vocab_size", 512},
                {"hidden_size", 64},
                {"intermediate_size", 64},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 16},
                {"num_experts_per_tok", 2},
                {"sliding_window", 4},
                {"max_position_embeddings", 512},
                {"eos_token_id", nullptr},
                {"pad_token_id", nullptr}});
  return c;
}

// Llama 4 Scout's text model as published (meta-llama/Llama-4-Scout-17B-16E-Instruct,
// text_config): 48 layers, all MoE, 16 experts of [8192, 5120] top-1 plus a shared expert,
// every 4th layer NoPE, chunked attention of 8192 on the others, llama3 rope x16 from 8192.
json llama4_scout_text() {
  json no_rope = json::array();
  for (int l = 0; l < 48; ++l) no_rope.push_back((l + 1) % 4 != 0 ? 1 : 0);
  json moe = json::array();
  for (int l = 0; l < 48; ++l) moe.push_back(l);
  return json{{"model_type", "llama4_text"},
              {"attention_bias", false},
              {"attention_chunk_size", 8192},
              {"attention_dropout", 0.0},
              {"attn_scale", 0.1},
              {"attn_temperature_tuning", 4},
              {"bos_token_id", 200000},
              {"eos_token_id", {200001, 200007, 200008}},
              {"floor_scale", 8192},
              {"head_dim", 128},
              {"hidden_act", "silu"},
              {"hidden_size", 5120},
              {"initializer_range", 0.02},
              {"interleave_moe_layer_step", 1},
              {"intermediate_size", 8192},
              {"intermediate_size_mlp", 16384},
              {"max_position_embeddings", 10485760},
              {"moe_layers", moe},
              {"no_rope_layers", no_rope},
              {"num_attention_heads", 40},
              {"num_experts_per_tok", 1},
              {"num_hidden_layers", 48},
              {"num_key_value_heads", 8},
              {"num_local_experts", 16},
              {"pad_token_id", 200018},
              {"rms_norm_eps", 1e-5},
              {"rope_scaling",
               {{"factor", 16.0},
                {"high_freq_factor", 1.0},
                {"low_freq_factor", 1.0},
                {"original_max_position_embeddings", 8192},
                {"rope_type", "llama3"}}},
              {"rope_theta", 500000.0},
              {"tie_word_embeddings", false},
              {"use_qk_norm", true},
              {"vocab_size", 202048}};
}

// Scout's config.json as published: the multimodal Llama4ForConditionalGeneration, the text
// model in text_config (its weights under language_model.); a synthetic pack holds no vision
// model, so there is no vision_config either.
json llama4_scout() {
  return json{{"architectures", {"Llama4ForConditionalGeneration"}},
              {"boi_token_index", 200080},
              {"eoi_token_index", 200081},
              {"image_token_index", 200092},
              {"model_type", "llama4"},
              {"text_config", llama4_scout_text()},
              {"tie_word_embeddings", false}};
}

// A tiny Llama 4 for tests: 4 layers (MoE on 1 and 3, NoPE layer 3), 8 experts of [32, 64], top-1.
json tiny_llama4() {
  json c = llama4_scout_text();
  c["architectures"] = {"Llama4ForCausalLM"};
  c.erase("moe_layers");
  c.update(json{{"vocab_size", 512},
                {"hidden_size", 64},
                {"num_hidden_layers", 4},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 16},
                {"intermediate_size", 32},
                {"intermediate_size_mlp", 48},
                {"num_local_experts", 8},
                {"interleave_moe_layer_step", 2},
                {"no_rope_layers", {1, 1, 1, 0}},
                {"attention_chunk_size", 8},
                {"floor_scale", 4},
                {"max_position_embeddings", 512},
                {"bos_token_id", nullptr},
                {"eos_token_id", nullptr},
                {"pad_token_id", nullptr}});
  return c;
}

// Gemma 4 26B-A4B's config.json as published (google/gemma-4-26B-A4B-it): multimodal, the text
// model in text_config (its weights under model.language_model.): 30 layers, 5 sliding (window
// 1024, 8 kv heads of 256) to 1 full (2 kv heads of 512, keys as values, proportional rope on a
// quarter), every layer a gelu MLP of 2112 beside 128 experts of [704, 2816] top-8, tied
// embeddings, softcap 30. A synthetic pack holds no vision tower, so there is no
// vision_config either.
json gemma4_26b_a4b() {
  json types = json::array();
  for (int l = 0; l < 30; ++l) types.push_back((l + 1) % 6 ? "sliding_attention" : "full_attention");
  json text = {{"model_type", "gemma4_text"},
               {"num_hidden_layers", 30},
               {"hidden_size", 2816},
               {"num_attention_heads", 16},
               {"num_key_value_heads", 8},
               {"num_global_key_value_heads", 2},
               {"head_dim", 256},
               {"global_head_dim", 512},
               {"intermediate_size", 2112},
               {"moe_intermediate_size", 704},
               {"num_experts", 128},
               {"top_k_experts", 8},
               {"enable_moe_block", true},
               {"sliding_window", 1024},
               {"max_position_embeddings", 262144},
               {"hidden_activation", "gelu_pytorch_tanh"},
               {"final_logit_softcapping", 30.0},
               {"attention_k_eq_v", true},
               {"vocab_size", 262144},
               {"tie_word_embeddings", true},
               {"layer_types", types},
               {"rope_parameters",
                {{"full_attention", {{"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}, {"rope_type", "proportional"}}},
                 {"sliding_attention", {{"rope_theta", 10000.0}, {"rope_type", "default"}}}}}};
  return json{{"architectures", {"Gemma4ForConditionalGeneration"}},
              {"model_type", "gemma4"},
              {"dtype", "bfloat16"},
              {"text_config", text},
              {"image_token_id", 258880},
              {"video_token_id", 258884},
              {"eos_token_id", {1, 106}}};
}

// A tiny Gemma 4 for tests (gemma4_text; the shape of transformers' Gemma4TextConfig with the
// MoE block on): 6 layers alternating sliding (window 8, head 16, 2 kv heads) and full (head
// 32, one kv head, keys as values, proportional rope on a quarter), the last 2 layers reading
// earlier layers' KV caches with a double-wide MLP, 8 experts of [32, 64] top-2 beside an MLP
// of 48, per-layer inputs of 8, softcap 30, tied embeddings.
json tiny_gemma4() {
  json types = json::array();
  for (int l = 0; l < 6; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  return json{{"architectures", {"Gemma4ForCausalLM"}},
              {"attention_bias", false},
              {"attention_k_eq_v", true},
              {"enable_moe_block", true},
              {"final_logit_softcapping", 30.0},
              {"global_head_dim", 32},
              {"head_dim", 16},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"hidden_size", 64},
              {"hidden_size_per_layer_input", 8},
              {"intermediate_size", 48},
              {"layer_types", types},
              {"max_position_embeddings", 512},
              {"model_type", "gemma4_text"},
              {"moe_intermediate_size", 32},
              {"num_attention_heads", 4},
              {"num_experts", 8},
              {"num_global_key_value_heads", 1},
              {"num_hidden_layers", 6},
              {"num_key_value_heads", 2},
              {"num_kv_shared_layers", 2},
              {"rms_norm_eps", 1e-6},
              {"rope_parameters",
               {{"full_attention", {{"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}, {"rope_type", "proportional"}}},
                {"sliding_attention", {{"rope_theta", 10000.0}, {"rope_type", "default"}}}}},
              {"sliding_window", 8},
              {"tie_word_embeddings", true},
              {"top_k_experts", 2},
              {"use_double_wide_mlp", true},
              {"vocab_size", 512},
              {"vocab_size_per_layer_input", 512}};
}

// Layer types of the hybrid Qwen families: every `interval`-th layer full attention, the
// others Gated DeltaNet.
json hybrid_layer_types(int64_t n_layer, int64_t interval) {
  json t = json::array();
  for (int64_t l = 0; l < n_layer; ++l) t.push_back((l + 1) % interval ? "linear_attention" : "full_attention");
  return t;
}

// A Qwen4-Exp text config from the defaults of transformers' Qwen4ExpTextConfig
// (configuration_qwen4_exp.py); `over` replaces fields. No PLE (ple_layer_ids defaults to
// empty) and no QSA (the indexer_* fields default to None), so attention runs dense.
json qwen4_exp_text(const json& over) {
  json t = {{"model_type", "qwen4_exp_text"},
            {"vocab_size", 248320},
            {"hidden_size", 2048},
            {"num_hidden_layers", 40},
            {"num_attention_heads", 16},
            {"num_key_value_heads", 2},
            {"hidden_act", "silu"},
            {"max_position_embeddings", 32768},
            {"initializer_range", 0.02},
            {"rms_norm_eps", 1e-6},
            {"use_cache", true},
            {"tie_word_embeddings", false},
            // rope_parameters defaults to None, standardized to rope_theta = default_theta
            // (10000); the mrope_section default [11, 11, 10] covers 32 frequency pairs, i.e.
            // 64 of the 256 head dims: a partial rotary factor of 0.25 (also the family
            // loader's default). Written out so that no reader has to guess.
            {"rope_parameters",
             {{"rope_type", "default"},
              {"rope_theta", 10000.0},
              {"partial_rotary_factor", 0.25},
              {"mrope_section", {11, 11, 10}},
              {"mrope_interleaved", true}}},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"head_dim", 256},
            {"linear_conv_kernel_dim", 4},
            {"linear_key_head_dim", 128},
            {"linear_value_head_dim", 128},
            {"linear_num_key_heads", 16},
            {"linear_num_value_heads", 32},
            {"moe_intermediate_size", 512},
            {"shared_expert_intermediate_size", 512},
            {"num_experts_per_tok", 10},
            {"num_experts", 512},
            {"norm_topk_prob", true},
            {"output_router_logits", false},
            {"router_aux_loss_coef", 0.001},
            {"pad_token_id", nullptr},
            {"bos_token_id", nullptr},
            {"eos_token_id", nullptr},
            {"hc_count", 4},
            {"hc_lowrank", 320},
            {"ple_layer_ids", json::array()},
            {"ple_conv_kernel_size", 4},
            {"ngram_size", 3},
            {"heads_per_ngram", 8},
            {"ngram_vocab_size_base", 20000000},
            {"make_ngram_vocab_size_divisible_by", 128},
            {"seed", 1234},
            {"split_ngram_parts", 512},
            {"output_gate_type", nullptr}};
  t.update(over);
  t["ple_embed_dim"] = t["hidden_size"];  // the default: hidden_size
  // The default layer_types: every 4th layer attention (real checkpoints write
  // "full_attention", which transformers maps to its sparse-attention class).
  t["layer_types"] = hybrid_layer_types(t["num_hidden_layers"].get<int64_t>(), 4);
  return t;
}

// The multimodal wrapper the real checkpoints use (Qwen4ExpForConditionalGeneration): the
// loader reads text_config and the weights under model.language_model.; a synthetic pack
// holds no vision tower, so there is no vision_config either.
json qwen4_exp_config(const json& text) {
  return json{{"architectures", {"Qwen4ExpForConditionalGeneration"}},
              {"model_type", "qwen4_exp"},
              {"text_config", text},
              {"image_token_id", 248056},
              {"video_token_id", 248057},
              {"vision_start_token_id", 248053},
              {"vision_end_token_id", 248054},
              {"tie_word_embeddings", false}};
}

json qwen4_exp() { return qwen4_exp_config(qwen4_exp_text(json::object())); }

// Tiny variants for tests. tiny-qwen3-moe has a dense-MLP layer (mlp_only_layers) and an
// expert width (40) that is not a multiple of the q4 and q2 group sizes, so the partial
// groups and the MoE-layer numbering are exercised too.
json tiny_qwen3_moe() {
  json c = qwen3_30b_a3b();
  c.update(json{{"vocab_size", 512},
                {"hidden_size", 64},
                {"num_hidden_layers", 3},
                {"max_window_layers", 3},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 16},
                {"intermediate_size", 96},
                {"moe_intermediate_size", 40},
                {"num_experts", 8},
                {"num_experts_per_tok", 2},
                {"mlp_only_layers", {1}},
                {"max_position_embeddings", 512},
                {"bos_token_id", nullptr},
                {"eos_token_id", nullptr}});
  return c;
}

json tiny_qwen4_exp() {
  return qwen4_exp_config(qwen4_exp_text(json{{"vocab_size", 512},
                                             {"hidden_size", 64},
                                             {"num_hidden_layers", 4},
                                             {"num_attention_heads", 4},
                                             {"num_key_value_heads", 2},
                                             {"head_dim", 16},
                                             {"linear_key_head_dim", 16},
                                             {"linear_value_head_dim", 8},
                                             {"linear_num_key_heads", 2},
                                             {"linear_num_value_heads", 4},
                                             {"moe_intermediate_size", 32},
                                             {"shared_expert_intermediate_size", 48},
                                             {"num_experts", 8},
                                             {"num_experts_per_tok", 3},
                                             {"hc_lowrank", 16},
                                             {"max_position_embeddings", 512},
                                             {"rope_parameters",
                                              {{"rope_type", "default"},
                                               {"rope_theta", 10000.0},
                                               {"partial_rotary_factor", 0.5},
                                               {"mrope_section", {2, 1, 1}},
                                               {"mrope_interleaved", true}}}}));
}

// DeepSeek-V3's config.json as published (deepseek-ai/DeepSeek-V3; R1 and V3.1 share the
// shape): 61 layers (the first 3 dense, then 58 MoE), multi-head latent attention (128 heads,
// q-LoRA 1536, KV latent 512 + rotary key 64), 256 experts of [2048, 7168] in 8 groups (4
// kept), top-8, one shared expert, YaRN x40 from 4096 with mscale 1, an MTP layer. The
// checkpoint's quantization_config (FP8 blocks) is left out: a synthetic pack's experts are
// whatever --kinds says.
json deepseek_v3() {
  return json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"bos_token_id", 0},
              {"eos_token_id", 1},
              {"first_k_dense_replace", 3},
              {"hidden_act", "silu"},
              {"hidden_size", 7168},
              {"initializer_range", 0.02},
              {"intermediate_size", 18432},
              {"kv_lora_rank", 512},
              {"max_position_embeddings", 163840},
              {"model_type", "deepseek_v3"},
              {"moe_intermediate_size", 2048},
              {"moe_layer_freq", 1},
              {"n_group", 8},
              {"n_routed_experts", 256},
              {"n_shared_experts", 1},
              {"norm_topk_prob", true},
              {"num_attention_heads", 128},
              {"num_experts_per_tok", 8},
              {"num_hidden_layers", 61},
              {"num_key_value_heads", 128},
              {"num_nextn_predict_layers", 1},
              {"q_lora_rank", 1536},
              {"qk_nope_head_dim", 128},
              {"qk_rope_head_dim", 64},
              {"rms_norm_eps", 1e-6},
              {"rope_scaling",
               {{"beta_fast", 32},
                {"beta_slow", 1},
                {"factor", 40},
                {"mscale", 1.0},
                {"mscale_all_dim", 1.0},
                {"original_max_position_embeddings", 4096},
                {"type", "yarn"}}},
              {"rope_theta", 10000},
              {"routed_scaling_factor", 2.5},
              {"scoring_func", "sigmoid"},
              {"tie_word_embeddings", false},
              {"topk_group", 4},
              {"topk_method", "noaux_tc"},
              {"torch_dtype", "bfloat16"},
              {"use_cache", true},
              {"v_head_dim", 128},
              {"vocab_size", 129280}};
}

// Kimi K2's config.json as published (moonshotai/Kimi-K2-Instruct): DeepSeek-V3's
// architecture under model_type kimi_k2 with 64 heads, 384 experts in one group, the first
// layer dense, routed_scaling_factor 2.827, YaRN x32 from 4096 at rope theta 50000.
json kimi_k2() {
  json c = deepseek_v3();
  c.update(json{{"model_type", "kimi_k2"},
                {"bos_token_id", 163584},
                {"eos_token_id", 163585},
                {"first_k_dense_replace", 1},
                {"max_position_embeddings", 131072},
                {"n_group", 1},
                {"n_routed_experts", 384},
                {"num_attention_heads", 64},
                {"num_key_value_heads", 64},
                {"num_nextn_predict_layers", 0},
                {"rope_scaling",
                 {{"beta_fast", 1.0},
                  {"beta_slow", 1.0},
                  {"factor", 32.0},
                  {"mscale", 1.0},
                  {"mscale_all_dim", 1.0},
                  {"original_max_position_embeddings", 4096},
                  {"type", "yarn"}}},
                {"rope_theta", 50000.0},
                {"routed_scaling_factor", 2.827},
                {"topk_group", 1},
                {"vocab_size", 163840}});
  return c;
}

// GLM-4.5's config.json as published (zai-org/GLM-4.5): 92 layers (the first 3 dense), 96
// query heads of 128 over 8 kv heads with biases and per-head q/k norms, rotary on half of
// each head, 160 experts of [1536, 5120] top-8 in one group, a shared expert, an MTP layer.
json glm4_5() {
  return json{{"architectures", {"Glm4MoeForCausalLM"}},
              {"attention_bias", true},
              {"attention_dropout", 0.0},
              {"eos_token_id", {151329, 151336, 151338}},
              {"first_k_dense_replace", 3},
              {"head_dim", 128},
              {"hidden_act", "silu"},
              {"hidden_size", 5120},
              {"initializer_range", 0.02},
              {"intermediate_size", 12288},
              {"max_position_embeddings", 131072},
              {"model_type", "glm4_moe"},
              {"moe_intermediate_size", 1536},
              {"n_group", 1},
              {"n_routed_experts", 160},
              {"n_shared_experts", 1},
              {"norm_topk_prob", true},
              {"num_attention_heads", 96},
              {"num_experts_per_tok", 8},
              {"num_hidden_layers", 92},
              {"num_key_value_heads", 8},
              {"num_nextn_predict_layers", 1},
              {"pad_token_id", 151329},
              {"partial_rotary_factor", 0.5},
              {"rms_norm_eps", 1e-5},
              {"rope_scaling", nullptr},
              {"rope_theta", 1000000},
              {"routed_scaling_factor", 2.5},
              {"tie_word_embeddings", false},
              {"topk_group", 1},
              {"torch_dtype", "bfloat16"},
              {"use_cache", true},
              {"use_qk_norm", true},
              {"vocab_size", 151552}};
}

// MiniMax-M2's config.json as published (MiniMaxAI/MiniMax-M2), the fields transformers reads:
// 62 layers, 48 query heads of 128 over 8 kv heads, q/k norms over the whole projections,
// rotary on 64 of each head's 128 dims, 256 experts of [1536, 3072] top-8 under sigmoid
// routing with a correction bias, no shared expert.
json minimax_m2() {
  return json{{"architectures", {"MiniMaxM2ForCausalLM"}},
              {"attention_dropout", 0.0},
              {"bos_token_id", 200034},
              {"eos_token_id", 200020},
              {"head_dim", 128},
              {"hidden_act", "silu"},
              {"hidden_size", 3072},
              {"initializer_range", 0.02},
              {"intermediate_size", 1536},
              {"max_position_embeddings", 196608},
              {"model_type", "minimax_m2"},
              {"num_attention_heads", 48},
              {"num_experts_per_tok", 8},
              {"num_hidden_layers", 62},
              {"num_key_value_heads", 8},
              {"num_local_experts", 256},
              {"qk_norm_type", "per_layer"},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 5000000},
              {"rotary_dim", 64},
              {"scoring_func", "sigmoid"},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"use_qk_norm", true},
              {"use_routing_bias", true},
              {"vocab_size", 200064}};
}

// Tiny variants of the three for tests: 3 to 4 layers of width 64, 16 experts top-4.
// tiny-deepseek-v3: the first layer dense, a q-LoRA of 24, KV latent 32 + rotary key 8, 4 heads
// of 16 + 8 (values 16), 4 groups keep 2, YaRN as published; expert width 40 (not a multiple
// of the q4 and q2 group sizes).
json tiny_deepseek_v3() {
  json c = deepseek_v3();
  c.update(json{{"vocab_size", 512},
                {"hidden_size", 64},
                {"num_hidden_layers", 4},
                {"first_k_dense_replace", 1},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 4},
                {"q_lora_rank", 24},
                {"kv_lora_rank", 32},
                {"qk_nope_head_dim", 16},
                {"qk_rope_head_dim", 8},
                {"v_head_dim", 16},
                {"intermediate_size", 96},
                {"moe_intermediate_size", 40},
                {"n_routed_experts", 16},
                {"num_experts_per_tok", 4},
                {"n_group", 4},
                {"topk_group", 2},
                {"max_position_embeddings", 512},
                {"bos_token_id", nullptr},
                {"eos_token_id", nullptr}});
  return c;
}

// tiny-glm-4.5: the first layer dense, 4 query heads of 32 over 2 kv heads, rotary on half.
json tiny_glm4_5() {
  json c = glm4_5();
  c.update(json{{"vocab_size", 512},
                {"hidden_size", 64},
                {"num_hidden_layers", 3},
                {"first_k_dense_replace", 1},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 32},
                {"intermediate_size", 96},
                {"moe_intermediate_size", 24},
                {"n_routed_experts", 16},
                {"num_experts_per_tok", 4},
                {"n_group", 2},
                {"topk_group", 1},
                {"max_position_embeddings", 512},
                {"pad_token_id", nullptr},
                {"eos_token_id", nullptr}});
  return c;
}

// tiny-minimax-m2: 4 query heads of 16 over 2 kv heads, rotary on 8 of the 16 dims.
json tiny_minimax_m2() {
  json c = minimax_m2();
  c.update(json{{"vocab_size", 512},
                {"hidden_size", 64},
                {"num_hidden_layers", 3},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 16},
                {"rotary_dim", 8},
                {"intermediate_size", 24},
                {"num_local_experts", 16},
                {"num_experts_per_tok", 4},
                {"max_position_embeddings", 512},
                {"bos_token_id", nullptr},
                {"eos_token_id", nullptr}});
  return c;
}

// The first key of `keys` that `j` holds, or null.
const char* first_key(const json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (j.contains(k) && !j[k].is_null()) return k;
  return nullptr;
}

}  // namespace

const std::vector<SynthPreset>& synth_presets() {
  static const std::vector<SynthPreset> presets = {
      {"qwen3-30b-a3b", "Qwen3-30B-A3B: 48 layers, 128 experts of [768, 2048], top-8", qwen3_30b_a3b},
      {"qwen4-exp", "Qwen4-Exp (transformers defaults): 40 hybrid layers, 512 experts of [512, 2048], top-10", qwen4_exp},
      {"tiny-qwen3-moe", "a tiny qwen3_moe for tests: 3 layers (one dense), 8 experts of [40, 64], top-2", tiny_qwen3_moe},
      {"tiny-qwen4-exp", "a tiny qwen4_exp for tests: 4 hybrid layers, 8 experts of [32, 64], top-3", tiny_qwen4_exp},
      {"gpt-oss-120b", "gpt-oss-120b: 36 layers, 128 experts of [2880, 2880], top-4, attention sinks, biases", gpt_oss_120b},
      {"gpt-oss-20b", "gpt-oss-20b: 24 layers, 32 experts of [2880, 2880], top-4, attention sinks, biases", gpt_oss_20b},
      {"tiny-gpt-oss", "a tiny gpt_oss for tests: 3 layers, 8 experts of [64, 64], top-2", tiny_gpt_oss},
      {"llama4-scout", "Llama 4 Scout (multimodal config, text model only): 48 layers, 16 experts of [8192, 5120], top-1, a shared expert", llama4_scout},
      {"tiny-llama4", "a tiny llama4_text for tests: 4 layers (2 MoE), 8 experts of [32, 64], top-1", tiny_llama4},
      {"gemma4-26b-a4b", "Gemma 4 26B-A4B (multimodal config, text model only): 30 layers, 128 experts of [704, 2816], top-8", gemma4_26b_a4b},
      {"tiny-gemma4", "a tiny gemma4_text for tests: 6 layers (2 KV-shared), 8 experts of [32, 64], top-2, PLE", tiny_gemma4},
      {"deepseek-v3", "DeepSeek-V3 / R1: 61 layers (3 dense), MLA, 256 experts of [2048, 7168] in 8 groups, top-8, a shared expert", deepseek_v3},
      {"kimi-k2", "Kimi K2: 61 layers (1 dense), MLA with 64 heads, 384 experts of [2048, 7168], top-8, a shared expert", kimi_k2},
      {"glm-4.5", "GLM-4.5: 92 layers (3 dense), 160 experts of [1536, 5120], top-8, a shared expert", glm4_5},
      {"minimax-m2", "MiniMax-M2: 62 layers, 256 experts of [1536, 3072], top-8", minimax_m2},
      {"tiny-deepseek-v3", "a tiny deepseek_v3 for tests: 4 layers (1 dense), MLA, 16 experts of [40, 64] in 4 groups, top-4", tiny_deepseek_v3},
      {"tiny-glm-4.5", "a tiny glm4_moe for tests: 3 layers (1 dense), 16 experts of [24, 64] in 2 groups, top-4", tiny_glm4_5},
      {"tiny-minimax-m2", "a tiny minimax_m2 for tests: 3 layers, 16 experts of [24, 64], top-4", tiny_minimax_m2},
  };
  return presets;
}

json synth_preset_config(std::string_view name) {
  for (const SynthPreset& p : synth_presets())
    if (p.name == name) return p.config();
  std::string known;
  for (const SynthPreset& p : synth_presets()) known += (known.empty() ? "" : ", ") + std::string(p.name);
  fail(Status::invalid_argument, "synth: unknown model '", name, "' for --like; known: ", known);
}

void synth_scale_config(json& config, std::optional<int64_t> n_layer, std::optional<int64_t> n_expert) {
  SLUICE_CHECK(config.is_object(), Status::invalid_argument, "synth: the config is not a JSON object");
  json& t = config.contains("text_config") && config["text_config"].is_object() ? config["text_config"] : config;
  if (n_layer) {
    const char* key = first_key(t, {"num_hidden_layers"});
    SLUICE_CHECK(key && t[key].is_number_integer(), Status::invalid_argument, "synth: --layers: the config has no num_hidden_layers");
    const int64_t have = t[key].get<int64_t>();
    SLUICE_CHECK(*n_layer >= 1 && *n_layer <= have, Status::invalid_argument, "synth: --layers ", *n_layer,
                 " is outside [1, ", have, "] (the model's num_hidden_layers)");
    t[key] = *n_layer;
    // Per-layer lists (layer_types, Llama 4's no_rope_layers): the first n_layer entries.
    for (const char* list : {"layer_types", "no_rope_layers"}) {
      if (!t.contains(list) || !t[list].is_array() || static_cast<int64_t>(t[list].size()) <= *n_layer) continue;
      json cut = json::array();
      for (int64_t l = 0; l < *n_layer; ++l) cut.push_back(t[list][static_cast<size_t>(l)]);
      t[list] = cut;
    }
    // Gemma 4's KV-shared layers (the last ones): the same share of the fewer layers.
    if (t.contains("num_kv_shared_layers") && t["num_kv_shared_layers"].is_number_integer())
      t["num_kv_shared_layers"] = t["num_kv_shared_layers"].get<int64_t>() * *n_layer / have;
    // Layer lists: 0-indexed mlp_only_layers and moe_layers, 1-indexed ple_layer_ids.
    for (const auto& [list, base] :
         {std::pair<const char*, int64_t>{"mlp_only_layers", 0}, {"moe_layers", 0}, {"ple_layer_ids", 1}}) {
      if (!t.contains(list) || !t[list].is_array()) continue;
      json kept = json::array();
      for (const auto& v : t[list])
        if (!v.is_number_integer() || v.get<int64_t>() < *n_layer + base) kept.push_back(v);
      t[list] = kept;
    }
    if (t.contains("max_window_layers") && t["max_window_layers"].is_number_integer())
      t["max_window_layers"] = std::min(t["max_window_layers"].get<int64_t>(), *n_layer);
  }
  if (n_expert) {
    const char* key = first_key(t, {"num_experts", "num_local_experts", "n_routed_experts"});
    SLUICE_CHECK(key && t[key].is_number_integer(), Status::invalid_argument, "synth: --experts: the config has no num_experts");
    const int64_t have = t[key].get<int64_t>();
    SLUICE_CHECK(*n_expert >= 1 && *n_expert <= have, Status::invalid_argument, "synth: --experts ", *n_expert,
                 " is outside [1, ", have, "] (the model's ", key, ")");
    t[key] = *n_expert;
    if (const char* k = first_key(t, {"num_experts_per_tok", "top_k", "moe_topk", "top_k_experts"}); k && t[k].is_number_integer())
      t[k] = std::min(t[k].get<int64_t>(), *n_expert);
    // Group-limited routing (DeepSeek-V3, GLM-4.5): the most groups that still divide the experts
    // into groups of two or more, and enough of them kept for the top-k.
    if (t.contains("n_group") && t["n_group"].is_number_integer()) {
      int64_t groups = std::min(t["n_group"].get<int64_t>(), std::max<int64_t>(1, *n_expert / 2));
      while (groups > 1 && *n_expert % groups != 0) --groups;
      t["n_group"] = groups;
      const int64_t per = *n_expert / groups, k = t.value("num_experts_per_tok", int64_t{1});
      int64_t keep = std::min(t.value("topk_group", int64_t{1}), groups);
      while (keep < groups && keep * per < k) ++keep;
      t["topk_group"] = keep;
    }
  }
}

}  // namespace sluice
