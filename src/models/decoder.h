// DecoderModel: the pre-norm decoder shared by the attention + MoE families (qwen3_moe,
// mixtral, olmoe): per layer RMSNorm -> attention -> residual -> RMSNorm -> routed experts
// (or a dense MLP) -> residual; final RMSNorm and the output head. A family file fills a
// DecoderSpec and DecoderWeights; the forward pass is the same for all of them.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "models/blocks.h"
#include "models/mla.h"
#include "models/moe_layer.h"
#include "models/model.h"

namespace sluice {

struct DecoderLayerSpec {
  bool moe = false;    // routed experts; otherwise a dense SwiGLU MLP
  int64_t n_ff = 0;    // expert width (moe) or MLP width (dense)
  std::optional<AttentionSpec> attn;  // this layer's attention (window, chunks, q/k norm, ...); unset: the model's
  bool rope = true;    // false: no rotary embedding in this layer (Llama 4's NoPE layers)
};

struct DecoderSpec {
  ModelInfo info;
  AttentionSpec attn;
  RopeConfig rope;
  RouterSpec router;
  float norm_eps = 1e-6f;
  std::vector<DecoderLayerSpec> layers;
  ExpertMath expert_math;  // what one routed expert computes (SwiGLU for every family so far)
  // Multi-head latent attention in every layer instead of `attn` (DeepSeek-V3): the KV cache
  // holds each token's latent (MlaSpec::latent_dim values a layer), rope's rot_dim is
  // qk_rope_head_dim.
  std::optional<MlaSpec> mla = std::nullopt;
};

struct DecoderLayerWeights {
  Tensor attn_norm;                    // [n_embd]
  AttentionWeights attn;
  MlaWeights mla;                      // DecoderSpec::mla: the latent attention's weights (attn empty)
  Tensor ffn_norm;                     // [n_embd]
  Tensor router;                       // [n_expert, n_embd] (moe layers)
  Tensor router_bias;                  // [n_expert] (gpt-oss), or empty
  Tensor router_score_bias;            // [n_expert] f32 correction bias of the choice
                                       // (RouterScoring::sigmoid_grouped), or empty
  ExpertWeights shared;                // a shared expert added to the routed sum (Llama 4), or empty
  std::vector<ExpertWeights> experts;  // [n_expert] (moe layers)
  ExpertWeights mlp;                   // dense layers
};

struct DecoderWeights {
  Tensor tok_embd;     // [n_vocab, n_embd]
  Tensor output_norm;  // [n_embd]
  Tensor output;       // [n_vocab, n_embd] (the embedding when tied)
  std::vector<DecoderLayerWeights> layers;
};

class DecoderModel : public Model {
 public:
  DecoderModel(Backend& backend, DecoderSpec spec, DecoderWeights weights);
  std::unique_ptr<SequenceState> new_state(int64_t n_ctx) override;
  uint64_t context_bytes(int64_t n_ctx) const override;
  // Prompt caching: a state is its KV cache only (no snapshots); a prefix state has no
  // rotary tables nor graph buffers.
  bool prefix_copyable() const override { return true; }
  std::unique_ptr<SequenceState> new_prefix_state(int64_t n_tokens) override;
  uint64_t prefix_bytes(int64_t n_tokens) const override;
  void copy_prefix(const SequenceState& src, SequenceState& dst, int64_t from, int64_t n,
                   const StateSnapshot* at) override;
  Backend* state_backend() override { return &be_; }
  std::vector<Tensor> prefix_tensors(const SequenceState& prefix) const override;
  void forward(std::span<const int32_t> tokens, SequenceState& state, std::span<float> logits,
               bool all_logits) override;
  // On a backend with graphs the step and the draw are one replayed graph; only the token id
  // comes back.
  int32_t forward_sample(int32_t token, SequenceState& state, const SampleRule& rule, int64_t n_valid,
                         int64_t draw53, std::optional<int64_t> next_draw53) override;
  // The batch's rows in every product and one expert union per MoE layer; attention per
  // sequence against its own cache.
  bool decode_step_rerunnable() const override { return true; }  // KV cache only
  void forward_batch(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                     std::span<float> logits) override;
  // On a backend with graphs a batch step of a resident model is a replayed graph too (one per
  // set of sequences, kept for the next steps), ending in the draws; B token ids come back.
  void forward_batch_sample(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                            std::span<const SampleRule> rules, int64_t n_valid, std::span<const int64_t> draw53,
                            std::span<int32_t> next) override;
  ~DecoderModel() override;

  const DecoderSpec& spec() const { return spec_; }

 private:
  // A state of n_ctx tokens; runnable: with the decode graphs' buffers (backends with graphs).
  std::unique_ptr<SequenceState> make_state(int64_t n_ctx, bool runnable);
  uint64_t kv_bytes_per_token() const;
  // The layers over the residual stream x [n, n_embd] at positions state.n_past.. (positions:
  // the same as an i32 tensor on the backend, or empty), and the output head.
  void forward_layers(SequenceState& state, const Tensor& x, const Tensor& cos, const Tensor& sin,
                      const Tensor& positions);
  // The layer loop itself; attention(l, h, y, then) runs layer l's attention of h, its output
  // projection into the residual stream and the next norm as `then` says (blocks.h), y
  // scratch. first_position: the position of row 0, for the routing observer.
  using AttentionFn = std::function<void(size_t l, const Tensor& h, const Tensor& y, const ResidualNorm& then)>;
  void run_layers(const Tensor& x, int64_t first_position, const AttentionFn& attention);
  void final_logits(const Tensor& x, const Tensor& out);
  // forward() without the copy out: the logits on the backend ([1 or n, n_vocab] f32).
  Tensor forward_eager(std::span<const int32_t> tokens, SequenceState& state, bool all_logits);
  // The layers and the output head of x [n, n_embd] (the embedded rows) at positions
  // state.n_past.. (n_past is the caller's): the logits [1 or n, n_vocab] f32 on the backend.
  Tensor eager_logits(SequenceState& state, const Tensor& x, bool all_logits);
  // forward_sample where the step is not a replayed graph (streamed experts, no graphs): the
  // step runs eagerly and draws on the backend, so that only the token id crosses (the
  // backend's sample is core/sampling.h's rule); a step whose next follows enqueues that one
  // ahead where the backend has readbacks and the provider lets forwards overlap.
  int32_t forward_sample_eager(int32_t token, SequenceState& state, const SampleRule& rule, int64_t n_valid,
                               int64_t draw53, std::optional<int64_t> next_draw53);
  // Whether a one-token step can be a replayed graph: the backend captures graphs, every
  // expert is resident in a device table, and nothing observes or streams the routing.
  bool step_graph_eligible() const;
  // Replays the one-token step of `token` at position state.n_past (capturing its graph first
  // if needed; token null: the one a draw left in state.step_token); with a rule, the graph
  // ends in the draw into state.step_token, else in state.step_logits. n_past is the caller's.
  void replay_step(SequenceState& state, const int32_t* token, const SampleRule* rule, int64_t n_valid);
  // The rotary tables of positions [state.n_past, state.n_past + n): rows of the state's
  // tables of its whole context, each position computed once a state (kRopeFill rows at a
  // time, as the sequence reaches them), so that neither a prompt's rows nor the first decode
  // step recompute them.
  RopeTables state_rope(SequenceState& state, int64_t n);
  // Waits for the step forward_sample enqueued ahead on this state, if any, and forgets it.
  void settle(SequenceState& state);
  // The batch step's graph for these sequences (and, with rules, these draws), captured when
  // no kept graph matches, replayed once: its logits [B, n_vocab] or draws hold the result.
  struct BatchGraph;
  BatchGraph& replay_batch(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                           std::span<const SampleRule> rules, int64_t n_valid, std::span<const int64_t> draw53);
  // The layers of a batch step over x [B, n_embd], row b at states[b]'s position (positions:
  // the same as an i32 tensor on the backend, or empty), attention per sequence.
  void batch_layers(std::span<SequenceState* const> states, const Tensor& x, const Tensor& cos, const Tensor& sin,
                    const Tensor& positions);
  // The batch eager (no graph): rows in every product, attention per sequence.
  void forward_batch_eager(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                           std::span<float> logits);

  Backend& be_;
  DecoderSpec spec_;
  DecoderWeights w_;
  std::vector<AttentionSpec> layer_attn_;  // [n_layer] each layer's attention (spec_.attn unless the layer's own)
  std::vector<RopeConfig> layer_rope_;     // [n_layer] spec_.rope, or no rotation (rot_dim 0) in a NoPE layer
  std::vector<int64_t> moe_index_;  // [n_layer] index among the MoE layers, -1 for dense layers
  std::vector<int64_t> next_moe_;   // [n_layer] the next MoE layer after a MoE layer, or -1
  std::vector<std::unique_ptr<ExpertTable>> expert_tables_;  // [n_layer] device tables of resident experts
  // Batch step graphs, least recently used first out (kBatchGraphs at most), keyed by the
  // states' ids (never reused, unlike addresses); the rotary tables of positions
  // [0, batch_rope_rows_) they read.
  std::vector<std::unique_ptr<BatchGraph>> batch_graphs_;
  uint64_t next_state_id_ = 1, batch_graph_clock_ = 0;
  Tensor batch_rope_cos_, batch_rope_sin_;
  int64_t batch_rope_rows_ = 0;
};

}  // namespace sluice
