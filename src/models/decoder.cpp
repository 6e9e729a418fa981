// DecoderModel forward pass and its KV-cache state. On backends with graphs (CUDA), a one-token
// decode step of a fully resident model is captured once per sequence state and replayed.
#include "models/decoder.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/log.h"

namespace sluice {
namespace {

bool same_rule(const SampleRule& a, const SampleRule& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p;
}

struct DecoderState : SequenceState {
  uint64_t id = 0;  // this state among the model's (batch graphs are keyed by it)
  std::vector<KvLayer> kv;
  // The rotary tables of the context's positions, filled as the sequence reaches them
  // (state_rope; every forward reads its rows here). Decode graphs (backends with
  // graphs_enabled): the persistent inputs and output of the captured one-token step, and the
  // graph, which bakes in this state's KV buffers and tables, so it lives here.
  Tensor rope_cos, rope_sin;      // [n_ctx, rot_dim / 2] f32 (allocated at first use)
  int64_t rope_filled = 0;        // rows [0, rope_filled) of them hold their positions' values
  Tensor step_token, step_pos;    // i32 [1]: the token and its position, written before a replay
  Tensor step_logits;             // [1, n_vocab] f32
  std::unique_ptr<BackendGraph> step_graph;
  // The step that ends in a draw (forward_sample): its uniform number (i64 [1], written before
  // a replay) and the rule its graph was captured with. It draws into step_token, so that the
  // next replay can run the drawn token without the host.
  Tensor step_draw;
  std::unique_ptr<BackendGraph> sample_graph;
  SampleRule sample_rule;
  int64_t sample_n_valid = 0;
  // The drawn tokens come back through two readbacks, taken in turn (this step's, the next's).
  std::unique_ptr<HostReadback> drawn[2];
  int next_readback = 0;
  // A step forward_sample enqueued ahead (a replay of sample_graph, or the eager step of a
  // streamed model), drawing by `rule` among n_valid ids with the uniform draw draw53 (read
  // only by a rule that is not greedy): it runs, at position `pos`, the token the step before
  // it drew on the device (`token`: that draw as the host read it, once it did), and its own
  // draw comes back through drawn[readback]. Every other use of the state settles it first.
  struct AheadStep {
    int64_t pos = 0;
    int32_t token = -1;
    int readback = 0;
    SampleRule rule;
    int64_t n_valid = 0;
    int64_t draw53 = 0;
  };
  std::optional<AheadStep> ahead;
  // Whether the step ahead is the one forward_sample is asked for now.
  bool ahead_is(int32_t token, const SampleRule& rule, int64_t n_valid, int64_t draw53) const {
    return ahead && ahead->pos == n_past && ahead->token == token && same_rule(ahead->rule, rule) &&
           ahead->n_valid == n_valid && (rule.temperature < kGreedyTemperature || ahead->draw53 == draw53);
  }
  // Enqueues the copy of step_token into the next readback; returns which one.
  int begin_readback() {
    const int r = next_readback;
    next_readback ^= 1;
    drawn[r]->begin(step_token);
    return r;
  }
};

// Rows a state's rotary tables are filled by beyond what a forward needs: a decode step
// computes and uploads them once every kRopeFill tokens (~1 ms of cos and sin on one core at
// 64 pairs a position, less over the thread pool; 256 KB a table, within the backend's
// asynchronous copy slots), while the step before it runs on the device.
constexpr int64_t kRopeFill = 1024;

// The rotary tables of positions [0, n) on the backend: cos, sin [n, rot_dim / 2] f32.
void upload_rope_tables(Backend& be, const RopeConfig& rope, int64_t n, Tensor& cos, Tensor& sin) {
  std::vector<int64_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), int64_t{0});
  std::vector<float> cos_h, sin_h;
  rope_tables(rope, pos, cos_h, sin_h);
  const int64_t half = rope.rot_dim / 2;
  cos = be.alloc(DType::f32, {n, half});
  sin = be.alloc(DType::f32, {n, half});
  be.from_host(cos, cos_h.data());
  be.from_host(sin, sin_h.data());
}

// Batch graphs kept at once: each holds its rows' activations and logits ([B, n_vocab] f32,
// 39 MB at B = 64 for a 152k vocabulary); a server's batch changes when a request joins or
// ends, and often returns to a recent set.
constexpr size_t kBatchGraphs = 4;

}  // namespace

struct DecoderModel::BatchGraph {
  std::vector<uint64_t> state_ids;   // the sequences of rows 0..B-1
  bool sampled = false;              // ends in draws (rules, n_valid) rather than logits
  std::vector<SampleRule> rules;
  int64_t n_valid = 0;
  Tensor tokens, positions;          // i32 [B], written before a replay
  Tensor draws;                      // i64 [B] (sampled)
  Tensor logits;                     // [B, n_vocab] f32
  Tensor next;                       // i32 [B] (sampled)
  std::unique_ptr<BackendGraph> graph;
  uint64_t last_use = 0;
};

DecoderModel::~DecoderModel() = default;

DecoderModel::DecoderModel(Backend& backend, DecoderSpec spec, DecoderWeights weights)
    : be_(backend), spec_(std::move(spec)), w_(std::move(weights)) {
  info_ = spec_.info;
  info_.n_expert = spec_.router.n_expert;
  info_.n_expert_used = spec_.router.n_expert_used;
  std::vector<bool> is_moe;
  for (const auto& layer : spec_.layers) is_moe.push_back(layer.moe);
  index_moe_layers(is_moe, moe_index_, next_moe_);
  for (DecoderLayerWeights& lw : w_.layers) fuse_qkv(be_, lw.attn);
  for (const DecoderLayerSpec& layer : spec_.layers) {
    layer_attn_.push_back(layer.attn.value_or(spec_.attn));
    RopeConfig rope = spec_.rope;
    if (!layer.rope) rope.rot_dim = 0;  // attention_inputs rotates no dims; the tables are not read
    layer_rope_.push_back(rope);
  }
  expert_tables_ = make_expert_tables(be_, w_.layers, spec_.router, spec_.expert_math);
  if (spec_.mla) {
    const MlaSpec& m = *spec_.mla;
    const uint64_t per_token = kv_bytes_per_token();
    const uint64_t expanded = static_cast<uint64_t>(m.n_head * (m.qk_head_dim() + m.v_head_dim)) *
                              dtype_size(be_.kv_dtype()) * spec_.layers.size();
    LOG_INFO(info_.family, ": latent KV cache: ", m.latent_dim(), " values a token and layer (kv_lora_rank ",
             m.kv_lora_rank, " + qk_rope_head_dim ", m.qk_rope_head_dim, "): ", per_token, " bytes a token in ",
             dtype_name(be_.kv_dtype()), " over ", spec_.layers.size(), " layers, against ", expanded,
             " expanded per head");
  }
}

std::unique_ptr<SequenceState> DecoderModel::new_state(int64_t n_ctx) { return make_state(n_ctx, true); }

std::unique_ptr<SequenceState> DecoderModel::new_prefix_state(int64_t n_tokens) { return make_state(n_tokens, false); }

std::unique_ptr<SequenceState> DecoderModel::make_state(int64_t n_ctx, bool runnable) {
  SLUICE_CHECK(n_ctx > 0, Status::invalid_argument, "context size must be positive");
  auto st = std::make_unique<DecoderState>();
  st->id = next_state_id_++;
  st->n_ctx = n_ctx;
  const auto& a = spec_.attn;
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    if (spec_.mla) {  // the latent cache: k [n_ctx, 1, latent_dim], no v
      st->kv.push_back(KvLayer{be_.alloc(be_.kv_dtype(), {n_ctx, 1, spec_.mla->latent_dim()}), {}});
      continue;
    }
    KvLayer kv{be_.alloc(be_.kv_dtype(), {n_ctx, a.n_head_kv, a.head_dim}),
               be_.alloc(be_.kv_dtype(), {n_ctx, a.n_head_kv, a.head_dim})};
    st->kv.push_back(std::move(kv));
  }
  if (runnable && be_.graphs_enabled()) {
    st->step_token = be_.alloc(DType::i32, {1});
    st->step_pos = be_.alloc(DType::i32, {1});
    st->step_logits = be_.alloc(DType::f32, {1, spec_.info.n_vocab});
    st->step_draw = be_.alloc(DType::i64, {1});
    for (auto& r : st->drawn) r = be_.make_readback(sizeof(int32_t));
  }
  return st;
}

uint64_t DecoderModel::context_bytes(int64_t n_ctx) const {
  // Per token: the KV rows, and the rotary tables' cos and sin rows (state_rope: rot_dim / 2
  // f32 each).
  const uint64_t per_token = kv_bytes_per_token() + 2 * static_cast<uint64_t>(spec_.rope.rot_dim / 2) * sizeof(float);
  return saturating_product(per_token, n_ctx);
}

uint64_t DecoderModel::prefix_bytes(int64_t n_tokens) const { return saturating_product(kv_bytes_per_token(), n_tokens); }

uint64_t DecoderModel::kv_bytes_per_token() const {
  // K and V rows [n_head_kv, head_dim] of the backend's KV dtype in every layer (MLA: one latent
  // row of latent_dim).
  const auto& a = spec_.attn;
  const uint64_t kv_values = spec_.mla ? static_cast<uint64_t>(spec_.mla->latent_dim())
                                       : 2 * static_cast<uint64_t>(a.n_head_kv * a.head_dim);
  return spec_.layers.size() * kv_values * dtype_size(be_.kv_dtype());
}

std::vector<Tensor> DecoderModel::prefix_tensors(const SequenceState& prefix) const {
  std::vector<Tensor> out;
  for (const KvLayer& kv : static_cast<const DecoderState&>(prefix).kv) {
    out.push_back(kv.k);
    if (!kv.v.empty()) out.push_back(kv.v);  // MLA's latent cache has no v
  }
  return out;
}

void DecoderModel::copy_prefix(const SequenceState& src_base, SequenceState& dst_base, int64_t from, int64_t n,
                               const StateSnapshot* at) {
  check_prefix_copy(src_base, dst_base, from, n, at);
  const auto& src = static_cast<const DecoderState&>(src_base);
  auto& dst = static_cast<DecoderState&>(dst_base);
  settle(dst);  // a step enqueued ahead on dst writes its row before the copy lands
  for (size_t l = 0; l < dst.kv.size(); ++l) copy_kv_rows(be_, src.kv[l], dst.kv[l], from, n);
  dst.n_past = n;
}

bool DecoderModel::step_graph_eligible() const {
  if (!be_.graphs_enabled() || expert_provider_ || routing_observer_ || routing_replay_) return false;
  for (size_t l = 0; l < spec_.layers.size(); ++l)
    if (spec_.layers[l].moe && !expert_tables_[l]) return false;  // host routing inside
  return true;
}

void DecoderModel::forward(std::span<const int32_t> tokens, SequenceState& state_base, std::span<float> logits,
                           bool all_logits) {
  auto& state = static_cast<DecoderState&>(state_base);
  const int64_t n = static_cast<int64_t>(tokens.size());
  check_forward_inputs(tokens, state, logits, all_logits);

  settle(state);
  if (n == 1 && step_graph_eligible()) {
    // One decode token: replay the captured step. Only the token and its position go to the
    // device; only the logits come back.
    replay_step(state, &tokens[0], nullptr, 0);
    state.n_past += 1;
    be_.to_host(state.step_logits, logits.data());
    return;
  }

  be_.to_host(forward_eager(tokens, state, all_logits), logits.data());
  if (expert_provider_) expert_provider_->forward_done();
}

Tensor DecoderModel::forward_eager(std::span<const int32_t> tokens, SequenceState& state_base, bool all_logits) {
  auto& state = static_cast<DecoderState&>(state_base);
  const int64_t n = static_cast<int64_t>(tokens.size());
  Tensor x = be_.alloc(DType::f32, {n, spec_.info.n_embd});  // [n, n_embd] residual stream
  be_.get_rows(w_.tok_embd, tokens, x);
  Tensor out = eager_logits(state, x, all_logits);
  state.n_past += n;
  return out;
}

Tensor DecoderModel::eager_logits(SequenceState& state_base, const Tensor& x, bool all_logits) {
  auto& state = static_cast<DecoderState&>(state_base);
  const int64_t n = x.rows();
  const auto [cos, sin] = state_rope(state, n);
  forward_layers(state, x, cos, sin, Tensor{});
  Tensor xs = all_logits ? x : x.slice_rows(n - 1, 1);
  Tensor out = be_.alloc(DType::f32, {xs.rows(), spec_.info.n_vocab});
  final_logits(xs, out);
  return out;
}

int32_t DecoderModel::forward_sample_eager(int32_t token, SequenceState& state_base, const SampleRule& rule,
                                           int64_t n_valid, int64_t draw53, std::optional<int64_t> next_draw53) {
  auto& state = static_cast<DecoderState&>(state_base);
  DecodePhase decode(*this);
  const bool readbacks = state.drawn[0] != nullptr;  // a backend with graphs (CUDA) has them
  int readback = 0;
  if (state.ahead_is(token, rule, n_valid, draw53)) {
    readback = state.ahead->readback;
    state.ahead.reset();
    state.n_past += 1;
  } else {
    settle(state);
    const Tensor logits = forward_eager(std::span<const int32_t>(&token, 1), state, false);
    Tensor draw = be_.alloc(DType::i64, {1});
    be_.from_host(draw, &draw53);
    if (!readbacks) {  // no readbacks: the token comes back through a synchronizing copy
      Tensor next = be_.alloc(DType::i32, {1});
      be_.sample(logits, n_valid, rule, draw, next);
      int32_t id = -1;
      be_.to_host(next, &id);
      if (expert_provider_) expert_provider_->forward_done();
      return id;
    }
    be_.sample(logits, n_valid, rule, draw, state.step_token);
    readback = state.begin_readback();
  }
  // With a provider whose forwards may overlap (the CUDA streamer): the next step goes in
  // before this one's token is read, from the token it leaves on the device (step_token), as
  // the replayed graph's does below; its n_past is the caller's, as there. Not with a routing
  // observer, which would see the routing of a step the caller may drop, nor without a
  // provider (a family routed on the host waits for each layer's router on the way).
  if (next_draw53 && readbacks && state.n_past < state.n_ctx && expert_provider_ &&
      expert_provider_->forwards_overlap() && !routing_observer_) {
    Tensor x = be_.alloc(DType::f32, {1, spec_.info.n_embd});
    be_.get_rows_at(w_.tok_embd, state.step_token, x);
    const Tensor logits = eager_logits(state, x, false);
    be_.from_host(state.step_draw, &*next_draw53);
    be_.sample(logits, n_valid, rule, state.step_draw, state.step_token);
    state.ahead = DecoderState::AheadStep{state.n_past, -1, state.begin_readback(), rule, n_valid, *next_draw53};
  }
  int32_t next = -1;
  state.drawn[readback]->end(&next);
  if (state.ahead) {
    if (expert_provider_) expert_provider_->forward_checked();
    if (next < 0) settle(state);  // the step ahead ran a token that was never drawn: drop it
    else state.ahead->token = next;
  } else if (expert_provider_) {
    expert_provider_->forward_done();
  }
  return next;
}

int32_t DecoderModel::forward_sample(int32_t token, SequenceState& state_base, const SampleRule& rule,
                                     int64_t n_valid, int64_t draw53, std::optional<int64_t> next_draw53) {
  auto& state = static_cast<DecoderState&>(state_base);
  check_step_inputs(std::span<const int32_t>(&token, 1), state);
  SLUICE_CHECK(n_valid > 0 && n_valid <= spec_.info.n_vocab, Status::invalid_argument, "forward_sample: n_valid ",
               n_valid, " outside [1, ", spec_.info.n_vocab, "]");
  if (!step_graph_eligible()) return forward_sample_eager(token, state, rule, n_valid, draw53, next_draw53);
  // This step: already enqueued by the call before (the step ahead, which ran the token that
  // call returned, at this position, with this draw), or enqueued now.
  int readback = 0;
  if (state.ahead_is(token, rule, n_valid, draw53)) {
    readback = state.ahead->readback;
    state.ahead.reset();
  } else {
    settle(state);
    be_.from_host(state.step_draw, &draw53);
    replay_step(state, &token, &rule, n_valid);
    readback = state.begin_readback();
  }
  state.n_past += 1;
  // The next step (its draw given) goes in before this one's token is read, from the token it
  // leaves on the device, so that the GPU does not wait for the host between steps; its draw
  // is copied in after this step's graph read its own. If the caller stops here, that step's
  // work is dropped (its KV rows lie past n_past, where the next step writes before it reads).
  if (next_draw53 && state.n_past < state.n_ctx) {
    be_.from_host(state.step_draw, &*next_draw53);
    replay_step(state, nullptr, &rule, n_valid);
    state.ahead = DecoderState::AheadStep{state.n_past, -1, state.begin_readback(), rule, n_valid, *next_draw53};
  }
  int32_t next = -1;
  state.drawn[readback]->end(&next);
  if (state.ahead) {
    if (next < 0) settle(state);  // the step ahead ran a token that was never drawn: drop it
    else state.ahead->token = next;
  }
  return next;
}

RopeTables DecoderModel::state_rope(SequenceState& state_base, int64_t n) {
  auto& state = static_cast<DecoderState&>(state_base);
  const int64_t half = spec_.rope.rot_dim / 2, end = state.n_past + n;
  SLUICE_CHECK(end <= state.n_ctx, Status::internal, "rope rows up to ", end, " past the context (", state.n_ctx, ")");
  if (state.rope_cos.empty()) {
    state.rope_cos = be_.alloc(DType::f32, {state.n_ctx, half});
    state.rope_sin = be_.alloc(DType::f32, {state.n_ctx, half});
  }
  if (end > state.rope_filled) {
    const int64_t lo = state.rope_filled, hi = std::min(state.n_ctx, std::max(end, lo + kRopeFill));
    std::vector<int64_t> pos(static_cast<size_t>(hi - lo));
    std::iota(pos.begin(), pos.end(), lo);
    std::vector<float> cos_h, sin_h;
    rope_tables(spec_.rope, pos, cos_h, sin_h);
    // kRopeFill rows a copy: a prompt's rows too go through the asynchronous copy slots.
    for (int64_t r = lo; r < hi; r += kRopeFill) {
      const int64_t m = std::min(kRopeFill, hi - r);
      const size_t at = static_cast<size_t>((r - lo) * half);
      be_.from_host(state.rope_cos.slice_rows(r, m), cos_h.data() + at);
      be_.from_host(state.rope_sin.slice_rows(r, m), sin_h.data() + at);
    }
    state.rope_filled = hi;
  }
  return RopeTables{state.rope_cos.slice_rows(state.n_past, n), state.rope_sin.slice_rows(state.n_past, n)};
}

void DecoderModel::settle(SequenceState& state_base) {
  auto& state = static_cast<DecoderState&>(state_base);
  if (!state.ahead) return;
  const int readback = state.ahead->readback;
  state.ahead.reset();
  int32_t unused = -1;
  state.drawn[readback]->end(&unused);  // waits for the step ahead
}

void DecoderModel::replay_step(SequenceState& state_base, const int32_t* token, const SampleRule* rule,
                               int64_t n_valid) {
  auto& state = static_cast<DecoderState&>(state_base);
  const int64_t d = spec_.info.n_embd;
  state_rope(state, 1);  // the graph reads the position's row of the state's tables
  const int32_t pos = static_cast<int32_t>(state.n_past);
  if (token) be_.from_host(state.step_token, token);
  be_.from_host(state.step_pos, &pos);
  std::unique_ptr<BackendGraph>& graph = rule ? state.sample_graph : state.step_graph;
  if (rule && graph && !(same_rule(*rule, state.sample_rule) && n_valid == state.sample_n_valid))
    graph.reset();  // captured for another rule: capture again
  if (!graph) {
    be_.graph_begin();
    try {
      const int64_t half = spec_.rope.rot_dim / 2;
      Tensor x = be_.alloc(DType::f32, {1, d});
      be_.get_rows_at(w_.tok_embd, state.step_token, x);
      Tensor cos = be_.alloc(DType::f32, {1, half}), sin = be_.alloc(DType::f32, {1, half});
      be_.get_rows_at(state.rope_cos, state.step_pos, cos);
      be_.get_rows_at(state.rope_sin, state.step_pos, sin);
      forward_layers(state, x, cos, sin, state.step_pos);
      final_logits(x, state.step_logits);
      if (rule) be_.sample(state.step_logits, n_valid, *rule, state.step_draw, state.step_token);
    } catch (...) {
      be_.graph_end();  // ends the capture; the partial graph is dropped
      throw;
    }
    graph = be_.graph_end();
    if (rule) {
      state.sample_rule = *rule;
      state.sample_n_valid = n_valid;
    }
  }
  be_.graph_launch(*graph);
}

void DecoderModel::forward_layers(SequenceState& state_base, const Tensor& x, const Tensor& cos, const Tensor& sin,
                                  const Tensor& positions) {
  auto& state = static_cast<DecoderState&>(state_base);
  run_layers(x, state.n_past, [&](size_t l, const Tensor& h, const Tensor& y, const ResidualNorm& then) {
    if (spec_.mla)
      mla_attention_block(be_, *spec_.mla, layer_rope_[l], w_.layers[l].mla, h, state.kv[l].k, state.n_past, cos, sin,
                          y, positions, &then);
    else
      attention_block(be_, layer_attn_[l], layer_rope_[l], w_.layers[l].attn, h, state.kv[l], state.n_past, cos, sin,
                      y, positions, &then);
  });
}

void DecoderModel::run_layers(const Tensor& x, int64_t first_position, const AttentionFn& attention) {
  const int64_t n = x.rows(), d = spec_.info.n_embd;
  Tensor h = be_.alloc(DType::f32, {n, d});
  Tensor y = be_.alloc(DType::f32, {n, d});
  // Each residual add is fused with the norm that follows it (h = norm(x += y)); after
  // attention, also with its output projection.
  if (!spec_.layers.empty()) be_.rms_norm(x, w_.layers[0].attn_norm, spec_.norm_eps, h);
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const DecoderLayerWeights& lw = w_.layers[l];
    attention(l, h, y, ResidualNorm{x, lw.ffn_norm, spec_.norm_eps, h});
    if (spec_.layers[l].moe) {
      const int64_t next = next_moe_[l];
      moe_routed_half(be_,
                      {static_cast<int64_t>(l), moe_index_[l], first_position, &spec_.router, lw.router, lw.router_bias,
                       next >= 0 ? w_.layers[static_cast<size_t>(next)].router : Tensor{},
                       next >= 0 ? w_.layers[static_cast<size_t>(next)].router_bias : Tensor{}, &lw.experts,
                       expert_tables_[l].get(), spec_.expert_math, forward_phase_, next, routing_predict_next_, {}, {},
                       lw.router_score_bias,
                       next >= 0 ? w_.layers[static_cast<size_t>(next)].router_score_bias : Tensor{},
                       routing_replay_.get()},
                      expert_provider_.get(), routing_observer_, h, y);
      if (!lw.shared.gate.empty()) {  // y += shared(h) (Llama 4: the same sum as shared + routed)
        Tensor s = be_.alloc(DType::f32, {n, d});
        swiglu_mlp(be_, lw.shared, h, s);
        be_.add(y, s);
      }
    } else {
      swiglu_mlp(be_, lw.mlp, h, y);
    }
    if (l + 1 < spec_.layers.size()) be_.add_rms_norm(x, y, w_.layers[l + 1].attn_norm, spec_.norm_eps, h);
    else be_.add(x, y);
  }
}

void DecoderModel::forward_batch(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                                 std::span<float> logits) {
  check_batch_inputs(tokens, states, logits);
  for (SequenceState* s : states) settle(*s);
  DecodePhase decode(*this);
  if (tokens.size() == 1) {  // one sequence: its own step (the replayed graph where there is one)
    forward(tokens, *states[0], logits.first(static_cast<size_t>(spec_.info.n_vocab)), false);
    return;
  }
  if (!step_graph_eligible()) {
    forward_batch_eager(tokens, states, logits);
    return;
  }
  be_.to_host(replay_batch(tokens, states, {}, 0, {}).logits, logits.data());
}

void DecoderModel::forward_batch_sample(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                                        std::span<const SampleRule> rules, int64_t n_valid,
                                        std::span<const int64_t> draw53, std::span<int32_t> next) {
  if (tokens.size() == 1 || !step_graph_eligible()) {
    Model::forward_batch_sample(tokens, states, rules, n_valid, draw53, next);
    return;
  }
  check_batch_sample_inputs(tokens, states, rules, n_valid, draw53, next);
  for (SequenceState* s : states) settle(*s);
  DecodePhase decode(*this);
  be_.to_host(replay_batch(tokens, states, rules, n_valid, draw53).next, next.data());
}

DecoderModel::BatchGraph& DecoderModel::replay_batch(std::span<const int32_t> tokens,
                                                     std::span<SequenceState* const> states,
                                                     std::span<const SampleRule> rules, int64_t n_valid,
                                                     std::span<const int64_t> draw53) {
  const int64_t B = static_cast<int64_t>(tokens.size()), d = spec_.info.n_embd, V = spec_.info.n_vocab;
  const bool sampled = !rules.empty();
  std::vector<uint64_t> ids;
  std::vector<int32_t> positions;
  int64_t max_ctx = 0;
  for (SequenceState* s : states) {
    ids.push_back(static_cast<DecoderState&>(*s).id);
    positions.push_back(static_cast<int32_t>(s->n_past));
    max_ctx = std::max(max_ctx, s->n_ctx);
  }
  if (max_ctx > batch_rope_rows_) {  // graphs read the tables: the old ones go with them
    batch_graphs_.clear();
    upload_rope_tables(be_, spec_.rope, max_ctx, batch_rope_cos_, batch_rope_sin_);
    batch_rope_rows_ = max_ctx;
  }
  auto matches = [&](const BatchGraph& g) {
    if (g.state_ids != ids || g.sampled != sampled) return false;
    if (!sampled) return true;
    if (g.n_valid != n_valid) return false;
    for (size_t b = 0; b < rules.size(); ++b)
      if (!same_rule(g.rules[b], rules[b])) return false;
    return true;
  };
  BatchGraph* g = nullptr;
  for (auto& kept : batch_graphs_)
    if (matches(*kept)) g = kept.get();
  if (!g) {
    if (batch_graphs_.size() >= kBatchGraphs)
      batch_graphs_.erase(std::min_element(batch_graphs_.begin(), batch_graphs_.end(), [](const auto& a, const auto& b) {
        return a->last_use < b->last_use;
      }));
    auto fresh = std::make_unique<BatchGraph>();
    fresh->state_ids = ids;
    fresh->sampled = sampled;
    fresh->rules.assign(rules.begin(), rules.end());
    fresh->n_valid = n_valid;
    fresh->tokens = be_.alloc(DType::i32, {B});
    fresh->positions = be_.alloc(DType::i32, {B});
    fresh->logits = be_.alloc(DType::f32, {B, V});
    if (sampled) {
      fresh->draws = be_.alloc(DType::i64, {B});
      fresh->next = be_.alloc(DType::i32, {B});
    }
    batch_graphs_.push_back(std::move(fresh));
    g = batch_graphs_.back().get();
  }
  // The inputs before a capture too: capturing may run the kernels (SLUICE_CUDA_PROFILE).
  be_.from_host(g->tokens, tokens.data());
  be_.from_host(g->positions, positions.data());
  if (sampled) be_.from_host(g->draws, draw53.data());
  if (!g->graph) {
    const int64_t half = spec_.rope.rot_dim / 2;
    be_.graph_begin();
    try {
      Tensor x = be_.alloc(DType::f32, {B, d});  // [B, n_embd]: one row per sequence
      be_.get_rows_at(w_.tok_embd, g->tokens, x);
      Tensor cos = be_.alloc(DType::f32, {B, half}), sin = be_.alloc(DType::f32, {B, half});
      be_.get_rows_at(batch_rope_cos_, g->positions, cos);
      be_.get_rows_at(batch_rope_sin_, g->positions, sin);
      batch_layers(states, x, cos, sin, g->positions);
      final_logits(x, g->logits);
      // One draw launch per run of rows with the same rule.
      for (int64_t b0 = 0, b1 = 0; sampled && b0 < B; b0 = b1) {
        for (b1 = b0 + 1; b1 < B && same_rule(rules[static_cast<size_t>(b1)], rules[static_cast<size_t>(b0)]); ++b1) {
        }
        be_.sample(g->logits.slice_rows(b0, b1 - b0), n_valid, rules[static_cast<size_t>(b0)],
                   g->draws.slice_rows(b0, b1 - b0), g->next.slice_rows(b0, b1 - b0));
      }
    } catch (...) {
      be_.graph_end();        // ends the capture; the partial graph is dropped
      batch_graphs_.pop_back();  // g, the newest, has no graph
      throw;
    }
    g->graph = be_.graph_end();
  }
  be_.graph_launch(*g->graph);
  g->last_use = ++batch_graph_clock_;
  for (SequenceState* s : states) s->n_past += 1;
  return *g;
}

void DecoderModel::batch_layers(std::span<SequenceState* const> states, const Tensor& x, const Tensor& cos,
                                const Tensor& sin, const Tensor& positions) {
  std::vector<AttentionSegment> segments(states.size());
  // The routing observer sees row 0's position for the whole batch (rows are sequences here).
  run_layers(x, states[0]->n_past, [&](size_t l, const Tensor& h, const Tensor& y, const ResidualNorm& then) {
    for (size_t b = 0; b < states.size(); ++b) {
      auto& st = static_cast<DecoderState&>(*states[b]);
      segments[b] = AttentionSegment{static_cast<int64_t>(b), 1, &st.kv[l], st.n_past};
    }
    if (spec_.mla)
      mla_attention_block_segments(be_, *spec_.mla, layer_rope_[l], w_.layers[l].mla, h, segments, cos, sin, y,
                                   positions, &then);
    else
      attention_block_segments(be_, layer_attn_[l], layer_rope_[l], w_.layers[l].attn, h, segments, cos, sin, y,
                               positions, &then);
  });
}

void DecoderModel::forward_batch_eager(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                                       std::span<float> logits) {
  const int64_t B = static_cast<int64_t>(tokens.size()), d = spec_.info.n_embd, V = spec_.info.n_vocab;
  std::vector<int64_t> positions(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) positions[static_cast<size_t>(b)] = states[static_cast<size_t>(b)]->n_past;
  const auto [cos, sin] = rope_tables_at(be_, spec_.rope, positions);
  Tensor x = be_.alloc(DType::f32, {B, d});  // [B, n_embd]: one row per sequence
  be_.get_rows(w_.tok_embd, tokens, x);
  batch_layers(states, x, cos, sin, Tensor{});
  for (SequenceState* s : states) s->n_past += 1;
  Tensor out = be_.alloc(DType::f32, {B, V});
  final_logits(x, out);
  be_.to_host(out, logits.data());
  if (expert_provider_) expert_provider_->forward_done();
}

void DecoderModel::final_logits(const Tensor& x, const Tensor& out) {
  Tensor xn = be_.alloc(DType::f32, {x.rows(), spec_.info.n_embd});
  be_.rms_norm(x, w_.output_norm, spec_.norm_eps, xn);
  be_.matmul(xn, w_.output, out);
}

}  // namespace sluice
