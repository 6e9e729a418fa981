// PLE: n-gram hashing (transformers' Qwen4ExpTextNGramEmbedding), the resident table, the block.
#include "models/ple.h"

#include <algorithm>
#include <cstring>

#include "models/hybrid_weights.h"

namespace sluice {

// ---- table ----

std::optional<NgramTableTensor> ngram_table_tensor(const std::string& name) {
  static const std::string kPerLayer = "embed_tokens_per_layer.weight";  // Gemma 4
  if (name.size() >= kPerLayer.size() && name.compare(name.size() - kPerLayer.size(), kPerLayer.size(), kPerLayer) == 0 &&
      (name.size() == kPerLayer.size() || name[name.size() - kPerLayer.size() - 1] == '.'))
    return NgramTableTensor{name.substr(0, name.size() - std::string("weight").size())};
  static const std::string kTable = "ple_embedding.ngram_embedding.";
  const size_t at = name.find(kTable);
  if (at == std::string::npos) return std::nullopt;
  NgramTableTensor t;
  t.table = name.substr(0, at + kTable.size());
  const std::string rest = name.substr(at + kTable.size());
  if (rest == "weight") return t;
  const std::string head = "shard_", tail = ".weight";
  if (rest.size() <= head.size() + tail.size() || rest.compare(0, head.size(), head) != 0 ||
      rest.compare(rest.size() - tail.size(), tail.size(), tail) != 0)
    return std::nullopt;
  const std::string digits = rest.substr(head.size(), rest.size() - head.size() - tail.size());
  if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  t.shard = std::stoll(digits);
  t.sharded = true;
  return t;
}

ResidentNgramTable::ResidentNgramTable(std::vector<Tensor> host_shards) : shards_(std::move(host_shards)) {
  SLUICE_ASSERT(!shards_.empty());
  first_row_.push_back(0);
  dim_ = shards_[0].cols();
  for (const Tensor& s : shards_) {
    SLUICE_ASSERT(s.ndim == 2 && s.cols() == dim_);
    first_row_.push_back(first_row_.back() + s.shape[0]);
  }
}

void ResidentNgramTable::gather(Backend& be, std::span<const int64_t> ids, const Tensor& out) {
  SLUICE_ASSERT(out.dtype == DType::f32 && out.numel() == static_cast<int64_t>(ids.size()) * dim_);
  std::vector<float> staging(ids.size() * dim_);  // per call: concurrent sequences may share the table
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    SLUICE_CHECK(id >= 0 && id < n_rows(), Status::internal, "n-gram row ", id, " outside [0, ", n_rows(), ")");
    const size_t s = static_cast<size_t>(std::upper_bound(first_row_.begin(), first_row_.end(), id) - first_row_.begin() - 1);
    const Tensor& t = shards_[s];
    const int64_t local = id - first_row_[s];
    float* dst = staging.data() + i * dim_;
    for (int64_t c = 0; c < dim_; ++c) {
      const int64_t e = local * dim_ + c;
      dst[c] = t.dtype == DType::f32 ? t.ptr<float>()[e]
               : t.dtype == DType::bf16 ? bf16_to_f32(t.ptr<uint16_t>()[e])
                                        : f16_to_f32(t.ptr<uint16_t>()[e]);
    }
  }
  be.from_host(out, staging.data());
}

// ---- hash ----

namespace {

constexpr uint64_t kSplitmixGamma = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kSplitmixM1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kSplitmixM2 = 0x94D049BB133111EBull;
constexpr uint64_t kLayerPrime = 10007;  // transformers' _PRIME_1: seeds of successive PLE layers

uint64_t splitmix64(uint64_t v) {
  v += kSplitmixGamma;
  v = (v ^ (v >> 30)) * kSplitmixM1;
  v = (v ^ (v >> 27)) * kSplitmixM2;
  return v ^ (v >> 31);
}

bool is_prime(int64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (int64_t d = 3; d * d <= v; d += 2)
    if (v % d == 0) return false;
  return true;
}

}  // namespace

std::vector<int64_t> primes_from(int64_t base, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t v = base; static_cast<int64_t>(out.size()) < count; ++v)
    if (is_prime(v)) out.push_back(v);
  return out;
}

NgramHash ngram_hash(const PleSpec& spec, int64_t vocab_size, int64_t seed, int64_t ple_index,
                     std::span<const int64_t> head_primes, int64_t rows_divisor) {
  NgramHash h;
  const uint64_t max_long = (uint64_t{1} << 63) - 1;
  const uint64_t multiplier_max = max_long / static_cast<uint64_t>(std::max<int64_t>(vocab_size, 1));
  const uint64_t half_bound = std::max<uint64_t>(1, multiplier_max / 2);
  const uint64_t base_seed = static_cast<uint64_t>(seed) + kLayerPrime * static_cast<uint64_t>(ple_index);
  for (int64_t i = 0; i < spec.ngram_size; ++i) {
    const uint64_t value = base_seed + kSplitmixGamma * static_cast<uint64_t>(i + 1);
    h.multipliers.push_back(static_cast<int64_t>(2 * (splitmix64(value) % half_bound) + 1));
  }
  const int64_t H = spec.n_heads();
  SLUICE_ASSERT(static_cast<int64_t>(head_primes.size()) >= (ple_index + 1) * H);
  int64_t total = 0;
  for (int64_t j = 0; j < H; ++j) {
    h.head_vocab.push_back(head_primes[ple_index * H + j]);
    h.head_offset.push_back(total);
    total += h.head_vocab.back();
  }
  h.n_rows = (total + rows_divisor - 1) / rows_divisor * rows_divisor;
  return h;
}

void ngram_ids(const PleSpec& spec, const NgramHash& hash, std::span<const int32_t> history,
               std::span<const int32_t> tokens, std::vector<int64_t>& ids) {
  const int64_t ctx = spec.context(), N = spec.ngram_size, hpn = spec.heads_per_ngram, H = spec.n_heads();
  SLUICE_ASSERT(static_cast<int64_t>(history.size()) == ctx);
  std::vector<int64_t> hist(history.begin(), history.end());
  hist.insert(hist.end(), tokens.begin(), tokens.end());
  ids.resize(tokens.size() * H);
  std::vector<int64_t> shifted(N);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = ctx + static_cast<int64_t>(i);
    // shifted[s]: the token s back, or eos when an eos lies in [t - s, t - 1] (the n-gram
    // would reach back over the end of a text).
    bool open = true;
    shifted[0] = hist[t];
    for (int64_t s = 1; s < N; ++s) {
      open = open && hist[t - s] != spec.eos;
      shifted[s] = open ? hist[t - s] : spec.eos;
    }
    for (int64_t n = 2; n <= N; ++n) {
      int64_t mixed = shifted[0] * hash.multipliers[0];
      for (int64_t p = 1; p < n; ++p) mixed ^= shifted[p] * hash.multipliers[p];
      for (int64_t j = 0; j < hpn; ++j) {
        const int64_t head = (n - 2) * hpn + j;
        ids[i * H + head] = mixed % hash.head_vocab[head] + hash.head_offset[head];
      }
    }
  }
}

// ---- weights, state, block ----

PleState new_ple_state(Backend& be, const PleSpec& spec) {
  PleState st;
  st.conv = be.alloc(DType::f32, {spec.conv_state_rows(), spec.width()});
  clear_ple_state(be, spec, st);
  return st;
}

void clear_ple_state(Backend& be, const PleSpec& spec, PleState& st) {
  be.fill(st.conv, 0.0f);
  st.history.assign(static_cast<size_t>(spec.context()), spec.eos);
}

namespace {

// An int64 buffer the checkpoint may carry; when present it must equal `want`.
void check_buffer(WeightLoader& wl, const std::string& name, const std::vector<int64_t>& want, const char* what) {
  if (!wl.has(name)) return;
  Tensor t = wl.source().get(name);
  bool same = t.dtype == DType::i64 && t.numel() == static_cast<int64_t>(want.size()) &&
              std::memcmp(t.data, want.data(), want.size() * sizeof(int64_t)) == 0;
  SLUICE_CHECK(same, Status::corrupt, wl.family(), ": tensor ", name, " differs from the ", what,
               " derived from config.json (seed, ngram_vocab_size_base, vocab_size)");
}

}  // namespace

PleWeights load_ple(WeightLoader& wl, const std::string& p, const PleSpec& s, NgramHash hash) {
  PleWeights w;
  const std::string e = p + "ple_embedding.";
  if (std::shared_ptr<NgramTable> stored = wl.source().ngram_table(e + "ngram_embedding.")) {
    // A pack: rows read on demand (models/pack_ngram_table.h).
    SLUICE_CHECK(stored->dim() == s.head_dim(), Status::corrupt, wl.family(), ": the n-gram table under ", e, " has rows of ",
                 stored->dim(), " values, expected ", s.head_dim(), " (ple_embed_dim / n-gram heads)");
    wl.count_params(stored->n_rows() * stored->dim());
    w.table = std::move(stored);
  }
  std::vector<Tensor> shards;
  auto take_shard = [&](const std::string& name) {
    Tensor t = wl.source().get(name);  // host view; shape checked below
    SLUICE_CHECK(t.ndim == 2 && t.cols() == s.head_dim() &&
                     (t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16),
                 Status::corrupt, wl.family(), ": tensor ", name, " is ", dtype_name(t.dtype), " ", t.shape_str(),
                 ", expected a float table [rows, ", s.head_dim(), "] (ple_embed_dim / n-gram heads)");
    shards.push_back(wl.take_host(name, {t.shape[0], t.shape[1]}));
  };
  if (!w.table && wl.has(e + "ngram_embedding.weight")) {
    take_shard(e + "ngram_embedding.weight");
  } else if (!w.table) {
    for (int i = 0; wl.has(e + "ngram_embedding.shard_" + std::to_string(i) + ".weight"); ++i)
      take_shard(e + "ngram_embedding.shard_" + std::to_string(i) + ".weight");
  }
  SLUICE_CHECK(w.table || !shards.empty(), Status::not_found, wl.family(), ": checkpoint lacks tensor ", e,
               "ngram_embedding.weight (or its shards ngram_embedding.shard_<i>.weight)");
  if (!w.table) w.table = std::make_shared<ResidentNgramTable>(std::move(shards));
  SLUICE_CHECK(w.table->n_rows() == hash.n_rows, Status::corrupt, wl.family(), ": the n-gram table under ", e,
               " has ", w.table->n_rows(), " rows; config.json (ngram_vocab_size_base, ngram_size, heads_per_ngram, ",
               "make_ngram_vocab_size_divisible_by) gives ", hash.n_rows);
  check_buffer(wl, e + "layer_multipliers", hash.multipliers, "hash multipliers");
  check_buffer(wl, e + "ngram_heads_vocab_sizes", hash.head_vocab, "head vocabulary sizes");
  check_buffer(wl, e + "ngram_heads_offsets", hash.head_offset, "head offsets");
  w.hash = std::move(hash);
  w.key = wl.take_matrix(p + "key_proj.weight", {s.width(), s.embed_dim});
  w.value = wl.take_matrix(p + "value_proj.weight", {s.n_embd, s.embed_dim});
  w.norm_key = take_norm_plus_one(wl, p + "norm_key.weight", {s.width()});
  w.norm_query = take_norm_plus_one(wl, p + "norm_query.weight", {s.width()});
  w.norm_conv = take_norm_plus_one(wl, p + "norm_conv.weight", {s.width()});
  w.conv = take_f32(wl, p + "conv1d.weight", {s.width(), 1, s.conv_kernel}).reshape({s.width(), s.conv_kernel});
  return w;
}

void ple_block(Backend& be, const PleSpec& s, PleWeights& w, std::span<const int32_t> tokens, const Tensor& x,
               PleState& st) {
  const int64_t n = static_cast<int64_t>(tokens.size()), W = s.width();
  std::vector<int64_t> ids;
  ngram_ids(s, w.hash, st.history, tokens, ids);
  Tensor emb = be.alloc(DType::f32, {n, s.embed_dim});  // [n, n_heads * head_dim]
  w.table->gather(be, ids, emb.reshape({n * s.n_heads(), s.head_dim()}));
  // The next call's history: the last context() tokens of history + tokens.
  std::vector<int32_t> all = st.history;
  all.insert(all.end(), tokens.begin(), tokens.end());
  st.history.assign(all.end() - s.context(), all.end());

  Tensor key = be.alloc(DType::f32, {n, W});
  be.matmul(emb, w.key, key);
  be.rms_norm_groups(key, w.norm_key, s.norm_eps, s.n_embd, key);
  Tensor value = be.alloc(DType::f32, {n, s.n_embd});
  be.matmul(emb, w.value, value);
  Tensor query = be.alloc(DType::f32, {n, W});
  be.rms_norm_groups(x, w.norm_query, s.norm_eps, s.n_embd, query);
  Tensor gated = be.alloc(DType::f32, {n, W});
  be.ple_gate(key, query, value, gated);
  Tensor normed = be.alloc(DType::f32, {n, W});
  be.rms_norm_groups(gated, w.norm_conv, s.norm_eps, s.n_embd, normed);
  Tensor conv = be.alloc(DType::f32, {n, W});
  be.causal_conv1d(normed, w.conv, st.conv, conv, s.ngram_size, true);
  be.add(conv, gated);  // gated + conv (one rounding: the order of the operands is exact)
  be.add(x, conv);
}

}  // namespace sluice
