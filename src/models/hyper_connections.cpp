// Hyper-connection gated residuals.
#include "models/hyper_connections.h"

#include "models/hybrid_weights.h"

namespace sluice {

HyperWeights load_hyper(WeightLoader& wl, const std::string& p, const HyperSpec& s, bool inject) {
  HyperWeights w;
  w.norm = take_norm_plus_one(wl, p + "hc_norm.weight", {s.width()});
  w.down = wl.take(p + "input_mix_weight_down.weight", {s.lowrank, s.width()});
  w.up = wl.take(p + "input_mix_weight_up.weight", {s.width(), s.lowrank});
  if (inject) w.inject = wl.take(p + "block_inject_weight.weight", {s.n_stream, s.width()});
  return w;
}

void hyper_mix_block(Backend& be, const HyperSpec& s, const HyperWeights& w, const Tensor& x, const Tensor& mixed,
                     const Tensor& inj) {
  const int64_t n = x.rows();
  const float div = static_cast<float>(s.n_stream);
  Tensor xn = be.alloc(DType::f32, {n, s.width()});
  be.rms_norm_groups(x, w.norm, s.norm_eps, s.n_embd, xn);
  Tensor low = be.alloc(DType::f32, {n, s.lowrank});
  be.matmul(xn, w.down, low);
  be.activate(low, Activation::silu, div);
  Tensor mix = be.alloc(DType::f32, {n, s.width()});
  be.matmul(low, w.up, mix);
  be.hyper_mix(xn, mix, mixed);
  if (!w.inject.empty()) {
    be.matmul(xn, w.inject, inj);
    be.activate(inj, Activation::sigmoid, div, 2.0f);
  }
}

void hyper_expand(Backend& be, const HyperSpec& s, const Tensor& e, const Tensor& x) {
  for (int64_t st = 0; st < s.n_stream; ++st) be.copy_cols(e, 0, x, st * s.n_embd, s.n_embd);
}

}  // namespace sluice
