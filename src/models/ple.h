// Per-layer n-gram embeddings (PLE, qwen4_exp). For every token the n-grams ending at it
// (orders 2..ngram_size, none reaching back over an end-of-text token) are hashed with the
// layer's deterministic multipliers into heads_per_ngram prime-sized ranges each of one big
// embedding table; the concatenated rows e [n, embed_dim] then gate a value into every
// hyper-connection stream:
//   key = grouped_rms(e W_key^T) (1 + w)      [n, n_stream * n_embd]
//   value = e W_value^T                       [n, n_embd]
//   query = grouped_rms(x) (1 + w)            (x: the streams)
//   a_s = key_s . query_s / sqrt(n_embd);  a_s = sqrt(max(|a_s|, 1e-6)) sign(a_s)
//   gv_s = sigmoid(a_s) value;  out = gv + silu(dilated_causal_conv(grouped_rms(gv) (1 + w)))
//   x += out
// The conv is depthwise with kernel ple_conv_kernel_size and dilation ngram_size; its state
// and the last ngram_size - 1 tokens are carried per sequence.
//
// The table of the real model is ~90 GB, of which a token reads a few rows: it is reached only
// through NgramTable (row lookup by id). ResidentNgramTable serves rows from the checkpoint's
// host mapping; a pack implementation (rows read on demand through the IO engine, with a small
// row cache) plugs in behind the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "models/weight_loader.h"

namespace sluice {

class NgramTable {
 public:
  virtual ~NgramTable() = default;
  virtual int64_t n_rows() const = 0;
  virtual int64_t dim() const = 0;
  // out[i, :] = row ids[i] as f32; out is [ids.size(), dim()] on be. Ids are in [0, n_rows()).
  virtual void gather(Backend& be, std::span<const int64_t> ids, const Tensor& out) = 0;
};

// A checkpoint tensor that is (a shard of) an n-gram table: "<p>ple_embedding.ngram_embedding.weight"
// (the whole table) or "<p>ple_embedding.ngram_embedding.shard_<i>.weight". `table` is the name
// up to and including "ngram_embedding." (what NgramTable sources are keyed by). Gemma 4's
// per-layer input embeddings, "<p>embed_tokens_per_layer.weight" ([V_ple, n_layer ple], a
// token reads one row), are such a table too (`table`: "<p>embed_tokens_per_layer."): packs
// hold both kinds in ple.<dtype>.bin, read row by row.
struct NgramTableTensor {
  std::string table;
  int64_t shard = 0;     // i; 0 for the whole table
  bool sharded = false;
};
std::optional<NgramTableTensor> ngram_table_tensor(const std::string& name);

// Rows from host tensors (f32/bf16/f16 [rows_i, dim], concatenated by row in order), copied
// to the backend per lookup: never uploaded whole.
class ResidentNgramTable final : public NgramTable {
 public:
  explicit ResidentNgramTable(std::vector<Tensor> host_shards);
  int64_t n_rows() const override { return first_row_.back(); }
  int64_t dim() const override { return dim_; }
  void gather(Backend& be, std::span<const int64_t> ids, const Tensor& out) override;

 private:
  std::vector<Tensor> shards_;
  std::vector<int64_t> first_row_;  // [shards + 1]: shard i holds rows [first_row_[i], first_row_[i + 1])
  int64_t dim_ = 0;
};

struct PleSpec {
  int64_t n_embd = 0;
  int64_t n_stream = 0;         // hc_count
  int64_t embed_dim = 0;        // ple_embed_dim: all heads' rows concatenated
  int64_t ngram_size = 0;       // largest n-gram order
  int64_t heads_per_ngram = 0;
  int64_t conv_kernel = 0;      // ple_conv_kernel_size (dilation: ngram_size)
  float norm_eps = 1e-6f;
  int32_t eos = 0;              // eos_token_id: n-grams never reach back over it

  int64_t n_heads() const { return (ngram_size - 1) * heads_per_ngram; }
  int64_t head_dim() const { return embed_dim / n_heads(); }
  int64_t context() const { return ngram_size - 1; }
  int64_t width() const { return n_stream * n_embd; }
  int64_t conv_state_rows() const { return (conv_kernel - 1) * ngram_size; }
};

// The hash of one PLE layer, derived from the config as transformers derives it.
struct NgramHash {
  std::vector<int64_t> multipliers;  // [ngram_size], odd
  std::vector<int64_t> head_vocab;   // [n_heads]: the prime size of each head's range
  std::vector<int64_t> head_offset;  // [n_heads]: the first table row of each head's range
  int64_t n_rows = 0;                // the table's rows: the ranges' total, padded
};

// The first `count` primes >= base (transformers' _find_nth_prime_after(base - 1, i + 1)).
std::vector<int64_t> primes_from(int64_t base, int64_t count);

// PLE layer ple_index (0-based among the PLE layers): its heads take the primes
// head_primes[ple_index * n_heads ...]; multipliers from seed by splitmix64.
NgramHash ngram_hash(const PleSpec& spec, int64_t vocab_size, int64_t seed, int64_t ple_index,
                     std::span<const int64_t> head_primes, int64_t rows_divisor);

// ids [tokens.size() * n_heads]: table rows of each token's heads. history: the context()
// tokens before `tokens` (end-of-text tokens at the start of a sequence).
void ngram_ids(const PleSpec& spec, const NgramHash& hash, std::span<const int32_t> history,
               std::span<const int32_t> tokens, std::vector<int64_t>& ids);

struct PleWeights {
  std::shared_ptr<NgramTable> table;  // [hash.n_rows, head_dim]
  NgramHash hash;
  Tensor key;                         // [n_stream * n_embd, embed_dim]
  Tensor value;                       // [n_embd, embed_dim]
  Tensor norm_key, norm_query, norm_conv;  // f32 [n_stream * n_embd], 1 + w
  Tensor conv;                        // f32 [n_stream * n_embd, conv_kernel]
};

// Per sequence and layer.
struct PleState {
  Tensor conv;                  // f32 [conv_state_rows, n_stream * n_embd]
  std::vector<int32_t> history; // the last context() tokens, oldest first
};

PleState new_ple_state(Backend& be, const PleSpec& spec);
void clear_ple_state(Backend& be, const PleSpec& spec, PleState& st);

// prefix ends with '.', e.g. "model.language_model.layers.0.ple.". The table is either one
// tensor (ple_embedding.ngram_embedding.weight) or shards (...ngram_embedding.shard_<i>.weight,
// i = 0, 1, ...); the hash buffers a checkpoint may carry (layer_multipliers,
// ngram_heads_vocab_sizes, ngram_heads_offsets) must equal the derived ones.
PleWeights load_ple(WeightLoader& wl, const std::string& prefix, const PleSpec& spec, NgramHash hash);

// x [n, n_stream * n_embd] += PLE(x) for the next n tokens of the sequence (st).
void ple_block(Backend& be, const PleSpec& spec, PleWeights& w, std::span<const int32_t> tokens, const Tensor& x,
               PleState& st);

}  // namespace sluice
