// HybridModel: the decoder shared by the hybrid Qwen families (qwen3_next, qwen3_5,
// qwen3_5_moe, qwen4_exp). Layers alternate Gated DeltaNet and gated full attention (per
// layer_types); the feed-forward part is routed experts plus a sigmoid-gated shared expert,
// or a dense MLP. The residual is either one stream with zero-centered pre-norms (qwen3_next,
// qwen3_5*), or hyper-connections with optional PLE (qwen4_exp). A family file fills a
// HybridSpec and HybridWeights; the forward pass reads traits, never the family.
//
// Per-sequence state (HybridState): the KV cache (and QSA keys) of the attention layers, the
// conv and recurrent states of the DeltaNet layers, the conv state and token history of the
// PLE layers. reset() clears all of it.
#pragma once

#include <vector>

#include "models/gated_attention.h"
#include "models/gated_delta_net.h"
#include "models/hyper_connections.h"
#include "models/model.h"
#include "models/moe_layer.h"
#include "models/ple.h"

namespace sluice {

enum class TokenMixer { delta_net, attention };

struct HybridLayerSpec {
  TokenMixer mixer = TokenMixer::delta_net;
  bool moe = false;   // routed experts (+ the shared expert); otherwise a dense SwiGLU MLP
  int64_t n_ff = 0;   // expert width (moe) or MLP width (dense)
  bool ple = false;   // PLE before the layer (hyper-connection families only)
};

struct HybridSpec {
  ModelInfo info;
  GatedAttentionSpec attn;
  RopeConfig rope;
  DeltaNetSpec delta;
  RouterSpec router;
  int64_t n_ff_shared = 0;  // shared expert width; 0: none
  HyperSpec hyper;          // hyper.n_stream == 0: one residual stream with pre-norms
  PleSpec ple;
  float norm_eps = 1e-6f;
  std::vector<HybridLayerSpec> layers;
  ExpertMath expert_math;  // what one routed expert computes (SwiGLU for every family so far)
};

struct HybridLayerWeights {
  Tensor attn_norm, ffn_norm;          // f32 [n_embd], 1 + w (single-stream families)
  HyperWeights attn_hyper, ffn_hyper;  // hyper-connection families
  GatedAttentionWeights attn;          // attention layers
  DeltaNetWeights delta;               // DeltaNet layers
  Tensor router;                       // [n_expert, n_embd] (moe layers)
  std::vector<ExpertWeights> experts;  // [n_expert]
  ExpertWeights shared;                // shared expert
  Tensor shared_gate;                  // [1, n_embd]
  ExpertWeights mlp;                   // dense layers
  PleWeights ple;                      // PLE layers
};

struct HybridWeights {
  Tensor tok_embd;           // [n_vocab, n_embd]
  Tensor output_norm;        // f32 [n_embd], 1 + w (single-stream families)
  HyperWeights output_hyper; // the final stream mixer (hyper-connection families)
  Tensor output;             // [n_vocab, n_embd]
  std::vector<HybridLayerWeights> layers;
};

class HybridState final : public SequenceState {
 public:
  explicit HybridState(Backend& be) : be_(be) {}
  void reset() override;

  std::vector<GatedAttentionState> attn;  // per layer (attention layers)
  std::vector<DeltaNetState> delta;       // per layer (DeltaNet layers)
  std::vector<PleState> ple;              // per layer (PLE layers)
  const PleSpec* ple_spec = nullptr;

 private:
  Backend& be_;
};

class HybridModel : public Model {
 public:
  HybridModel(Backend& backend, HybridSpec spec, HybridWeights weights);
  std::unique_ptr<SequenceState> new_state(int64_t n_ctx) override;
  uint64_t context_bytes(int64_t n_ctx) const override;
  void forward(std::span<const int32_t> tokens, SequenceState& state, std::span<float> logits,
               bool all_logits) override;
  // The batch's rows in every product and one expert union per MoE layer; the token mixers
  // (attention, DeltaNet) and PLE per sequence against its own state.
  void forward_batch(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                     std::span<float> logits) override;

  // The DeltaNet conv and recurrent states, PLE's conv state and token history, and QSA's
  // count of finished blocks are what a decode step changes in place; save_for_rerun copies
  // them (the KV and key rows it writes at its position are rewritten by the rerun).
  bool decode_step_rerunnable() const override { return true; }
  std::unique_ptr<StepUndo> save_for_rerun(SequenceState& state) override;

  // Prompt caching: the per-token rows are the attention layers' KV and QSA keys (and QSA's
  // block keys, one per compress_ratio tokens); the recurrent part (the DeltaNet and PLE
  // states) resumes only from a snapshot.
  bool prefix_copyable() const override { return true; }
  uint64_t snapshot_bytes() const override;
  std::unique_ptr<StateSnapshot> snapshot(const SequenceState& state) override;
  std::unique_ptr<SequenceState> new_prefix_state(int64_t n_tokens) override;
  void copy_prefix(const SequenceState& src, SequenceState& dst, int64_t from, int64_t n,
                   const StateSnapshot* at) override;
  Backend* state_backend() override { return &be_; }
  std::vector<Tensor> prefix_tensors(const SequenceState& prefix) const override;

  const HybridSpec& spec() const { return spec_; }

 private:
  // Rows [row0, row0 + n) of a forward call belong to one sequence (state), whose tokens they are.
  struct Segment {
    int64_t row0 = 0, n = 0;
    HybridState* state = nullptr;
    std::span<const int32_t> tokens;
  };
  // A state of n_ctx tokens; recurrent false: the per-token rows only (a prefix state).
  std::unique_ptr<SequenceState> make_state(int64_t n_ctx, bool recurrent);
  // The layers over the tokens of every segment (rows in segment order); the residual
  // stream(s) [n, width] after the last layer. cos/sin: each row's rotary tables.
  Tensor run_layers(std::span<const int32_t> tokens, std::span<const Segment> segs, const Tensor& cos, const Tensor& sin);
  // The output norm (or stream mixer) and head over rows xs.
  void final_logits(const Tensor& xs, const Tensor& out);
  // y[n, n_embd] = the feed-forward part of layer l for h[n, n_embd] (rows at positions
  // n_past..).
  void feed_forward(size_t l, int64_t n_past, const Tensor& h, const Tensor& y);

  Backend& be_;
  HybridSpec spec_;
  HybridWeights w_;
  std::vector<int64_t> moe_index_;  // [n_layer] index among the MoE layers, -1 for other layers
  std::vector<int64_t> next_moe_;   // [n_layer] the next MoE layer after a MoE layer, or -1
  std::vector<std::unique_ptr<ExpertTable>> expert_tables_;  // [n_layer] device tables of resident experts
};

}  // namespace sluice
