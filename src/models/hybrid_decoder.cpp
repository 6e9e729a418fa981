// HybridModel: state and forward pass.
#include "models/hybrid_decoder.h"

#include <numeric>

namespace sluice {

void HybridState::reset() {
  n_past = 0;
  for (auto& d : delta)
    if (!d.conv.empty()) clear_delta_net_state(be_, d);
  for (auto& p : ple)
    if (!p.conv.empty()) clear_ple_state(be_, *ple_spec, p);
  for (auto& a : attn) a.qsa.n_blocks = 0;  // the KV cache and keys are overwritten before they are read
}

HybridModel::HybridModel(Backend& backend, HybridSpec spec, HybridWeights weights)
    : be_(backend), spec_(std::move(spec)), w_(std::move(weights)) {
  info_ = spec_.info;
  info_.n_expert = spec_.router.n_expert;
  info_.n_expert_used = spec_.router.n_expert_used;
  std::vector<bool> is_moe;
  for (const auto& layer : spec_.layers) is_moe.push_back(layer.moe);
  index_moe_layers(is_moe, moe_index_, next_moe_);
  expert_tables_ = make_expert_tables(be_, w_.layers, spec_.router, spec_.expert_math);
}

std::unique_ptr<SequenceState> HybridModel::new_state(int64_t n_ctx) { return make_state(n_ctx, true); }

std::unique_ptr<SequenceState> HybridModel::new_prefix_state(int64_t n_tokens) { return make_state(n_tokens, false); }

std::unique_ptr<SequenceState> HybridModel::make_state(int64_t n_ctx, bool recurrent) {
  SLUICE_CHECK(n_ctx > 0, Status::invalid_argument, "context size must be positive");
  auto st = std::make_unique<HybridState>(be_);
  st->n_ctx = n_ctx;
  st->ple_spec = &spec_.ple;
  const size_t L = spec_.layers.size();
  st->attn.resize(L);
  st->delta.resize(L);
  st->ple.resize(L);
  for (size_t l = 0; l < L; ++l) {
    const HybridLayerSpec& ls = spec_.layers[l];
    if (ls.mixer == TokenMixer::attention) st->attn[l] = new_gated_attention_state(be_, spec_.attn, n_ctx);
    else if (recurrent) st->delta[l] = new_delta_net_state(be_, spec_.delta);
    if (ls.ple && recurrent) st->ple[l] = new_ple_state(be_, spec_.ple);
  }
  return st;
}

namespace {

// The recurrent part of a HybridState at one position: the DeltaNet conv and recurrent
// states, PLE's conv state and token history (flat copies; empty where a layer has none).
class RecurrentCopy final : public StateSnapshot {
 public:
  RecurrentCopy(Backend& be, const HybridState& st) {
    n_past = st.n_past;
    for (size_t l = 0; l < st.delta.size(); ++l) {
      saved_.push_back(copy_of(be, st.delta[l].conv));
      saved_.push_back(copy_of(be, st.delta[l].recurrent));
      saved_.push_back(copy_of(be, st.ple[l].conv));
      history_.push_back(st.ple[l].history);
    }
  }
  std::vector<Tensor> tensors() const override { return saved_; }
  std::unique_ptr<StateSnapshot> with_tensors(std::vector<Tensor> tensors) const override {
    SLUICE_CHECK(tensors.size() == saved_.size(), Status::internal, "snapshot: ", tensors.size(), " tensors for ",
                 saved_.size());
    auto copy = std::make_unique<RecurrentCopy>(*this);
    copy->saved_ = std::move(tensors);
    return copy;
  }
  // Puts it back into st (a state for forward: a prefix state, which has no recurrent part,
  // is left as is).
  void restore(Backend& be, HybridState& st) const {
    for (size_t l = 0; l < st.delta.size(); ++l) {
      copy_back(be, saved_[3 * l], st.delta[l].conv);
      copy_back(be, saved_[3 * l + 1], st.delta[l].recurrent);
      copy_back(be, saved_[3 * l + 2], st.ple[l].conv);
      if (!st.ple[l].conv.empty()) st.ple[l].history = history_[l];
    }
  }

 private:
  static Tensor copy_of(Backend& be, const Tensor& t) {
    if (t.empty()) return {};
    Tensor c = be.alloc(t.dtype, {t.numel()});
    be.copy(t.reshape({t.numel()}), c);
    return c;
  }
  static void copy_back(Backend& be, const Tensor& saved, const Tensor& t) {
    if (!t.empty() && !saved.empty()) be.copy(saved, t.reshape({t.numel()}));
  }

  std::vector<Tensor> saved_;  // per layer: delta conv, delta recurrent, PLE conv
  std::vector<std::vector<int32_t>> history_;  // per layer: PLE's token history
};

// The recurrent copy and QSA's count of finished blocks, which a decode step changes in place.
class HybridStepUndo final : public StepUndo {
 public:
  HybridStepUndo(Backend& be, HybridState& st) : be_(be), st_(st), copy_(be, st) {
    for (GatedAttentionState& a : st.attn) n_blocks_.push_back(a.qsa.n_blocks);
  }
  void restore() override {
    copy_.restore(be_, st_);
    for (size_t l = 0; l < st_.attn.size(); ++l) st_.attn[l].qsa.n_blocks = n_blocks_[l];
  }

 private:
  Backend& be_;
  HybridState& st_;
  RecurrentCopy copy_;
  std::vector<int64_t> n_blocks_;
};

}  // namespace

std::unique_ptr<StepUndo> HybridModel::save_for_rerun(SequenceState& state) {
  return std::make_unique<HybridStepUndo>(be_, static_cast<HybridState&>(state));
}

uint64_t HybridModel::snapshot_bytes() const {
  const DeltaNetSpec& d = spec_.delta;
  const PleSpec& p = spec_.ple;
  uint64_t floats = 0, ints = 0;
  for (const HybridLayerSpec& ls : spec_.layers) {
    if (ls.mixer == TokenMixer::delta_net)
      floats += static_cast<uint64_t>((d.conv_kernel - 1) * d.conv_dim() + d.n_v_head * d.k_head_dim * d.v_head_dim);
    if (ls.ple) {
      floats += static_cast<uint64_t>(p.conv_state_rows() * p.width());
      ints += static_cast<uint64_t>(p.context());
    }
  }
  return floats * sizeof(float) + ints * sizeof(int32_t);
}

std::unique_ptr<StateSnapshot> HybridModel::snapshot(const SequenceState& state) {
  return std::make_unique<RecurrentCopy>(be_, static_cast<const HybridState&>(state));
}

std::vector<Tensor> HybridModel::prefix_tensors(const SequenceState& prefix) const {
  std::vector<Tensor> out;
  for (const GatedAttentionState& a : static_cast<const HybridState&>(prefix).attn) {
    if (a.kv.k.empty()) continue;  // not an attention layer
    out.push_back(a.kv.k);
    out.push_back(a.kv.v);
    if (!a.qsa.keys.empty()) {
      out.push_back(a.qsa.keys);
      out.push_back(a.qsa.block_keys);
    }
  }
  return out;
}

void HybridModel::copy_prefix(const SequenceState& src_base, SequenceState& dst_base, int64_t from, int64_t n,
                              const StateSnapshot* at) {
  check_prefix_copy(src_base, dst_base, from, n, at);
  const auto& src = static_cast<const HybridState&>(src_base);
  auto& dst = static_cast<HybridState&>(dst_base);
  const int64_t c = spec_.attn.qsa ? spec_.attn.qsa->compress_ratio : 1;
  for (size_t l = 0; l < dst.attn.size(); ++l) {
    if (spec_.layers[l].mixer != TokenMixer::attention) continue;
    copy_kv_rows(be_, src.attn[l].kv, dst.attn[l].kv, from, n);
    if (!spec_.attn.qsa) continue;
    // Raw keys per token; block keys per finished block of c tokens.
    copy_rows(be_, src.attn[l].qsa.keys, dst.attn[l].qsa.keys, from, n);
    copy_rows(be_, src.attn[l].qsa.block_keys, dst.attn[l].qsa.block_keys, from / c, n / c);
    dst.attn[l].qsa.n_blocks = n / c;
  }
  if (at) static_cast<const RecurrentCopy&>(*at).restore(be_, dst);
  dst.n_past = n;
}

uint64_t HybridModel::context_bytes(int64_t n_ctx) const {
  // Per token of an attention layer: K and V rows [n_head_kv, head_dim] of f32, and with QSA
  // its raw key [head_dim] (the block keys, one per compress_ratio tokens, are counted whole).
  const AttentionSpec& a = spec_.attn.attn;
  uint64_t per_token = 0;
  for (const HybridLayerSpec& ls : spec_.layers) {
    if (ls.mixer != TokenMixer::attention) continue;
    per_token += 2 * static_cast<uint64_t>(a.n_head_kv * a.head_dim) * sizeof(float);
    if (spec_.attn.qsa) per_token += 2 * static_cast<uint64_t>(spec_.attn.qsa->head_dim) * sizeof(float);
  }
  return saturating_product(per_token, n_ctx);
}

void HybridModel::feed_forward(size_t l, int64_t n_past, const Tensor& h, const Tensor& y) {
  const HybridLayerWeights& lw = w_.layers[l];
  const int64_t n = h.rows();
  if (!spec_.layers[l].moe) {
    swiglu_mlp(be_, lw.mlp, h, y);
    return;
  }
  const int64_t next = next_moe_[l];
  moe_routed_half(be_,
                  {static_cast<int64_t>(l), moe_index_[l], n_past, &spec_.router, lw.router, Tensor{},
                   next >= 0 ? w_.layers[static_cast<size_t>(next)].router : Tensor{}, Tensor{}, &lw.experts,
                   expert_tables_[l].get(), spec_.expert_math, forward_phase_, next, routing_predict_next_, {}, {},
                   {}, {}, routing_replay_.get()},
                  expert_provider_.get(), routing_observer_, h, y);
  if (spec_.n_ff_shared > 0) {
    // y += sigmoid(h w_gate) * shared_expert(h), as the reference adds it after the routed sum.
    Tensor s = be_.alloc(DType::f32, {n, spec_.info.n_embd});
    swiglu_mlp(be_, lw.shared, h, s);
    Tensor sg = be_.alloc(DType::f32, {n, 1});
    be_.matmul(h, lw.shared_gate, sg);
    be_.activate(sg, Activation::sigmoid);
    be_.mul(s, sg);
    be_.add(y, s);
  }
}

void HybridModel::forward(std::span<const int32_t> tokens, SequenceState& state_base, std::span<float> logits,
                          bool all_logits) {
  auto& st = static_cast<HybridState&>(state_base);
  const int64_t n = static_cast<int64_t>(tokens.size()), V = spec_.info.n_vocab;
  check_forward_inputs(tokens, st, logits, all_logits);
  const auto [cos, sin] = rope_tables_for(be_, spec_.rope, st.n_past, n);
  const Segment seg{0, n, &st, tokens};
  Tensor x = run_layers(tokens, std::span<const Segment>(&seg, 1), cos, sin);
  st.n_past += n;
  Tensor xs = all_logits ? x : x.slice_rows(n - 1, 1);
  Tensor out = be_.alloc(DType::f32, {xs.rows(), V});
  final_logits(xs, out);
  be_.to_host(out, logits.data());
  if (expert_provider_) expert_provider_->forward_done();
}

void HybridModel::forward_batch(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                                std::span<float> logits) {
  check_batch_inputs(tokens, states, logits);
  const int64_t B = static_cast<int64_t>(tokens.size()), V = spec_.info.n_vocab;
  DecodePhase decode(*this);
  std::vector<int64_t> positions(static_cast<size_t>(B));
  std::vector<Segment> segs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    auto* st = static_cast<HybridState*>(states[static_cast<size_t>(b)]);
    positions[static_cast<size_t>(b)] = st->n_past;
    segs[static_cast<size_t>(b)] = Segment{b, 1, st, tokens.subspan(static_cast<size_t>(b), 1)};
  }
  const auto [cos, sin] = rope_tables_at(be_, spec_.rope, positions);
  Tensor x = run_layers(tokens, segs, cos, sin);
  for (SequenceState* s : states) s->n_past += 1;
  Tensor out = be_.alloc(DType::f32, {B, V});
  final_logits(x, out);
  be_.to_host(out, logits.data());
  if (expert_provider_) expert_provider_->forward_done();
}

Tensor HybridModel::run_layers(std::span<const int32_t> tokens, std::span<const Segment> segs, const Tensor& cos,
                               const Tensor& sin) {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = spec_.info.n_embd;
  const bool hyper = spec_.hyper.n_stream > 0;
  const int64_t width = hyper ? spec_.hyper.width() : d;
  Tensor x = be_.alloc(DType::f32, {n, width});  // the residual stream(s)
  if (hyper) {
    Tensor e = be_.alloc(DType::f32, {n, d});
    be_.get_rows(w_.tok_embd, tokens, e);
    hyper_expand(be_, spec_.hyper, e, x);
  } else {
    be_.get_rows(w_.tok_embd, tokens, x);
  }
  Tensor h = be_.alloc(DType::f32, {n, d});
  Tensor y = be_.alloc(DType::f32, {n, d});
  Tensor inj = hyper ? be_.alloc(DType::f32, {n, spec_.hyper.n_stream}) : Tensor{};

  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const HybridLayerSpec& ls = spec_.layers[l];
    HybridLayerWeights& lw = w_.layers[l];
    // The token mixer reads and extends each sequence's own state: one call per segment.
    auto mix = [&](const Tensor& in, const Tensor& out) {
      for (const Segment& s : segs) {
        const Tensor in_s = in.slice_rows(s.row0, s.n), out_s = out.slice_rows(s.row0, s.n);
        if (ls.mixer == TokenMixer::attention)
          gated_attention_block(be_, spec_.attn, spec_.rope, lw.attn, in_s, s.state->attn[l], s.state->n_past,
                                cos.slice_rows(s.row0, s.n), sin.slice_rows(s.row0, s.n), out_s);
        else
          delta_net_block(be_, spec_.delta, lw.delta, in_s, s.state->delta[l], out_s);
      }
    };
    const int64_t first_position = segs.front().state->n_past;
    if (hyper) {
      if (ls.ple)
        for (const Segment& s : segs) ple_block(be_, spec_.ple, lw.ple, s.tokens, x.slice_rows(s.row0, s.n), s.state->ple[l]);
      hyper_mix_block(be_, spec_.hyper, lw.attn_hyper, x, h, inj);
      mix(h, y);
      be_.hyper_inject(x, y, inj);
      hyper_mix_block(be_, spec_.hyper, lw.ffn_hyper, x, h, inj);
      feed_forward(l, first_position, h, y);
      be_.hyper_inject(x, y, inj);
    } else {
      be_.rms_norm(x, lw.attn_norm, spec_.norm_eps, h);
      mix(h, y);
      be_.add(x, y);
      be_.rms_norm(x, lw.ffn_norm, spec_.norm_eps, h);
      feed_forward(l, first_position, h, y);
      be_.add(x, y);
    }
  }
  return x;
}

void HybridModel::final_logits(const Tensor& xs, const Tensor& out) {
  Tensor xn = be_.alloc(DType::f32, {xs.rows(), spec_.info.n_embd});
  if (spec_.hyper.n_stream > 0) hyper_mix_block(be_, spec_.hyper, w_.output_hyper, xs, xn, Tensor{});
  else be_.rms_norm(xs, w_.output_norm, spec_.norm_eps, xn);
  be_.matmul(xn, w_.output, out);
}

}  // namespace sluice
