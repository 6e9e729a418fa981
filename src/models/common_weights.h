// Weight declarations shared by the decoder families: attention projections and norms, and
// routed experts in either checkpoint layout (one tensor per expert and projection, as real
// checkpoints store them, or the fused [n_expert, 2 n_ff, n_embd] / [n_expert, n_embd, n_ff]
// tensors of transformers 5's in-memory layout).
#pragma once

#include <string>
#include <vector>

#include "models/blocks.h"
#include "models/weight_loader.h"

namespace sluice {

struct ExpertNames {
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
};

// prefix ends with '.', e.g. "model.layers.3.self_attn.".
AttentionWeights load_attention(WeightLoader& wl, const std::string& prefix, const AttentionSpec& spec,
                                bool bias, const std::string& q_norm = "q_norm", const std::string& k_norm = "k_norm");

// prefix ends with '.', e.g. "model.layers.3.mlp.experts.".
std::vector<ExpertWeights> load_experts(WeightLoader& wl, const std::string& prefix, int64_t n_expert,
                                        int64_t n_embd, int64_t n_ff, const ExpertNames& names = {});

// Routed experts stored inputs first (Llama 4, gpt-oss): prefix + "gate_up_proj" [E, n_embd,
// 2 n_ff] whose gate and up columns come in halves (gate f at column f, up f at n_ff + f) or
// interleaved (gate f at 2f, up f at 2f + 1), and prefix + "down_proj" [E, n_ff, n_embd]. Each
// expert's gate / up [n_ff, n_embd] and down [n_embd, n_ff] in the stored dtype, transposed at
// load; in a dry run (WeightSource::values_needed false) views of the stored bytes instead.
// A pack's experts go through load_experts.
std::vector<ExpertWeights> load_experts_inputs_first(WeightLoader& wl, const std::string& prefix, int64_t n_expert,
                                                     int64_t n_embd, int64_t n_ff, bool interleaved);

// The output head [n_vocab, n_embd]: the matrix `name` ("lm_head.weight"), or with tied
// embeddings `tok_embd` itself (a tied checkpoint may still carry the copy: skipped).
Tensor load_output_head(WeightLoader& wl, const std::string& name, const Tensor& tok_embd, bool tied, int64_t n_vocab,
                        int64_t n_embd);

// A dense SwiGLU MLP: prefix + gate/up/down + ".weight".
ExpertWeights load_mlp(WeightLoader& wl, const std::string& prefix, int64_t n_embd, int64_t n_ff,
                       const ExpertNames& names = {});

}  // namespace sluice
