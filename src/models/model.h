// Model: the interface the engine drives. A model owns its weights on a backend and runs a
// forward pass over a chunk of consecutive tokens of one sequence, reading and extending that
// sequence's state (KV cache; recurrent state for hybrid families).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "experts/expert_provider.h"
#include "experts/routing.h"
#include "experts/routing_replay.h"

namespace sluice {

struct ModelInfo {
  std::string family;            // registry name, e.g. "qwen3_moe"
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ctx_train = 0;       // max_position_embeddings
  std::optional<int32_t> bos_id;  // from config.json (the tokenizer's files take precedence)
  std::optional<int32_t> eos_id;
  int64_t n_params = 0;          // total parameters, routed experts included
  int64_t n_params_active = 0;   // parameters one token uses
  // Routed experts (filled by the shared decoders from their specs; 0 / empty for a dense model).
  int64_t n_expert = 0;          // experts per MoE layer
  int64_t n_expert_used = 0;     // experts per token (top-k)
  std::vector<int64_t> moe_layers;  // model layer index of each MoE layer, ascending
};

// Per-sequence state. n_past tokens have been processed.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  int64_t n_past = 0;
  int64_t n_ctx = 0;  // capacity in tokens
  virtual void reset() { n_past = 0; }
};

// What a sequence's state cannot cut at any position (the recurrent state of a hybrid family),
// copied at one position so that the state can resume there later (prompt caching,
// engine/prompt_cache.h). Never changed once taken.
class StateSnapshot {
 public:
  virtual ~StateSnapshot() = default;
  int64_t n_past = 0;  // the position it was taken at
  // Its tensors on the backend, in a fixed order (for copies into host memory and back: the
  // prompt cache's host tier), and the same snapshot over other tensors of those sizes (host
  // copies, which only this kind of copy reads, or device ones made from them).
  virtual std::vector<Tensor> tensors() const = 0;
  virtual std::unique_ptr<StateSnapshot> with_tensors(std::vector<Tensor> tensors) const = 0;
};

// Model::save_for_rerun's copy of a sequence's in-place state.
class StepUndo {
 public:
  virtual ~StepUndo() = default;
  virtual void restore() = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelInfo& info() const { return info_; }

  // Called with every routing decision of every MoE layer (null: none). For tools, not the
  // hot path: it runs synchronously inside forward().
  // predict_next: each event also carries the lookahead router's prediction for the next MoE
  // layer (--trace-routing with --lookahead on).
  void set_routing_observer(RoutingObserver observer, bool predict_next = false) {
    routing_observer_ = std::move(observer);
    routing_predict_next_ = predict_next;
  }

  // Replays a recorded routing in place of every MoE layer's router (benchmarks,
  // --replay-routing; experts/routing_replay.h); null: the routers route. Its shape must be
  // the model's (MoE layers, experts, top-k): invalid_argument otherwise. A replayed decode
  // step runs eagerly, never as a captured graph (each step takes other rows).
  void set_routing_replay(std::shared_ptr<RoutingReplay> replay);
  RoutingReplay* routing_replay() const { return routing_replay_.get(); }

  // Routes every MoE layer's experts through `provider` (the streamer) instead of resident
  // weights; load_model sets it when streaming options are given. Null: resident experts.
  void set_expert_provider(std::shared_ptr<ExpertProvider> provider) { expert_provider_ = std::move(provider); }
  const std::shared_ptr<ExpertProvider>& expert_provider() const { return expert_provider_; }

  // Refuses (invalid_argument) a sequence of n_tokens beyond the context the model was made
  // for (max_position_embeddings): positions past it are untrained, and a mistaken huge
  // request would otherwise allocate its cache and run for minutes. `what` names the request
  // in the message ("--ctx 4096", "prompt (30002 tokens) + -n 32").
  void check_context(int64_t n_tokens, const std::string& what) const;

  // A fresh state for a sequence of at most n_ctx tokens.
  virtual std::unique_ptr<SequenceState> new_state(int64_t n_ctx) = 0;
  // The bytes of new_state(n_ctx) that grow with n_ctx (KV cache, QSA keys), so that a context
  // size can be checked against the memory before it is allocated; the fixed part (recurrent
  // layers' state) is left out. Saturates at UINT64_MAX.
  virtual uint64_t context_bytes(int64_t n_ctx) const = 0;

  // Runs tokens at positions state.n_past, state.n_past + 1, ... and advances n_past.
  // logits receives [n_vocab] f32 for the last token, or [tokens.size(), n_vocab] when
  // all_logits is true. The tokens count as prompt (the streamers' prefill phase) unless the
  // call comes from a decode step (forward_sample).
  virtual void forward(std::span<const int32_t> tokens, SequenceState& state, std::span<float> logits,
                       bool all_logits) = 0;

  // One decode step of several sequences at once (continuous batching): tokens[b] runs at
  // position states[b]->n_past of sequence b, which advances by one; logits receives
  // [tokens.size(), n_vocab] f32. Every row equals what forward() gives its sequence alone (bit
  // for bit on the CPU, whose products do not depend on the batch), and the routed experts of
  // a MoE layer are one union over the batch. The default runs the sequences one after
  // another; the decoder and hybrid families batch them.
  virtual void forward_batch(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                             std::span<float> logits);

  // Whether a decode step may run twice at the same position, the second run leaving the state
  // as if it had run once: true when the state is a KV cache only (running position p again
  // overwrites every row the first run wrote at p), or when save_for_rerun copies what a step
  // updates in place (the hybrids' recurrent state). --kl-check (engine/kl_check.h) runs the
  // exact step first, then the lossy one at the same position.
  virtual bool decode_step_rerunnable() const { return false; }
  // Before a decode step that will run twice: what the step changes in place beyond the rows
  // it writes at its position, copied; restore() puts it back, so that the second run starts
  // from the state the first one saw. Null where there is nothing to copy (a KV cache only).
  virtual std::unique_ptr<StepUndo> save_for_rerun(SequenceState& /*state*/) { return nullptr; }

  // ---- Prompt caching (engine/prompt_cache.h) ----
  // A state is its per-token rows (KV cache, QSA keys: the first n rows are the state of the
  // first n tokens) and, in the hybrid families, a recurrent part that holds only the latest
  // position (snapshot() copies it). Whether copy_prefix works for this model (false: no
  // prompt cache).
  virtual bool prefix_copyable() const { return false; }
  // The bytes of one snapshot(); 0 when the state is per-token rows only (a KV cache), which
  // resumes at any position it holds without one.
  virtual uint64_t snapshot_bytes() const { return 0; }
  // A copy of the state's recurrent part at st.n_past; null where there is none.
  virtual std::unique_ptr<StateSnapshot> snapshot(const SequenceState& /*st*/) { return nullptr; }
  // A state that holds the per-token rows of n_tokens tokens and nothing else (a cached
  // prefix: copy_prefix reads and writes it, forward never runs on it), and its bytes.
  virtual std::unique_ptr<SequenceState> new_prefix_state(int64_t n_tokens) { return new_state(n_tokens); }
  virtual uint64_t prefix_bytes(int64_t n_tokens) const { return context_bytes(n_tokens); }
  // The backend a state's tensors live on, and the tensors of a prefix state (its per-token
  // rows: KV, QSA keys and block keys) in a fixed order, so that the prompt cache can copy a
  // prefix state to host memory and back into new_prefix_state() of the same size. Null /
  // empty: no host tier.
  virtual Backend* state_backend() { return nullptr; }
  virtual std::vector<Tensor> prefix_tensors(const SequenceState& /*prefix*/) const { return {}; }
  // Makes dst the state src held after its first n tokens: rows [from, n) of the per-token
  // state copied from src (dst holds rows [0, from) of the same tokens already; from <= n <=
  // src.n_past, n <= dst.n_ctx), the recurrent part from `at` (a snapshot taken at n, of
  // these tokens; required when snapshot_bytes() > 0, ignored otherwise); dst.n_past = n.
  // src may be dst (from == n: a state cut back to n, or to the snapshot at n).
  virtual void copy_prefix(const SequenceState& src, SequenceState& dst, int64_t from, int64_t n,
                           const StateSnapshot* at);

  // One decode step that returns the next token instead of logits: runs `token` at position
  // state.n_past and draws the next one by `rule` (core/sampling.h) among ids < n_valid, with
  // the uniform draw u = draw53 * 2^-53. Returns -1 when the logits hold NaN or +inf. The
  // default runs forward() and samples on the host; a model whose decode step runs on a device
  // samples there, so only the token id crosses to the host. next_draw53: where the caller
  // means to run the drawn token next by the same rule, that step's uniform draw (any value
  // for a greedy rule, which reads none); a model may then enqueue that step before it reads
  // this one's token. None at a generation's last step, so that no step is wasted (and none
  // where the caller wants each step run alone, e.g. to compare).
  virtual int32_t forward_sample(int32_t token, SequenceState& state, const SampleRule& rule, int64_t n_valid,
                                 int64_t draw53, std::optional<int64_t> next_draw53);

  // forward_sample for a batch (the server's decode step): tokens[b] runs at position
  // states[b]->n_past, which advances by one, and next[b] is drawn by rules[b] among ids <
  // n_valid with the uniform draw draw53[b] * 2^-53; -1 for a row whose logits hold NaN or
  // +inf. Each row draws what forward_batch's logits row would give (core/sampling.h). The
  // default runs forward_sample for one sequence, otherwise forward_batch and samples on the
  // host; the decoder family samples the batch on the device, so only B token ids cross.
  virtual void forward_batch_sample(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                                    std::span<const SampleRule> rules, int64_t n_valid,
                                    std::span<const int64_t> draw53, std::span<int32_t> next);

 protected:
  // The checks every forward() starts with: tokens present and inside the vocabulary, room
  // in the context, a logits buffer large enough.
  // From which layers are MoE layers: info_.moe_layers, and per layer its index among the MoE
  // layers (-1 otherwise) and the next MoE layer after it (-1 for the last and for others).
  void index_moe_layers(const std::vector<bool>& is_moe, std::vector<int64_t>& moe_index,
                        std::vector<int64_t>& next_moe);
  void check_forward_inputs(std::span<const int32_t> tokens, const SequenceState& state, std::span<float> logits,
                            bool all_logits) const;
  // The same without the logits buffer (forward_sample).
  void check_step_inputs(std::span<const int32_t> tokens, const SequenceState& state) const;
  // forward_batch's checks: one state per token, distinct, each with room for one more token.
  void check_batch_inputs(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                          std::span<float> logits) const;
  void check_batch_states(std::span<const int32_t> tokens, std::span<SequenceState* const> states) const;
  // forward_batch_sample's checks: those, one rule, draw and output per row, n_valid in range.
  void check_batch_sample_inputs(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                                 std::span<const SampleRule> rules, int64_t n_valid, std::span<const int64_t> draw53,
                                 std::span<int32_t> next) const;
  // Sets forward_phase_ to decode while alive (prefill again after, also on a throw).
  struct DecodePhase {
    explicit DecodePhase(Model& m) : model(m) { model.forward_phase_ = StreamPhase::decode; }
    ~DecodePhase() { model.forward_phase_ = StreamPhase::prefill; }
    Model& model;
  };
  // copy_prefix's checks: 0 <= from <= n <= src.n_past, n <= dst.n_ctx, and a snapshot at n
  // where the model takes them.
  void check_prefix_copy(const SequenceState& src, const SequenceState& dst, int64_t from, int64_t n,
                         const StateSnapshot* at) const;
  // bytes_per_token x n_ctx for context_bytes(), UINT64_MAX when it would overflow.
  static uint64_t saturating_product(uint64_t bytes_per_token, int64_t n_ctx);

  ModelInfo info_;
  // The phase the forward pass in progress belongs to, for the streaming statistics: prefill,
  // except inside a decode step.
  StreamPhase forward_phase_ = StreamPhase::prefill;
  RoutingObserver routing_observer_;
  bool routing_predict_next_ = false;
  std::shared_ptr<ExpertProvider> expert_provider_;
  std::shared_ptr<RoutingReplay> routing_replay_;
};

}  // namespace sluice
