// Hyper-connections (qwen4_exp): the residual stream is n_stream parallel streams
// x [n, n_stream * n_embd] (the embedding copied into each). Before each block a gated residual
// mixes them into the block's input and weighs how the block's output goes back:
//   xn    = grouped RMSNorm of x (one group per stream), times (1 + w)
//   mixed = mean over streams of sigmoid(silu((xn W_down^T) / n_stream) W_up^T) * xn
//   inj   = 2 sigmoid((xn W_inject^T) / n_stream)                     [n, n_stream]
//   after the block: x[:, s, :] += y * inj[:, s]
// The final mixer (no injection) turns the streams into the output head's input.
#pragma once

#include <cstdint>
#include <string>

#include "backends/backend.h"
#include "models/weight_loader.h"

namespace sluice {

struct HyperSpec {
  int64_t n_stream = 0;  // hc_count; 0: a single residual stream (no hyper-connections)
  int64_t n_embd = 0;
  int64_t lowrank = 0;   // hc_lowrank
  float norm_eps = 1e-6f;

  int64_t width() const { return n_stream * n_embd; }
};

struct HyperWeights {
  Tensor norm;    // f32 [n_stream * n_embd], 1 + w
  Tensor down;    // [lowrank, n_stream * n_embd]
  Tensor up;      // [n_stream * n_embd, lowrank]
  Tensor inject;  // [n_stream, n_stream * n_embd]; empty for the final mixer
};

// prefix ends with '.', e.g. "model.layers.0.attn_hyper_connection.".
HyperWeights load_hyper(WeightLoader& wl, const std::string& prefix, const HyperSpec& spec, bool inject);

// The streams x [n, width] as one block input mixed [n, n_embd], and (when w.inject) the
// block's injection weights inj [n, n_stream].
void hyper_mix_block(Backend& be, const HyperSpec& spec, const HyperWeights& w, const Tensor& x, const Tensor& mixed,
                     const Tensor& inj);

// x [n, width] = e [n, n_embd] in every stream.
void hyper_expand(Backend& be, const HyperSpec& spec, const Tensor& e, const Tensor& x);

}  // namespace sluice
