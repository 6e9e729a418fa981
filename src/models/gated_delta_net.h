// Gated DeltaNet: the linear-attention token mixer of qwen3_next, qwen3_5(_moe) and qwen4_exp.
//   qkv = conv1d_silu(h W_qkv^T) (causal depthwise, state carried), split into q, k, v heads
//   g = -exp(A_log) softplus(h W_a^T + dt_bias), beta = sigmoid(h W_b^T)
//   o = gated_delta_rule(q, k, v, g, beta)   (chunked form for prefill, recurrent for decode)
//   out = (rms_norm(o) w_norm * act(h W_z^T)) W_out^T   (per value head; act = silu or sigmoid)
#pragma once

#include <cstdint>
#include <string>

#include "backends/backend.h"
#include "models/weight_loader.h"

namespace sluice {

struct DeltaNetSpec {
  int64_t n_embd = 0;
  int64_t n_k_head = 0, n_v_head = 0;      // linear_num_key_heads, linear_num_value_heads
  int64_t k_head_dim = 0, v_head_dim = 0;  // linear_key_head_dim, linear_value_head_dim
  int64_t conv_kernel = 0;                 // linear_conv_kernel_dim
  float norm_eps = 1e-6f;
  Activation out_gate = Activation::silu;  // the gated RMSNorm's activation of z
  int64_t chunk_size = 64;                 // prefill chunk of the delta rule (transformers': 64)

  int64_t key_dim() const { return n_k_head * k_head_dim; }
  int64_t value_dim() const { return n_v_head * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

struct DeltaNetWeights {
  Tensor qkv;           // [conv_dim, n_embd]: q rows, k rows, v rows (head-major in each)
  Tensor z;             // [value_dim, n_embd]
  Tensor b, a;          // [n_v_head, n_embd]
  Tensor conv;          // f32 [conv_dim, conv_kernel]
  Tensor A_log, dt_bias;  // f32 [n_v_head]
  Tensor norm;          // [v_head_dim], applied as is (this norm is not zero-centered)
  Tensor out;           // [n_embd, value_dim]
};

// Per sequence and layer.
struct DeltaNetState {
  Tensor conv;       // f32 [conv_kernel - 1, conv_dim]: the latest conv inputs, oldest first
  Tensor recurrent;  // f32 [n_v_head, k_head_dim, v_head_dim]
};

DeltaNetState new_delta_net_state(Backend& be, const DeltaNetSpec& spec);
void clear_delta_net_state(Backend& be, DeltaNetState& st);

// prefix ends with '.', e.g. "model.layers.0.linear_attn.". Reads either layout: qwen3_5's
// in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, or qwen3_next's in_proj_qkvz / in_proj_ba
// (grouped by key head: q, k, v, z and b, a of each), regrouped here into the former.
DeltaNetWeights load_delta_net(WeightLoader& wl, const std::string& prefix, const DeltaNetSpec& spec);

// out[n, n_embd] for h[n, n_embd], the next n tokens of the sequence whose state is st.
void delta_net_block(Backend& be, const DeltaNetSpec& spec, const DeltaNetWeights& w, const Tensor& h,
                     DeltaNetState& st, const Tensor& out);

}  // namespace sluice
