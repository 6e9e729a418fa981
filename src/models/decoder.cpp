// DecoderModel forward pass and its KV-cache state.
#include "models/decoder.h"

#include <numeric>

namespace sluice {
namespace {

struct DecoderState : SequenceState {
  std::vector<KvLayer> kv;
};

}  // namespace

DecoderModel::DecoderModel(Backend& backend, DecoderSpec spec, DecoderWeights weights)
    : be_(backend), spec_(std::move(spec)), w_(std::move(weights)) {
  info_ = spec_.info;
  info_.n_expert = spec_.router.n_expert;
  info_.n_expert_used = spec_.router.n_expert_used;
  std::vector<bool> is_moe;
  for (const auto& layer : spec_.layers) is_moe.push_back(layer.moe);
  index_moe_layers(is_moe, moe_index_, next_moe_);
  expert_tables_ = make_expert_tables(be_, w_.layers, spec_.router.n_expert);
}

std::unique_ptr<SequenceState> DecoderModel::new_state(int64_t n_ctx) {
  SLUICE_CHECK(n_ctx > 0, Status::invalid_argument, "context size must be positive");
  auto st = std::make_unique<DecoderState>();
  st->n_ctx = n_ctx;
  const auto& a = spec_.attn;
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    KvLayer kv{be_.alloc(DType::f32, {n_ctx, a.n_head_kv, a.head_dim}),
               be_.alloc(DType::f32, {n_ctx, a.n_head_kv, a.head_dim})};
    st->kv.push_back(std::move(kv));
  }
  return st;
}

void DecoderModel::forward(std::span<const int32_t> tokens, SequenceState& state_base, std::span<float> logits,
                           bool all_logits) {
  auto& state = static_cast<DecoderState&>(state_base);
  const int64_t n = static_cast<int64_t>(tokens.size()), d = spec_.info.n_embd, V = spec_.info.n_vocab;
  check_forward_inputs(tokens, state, logits, all_logits);

  const auto [cos, sin] = rope_tables_for(be_, spec_.rope, state.n_past, n);

  Tensor x = be_.alloc(DType::f32, {n, d});  // [n, n_embd] residual stream
  be_.get_rows(w_.tok_embd, tokens, x);
  Tensor h = be_.alloc(DType::f32, {n, d});
  Tensor y = be_.alloc(DType::f32, {n, d});

  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const DecoderLayerWeights& lw = w_.layers[l];
    be_.rms_norm(x, lw.attn_norm, spec_.norm_eps, h);
    attention_block(be_, spec_.attn, spec_.rope, lw.attn, h, state.kv[l], state.n_past, cos, sin, y);
    be_.add(x, y);
    be_.rms_norm(x, lw.ffn_norm, spec_.norm_eps, h);
    if (spec_.layers[l].moe) {
      const int64_t next = next_moe_[l];
      moe_routed_half(be_,
                      {static_cast<int64_t>(l), moe_index_[l], state.n_past, &spec_.router, lw.router,
                       next >= 0 ? w_.layers[static_cast<size_t>(next)].router : Tensor{}, &lw.experts,
                       expert_tables_[l].get()},
                      expert_provider_.get(), routing_observer_, h, y);
    } else {
      swiglu_mlp(be_, lw.mlp, h, y);
    }
    be_.add(x, y);
  }
  state.n_past += n;

  Tensor xs = all_logits ? x : x.slice_rows(n - 1, 1);
  Tensor xn = be_.alloc(DType::f32, {xs.rows(), d});
  be_.rms_norm(xs, w_.output_norm, spec_.norm_eps, xn);
  Tensor out = be_.alloc(DType::f32, {xs.rows(), V});
  be_.matmul(xn, w_.output, out);
  be_.to_host(out, logits.data());
  if (expert_provider_) expert_provider_->forward_done();
}

}  // namespace sluice
