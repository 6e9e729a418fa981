// QSA (qwen4_exp's sparse attention): an indexer picks, for every query, the token blocks it
// attends to. Keys of c = compress_ratio consecutive tokens are averaged into block keys
// (normalized, rotated at the block's first position); a query scores each complete block by
// summing relu(q_h . K_b) over its indexer heads, keeps the best budget / c blocks and always
// the uncompressed tail after the last complete block. Full attention then runs over the kept
// tokens only (transformers applies the same choice as a mask).
#pragma once

#include <cstdint>
#include <string>

#include "backends/backend.h"
#include "models/rope.h"
#include "models/weight_loader.h"

namespace sluice {

struct QsaSpec {
  int64_t n_embd = 0;
  int64_t n_head = 0;          // indexer_n_heads (one key head: indexer_kv_heads == 1)
  int64_t head_dim = 0;        // indexer_head_dim
  int64_t budget = 0;          // indexer_budget: tokens from complete blocks per query
  int64_t compress_ratio = 0;  // indexer_compress_ratio: tokens per block
  float norm_eps = 1e-6f;

  int64_t block_topk() const { return budget / compress_ratio; }
  int64_t max_tokens() const { return budget + compress_ratio - 1; }  // kept blocks + the tail
};

struct QsaWeights {
  Tensor qk;              // [(n_head + 1) * head_dim, n_embd]: query heads, then the key
  Tensor q_norm, k_norm;  // f32 [head_dim], 1 + w
};

// Per sequence and layer.
struct QsaState {
  Tensor keys;             // f32 [n_ctx, head_dim]: raw token keys (before norm and rope)
  Tensor block_keys;       // f32 [n_ctx / c, head_dim]: finished block keys
  int64_t n_blocks = 0;    // block keys computed so far
};

QsaState new_qsa_state(Backend& be, const QsaSpec& spec, int64_t n_ctx);

// prefix ends with '.', e.g. "model.language_model.layers.3.self_attn.indexer.".
QsaWeights load_qsa(WeightLoader& wl, const std::string& prefix, const QsaSpec& spec);

// The key positions each of the n tokens of h (at positions n_past..) attends to:
// i32 [n, max_tokens()], ascending, -1 padded. Appends the tokens' keys to st. cos/sin:
// the attention's rotary tables for these positions.
Tensor qsa_select_tokens(Backend& be, const QsaSpec& spec, const RopeConfig& rope, const QsaWeights& w,
                         const Tensor& h, QsaState& st, int64_t n_past, const Tensor& cos, const Tensor& sin);

}  // namespace sluice
