// BPE model: loading vocabulary and merges from tokenizer.json, and the merge loop of the
// `tokenizers` library (Word::merge_all): a heap of candidate merges ordered by (rank,
// position) over a linked list of symbols, so a piece of n bytes costs O(n log n).
#include "format/bpe.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/pretokenizer.h"
#include "format/utf8.h"

namespace sluice {

namespace {

// Ids index dense tables (id -> bytes); a bound keeps a hostile file from asking for
// terabytes. 2^24 is 60 times the largest vocabulary in use (Gemma's 262k).
constexpr int64_t max_token_id = int64_t(1) << 24;

bool null_or_empty_string(const nlohmann::json* v) {
  return !v || v->is_null() || (v->is_string() && v->get_ref<const std::string&>().empty());
}

}  // namespace

// ---- MergeTable --------------------------------------------------------------------------

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;  // load factor <= 1/2 keeps probe chains short
  if (cap <= entries_.size()) return;
  std::vector<Entry> old;
  old.swap(entries_);
  entries_.assign(cap, Entry{});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  size_ = 0;
  for (const Entry& e : old)
    if (e.key != empty_key) insert(int32_t(e.key >> 32), int32_t(uint32_t(e.key)), e.value);
}

void MergeTable::grow() { reserve(std::max<size_t>(16, entries_.size())); }

void MergeTable::insert(int32_t left, int32_t right, Value v) {
  if ((size_ + 1) * 2 > entries_.size()) grow();
  const uint64_t key = pack(left, right);
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    Entry& e = entries_[i];
    if (e.key == key) {
      e.value = v;  // tokenizers collects merges into a HashMap: the later duplicate wins
      return;
    }
    if (e.key == empty_key) {
      e.key = key;
      e.value = v;
      ++size_;
      return;
    }
  }
}

// ---- BpeModel ----------------------------------------------------------------------------

namespace {

// The byte of a byte-fallback token's spelling "<0xAB>" (tokenizers' ByteFallback decoder
// takes exactly this form, upper- or lower-case hex digits), else -1.
int byte_token_value(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  int v = 0;
  for (char c : s.substr(3, 2)) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else return -1;
  }
  return v;
}

}  // namespace

std::optional<int32_t> BpeModel::find(std::string_view bytes) const {
  auto it = by_bytes_.find(bytes);
  if (it == by_bytes_.end()) return std::nullopt;
  return it->second;
}

std::string BpeModel::decoded(std::string_view spelling) const {
  if (byte_level_) {
    std::optional<std::string> bytes = byte_level_decode(spelling);
    return bytes ? std::move(*bytes) : std::string(spelling);
  }
  if (const int b = byte_token_value(spelling); b >= 0) return std::string(1, static_cast<char>(b));
  std::string text(spelling);
  for (const auto& [pattern, content] : decode_replace_) text = replace_all(text, pattern, content);
  return text;
}

std::optional<int32_t> BpeModel::find_spelling(std::string_view spelling) const {
  thread_local std::string bytes;  // find_spelling runs 3 times per merge at load: no allocations
  if (byte_level_ && byte_level_decode_to(spelling, bytes)) return find(bytes);
  auto it = by_spelling_.find(spelling);
  if (it == by_spelling_.end()) return std::nullopt;
  return it->second;
}

BpeModel BpeModel::from_json(const nlohmann::json& model, std::vector<std::pair<int32_t, std::string>>& vocab_out,
                             const BpeSpelling& spelling_rule) {
  SLUICE_CHECK(model.is_object(), Status::corrupt, "tokenizer.json: \"model\" is not an object");
  auto type = model.find("type");
  SLUICE_CHECK(type != model.end() && type->is_string(), Status::corrupt, "tokenizer.json: model has no \"type\"");
  SLUICE_CHECK(*type == "BPE", Status::unsupported, "tokenizer.json: model type \"", type->get<std::string>(),
               "\" is not supported (sluice supports byte-level BPE)");

  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = model.find(key);
    return it == model.end() || it->is_null() ? nullptr : &*it;
  };
  if (const nlohmann::json* d = field("dropout")) {
    SLUICE_CHECK(d->is_number() && d->get<double>() == 0.0, Status::unsupported,
                 "tokenizer.json: BPE dropout ", d->dump(), " is not supported (inference uses none)");
  }
  SLUICE_CHECK(null_or_empty_string(field("continuing_subword_prefix")) && null_or_empty_string(field("end_of_word_suffix")),
               Status::unsupported,
               "tokenizer.json: BPE continuing_subword_prefix / end_of_word_suffix are not supported with byte-level BPE");

  BpeModel m;
  m.byte_level_ = spelling_rule.byte_level;
  m.decode_replace_ = spelling_rule.decode_replace;
  if (const nlohmann::json* v = field("ignore_merges")) m.ignore_merges_ = v->is_boolean() && v->get<bool>();
  if (const nlohmann::json* v = field("fuse_unk")) m.fuse_unk_ = v->is_boolean() && v->get<bool>();
  const bool byte_fallback = field("byte_fallback") && field("byte_fallback")->is_boolean() &&
                             field("byte_fallback")->get<bool>();

  const nlohmann::json* vocab = field("vocab");
  SLUICE_CHECK(vocab && vocab->is_object(), Status::corrupt, "tokenizer.json: model.vocab is missing or not an object");
  m.by_bytes_.reserve(vocab->size());
  vocab_out.reserve(vocab_out.size() + vocab->size());
  m.byte_fallback_ = byte_fallback;
  std::vector<std::pair<int, int32_t>> byte_tokens;  // chars: (byte, id) of the "<0xAB>" tokens
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::string& spelling = it.key();
    SLUICE_CHECK(it->is_number_integer(), Status::corrupt, "tokenizer.json: model.vocab[\"", spelling,
                 "\"] is not an integer id");
    const int64_t id = it->get<int64_t>();
    SLUICE_CHECK(id >= 0 && id < max_token_id, Status::corrupt, "tokenizer.json: model.vocab[\"", spelling,
                 "\"] = ", id, " is outside [0, ", max_token_id, ")");
    if (!m.byte_level_) {  // chars: every entry by its spelling, and by what it decodes to
      m.by_spelling_.emplace(spelling, int32_t(id));
      std::string decoded = m.decoded(spelling);
      if (const int b = byte_token_value(spelling); b >= 0) byte_tokens.emplace_back(b, int32_t(id));
      else m.by_bytes_.emplace(decoded, int32_t(id));
      vocab_out.emplace_back(int32_t(id), std::move(decoded));
      continue;
    }
    if (std::optional<std::string> bytes = byte_level_decode(spelling)) {
      vocab_out.emplace_back(int32_t(id), *bytes);
      m.by_bytes_.emplace(std::move(*bytes), int32_t(id));
    } else {
      // Not in the byte-level alphabet: no piece can ever spell it, but merges and decode may.
      vocab_out.emplace_back(int32_t(id), spelling);
      m.by_spelling_.emplace(spelling, int32_t(id));
    }
  }
  m.byte_id_.fill(-1);
  for (const auto& [b, id] : byte_tokens) {
    m.by_bytes_.emplace(std::string(1, static_cast<char>(b)), id);  // a text token of that byte wins
    m.byte_id_[b] = id;
  }

  if (m.byte_level_) {
    int n_missing_bytes = 0;
    for (int b = 0; b < 256; ++b) {
      const char c = static_cast<char>(b);
      if (auto id = m.find(std::string_view(&c, 1))) m.byte_id_[b] = *id;
      else ++n_missing_bytes;
    }
    SLUICE_CHECK(!byte_fallback || n_missing_bytes == 0, Status::unsupported,
                 "tokenizer.json: BPE byte_fallback with ", n_missing_bytes,
                 " bytes missing from the byte-level vocabulary is not supported");
  }

  if (const nlohmann::json* unk = field("unk_token")) {
    SLUICE_CHECK(unk->is_string(), Status::corrupt, "tokenizer.json: model.unk_token is not a string");
    m.unk_id_ = m.find_spelling(unk->get_ref<const std::string&>());
    SLUICE_CHECK(m.unk_id_.has_value(), Status::corrupt, "tokenizer.json: model.unk_token \"",
                 unk->get<std::string>(), "\" is not in the vocabulary");
  }

  // Merges: "left right" strings (older files) or ["left", "right"] pairs (tokenizers >= 0.20).
  const nlohmann::json* merges = field("merges");
  SLUICE_CHECK(merges && merges->is_array(), Status::corrupt, "tokenizer.json: model.merges is missing or not a list");
  m.merges_.reserve(merges->size());
  std::string joined;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const nlohmann::json& entry = (*merges)[rank];
    std::string_view left, right;
    if (entry.is_string()) {
      const std::string& s = entry.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      SLUICE_CHECK(space != std::string::npos, Status::corrupt, "tokenizer.json: merge ", rank, " (\"", s,
                   "\") is not two tokens separated by a space");
      left = std::string_view(s).substr(0, space);
      right = std::string_view(s).substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      left = entry[0].get_ref<const std::string&>();
      right = entry[1].get_ref<const std::string&>();
    } else {
      fail(Status::corrupt, "tokenizer.json: merge ", rank, " (", entry.dump(), ") is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const std::optional<int32_t> l = m.find_spelling(left), r = m.find_spelling(right);
    SLUICE_CHECK(l && r, Status::corrupt, "tokenizer.json: merge ", rank, " (\"", left, " ", right,
                 "\") uses token \"", l ? right : left, "\" which is not in the vocabulary");
    joined.assign(left);
    joined.append(right);
    const std::optional<int32_t> merged = m.find_spelling(joined);
    SLUICE_CHECK(merged.has_value(), Status::corrupt, "tokenizer.json: merge ", rank, " (\"", left, " ", right,
                 "\") makes \"", joined, "\" which is not in the vocabulary");
    m.merges_.insert(*l, *r, {int32_t(rank), *merged});
  }
  return m;
}

BpeModel BpeModel::from_ranks(const std::vector<std::pair<std::string, int32_t>>& ranks,
                              std::vector<std::pair<int32_t, std::string>>& vocab_out) {
  BpeModel m;
  m.byte_level_ = true;
  m.ignore_merges_ = true;  // tiktoken emits a piece that is a token whole as that token
  m.by_bytes_.reserve(ranks.size());
  vocab_out.reserve(vocab_out.size() + ranks.size());
  for (const auto& [bytes, rank] : ranks) {
    SLUICE_CHECK(rank >= 0 && rank < max_token_id, Status::corrupt, "tiktoken.model: rank ", rank, " is outside [0, ",
                 max_token_id, ")");
    SLUICE_CHECK(m.by_bytes_.emplace(bytes, rank).second, Status::corrupt, "tiktoken.model: a token is listed twice (rank ",
                 rank, ")");
    vocab_out.emplace_back(rank, bytes);
  }
  m.byte_id_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const std::optional<int32_t> id = m.find(std::string_view(&c, 1));
    SLUICE_CHECK(id.has_value(), Status::corrupt, "tiktoken.model: byte ", b, " is not a token (tiktoken needs all 256)");
    m.byte_id_[b] = *id;
  }
  size_t n_splits = 0;
  for (const auto& [bytes, rank] : ranks) n_splits += bytes.size() > 1 ? bytes.size() - 1 : 0;
  m.merges_.reserve(n_splits);
  for (const auto& [bytes, rank] : ranks) {
    for (size_t i = 1; i < bytes.size(); ++i) {
      const std::optional<int32_t> l = m.find(std::string_view(bytes).substr(0, i));
      const std::optional<int32_t> r = l ? m.find(std::string_view(bytes).substr(i)) : std::nullopt;
      if (l && r) m.merges_.insert(*l, *r, {rank, rank});
    }
  }
  return m;
}

void BpeModel::initial_symbols(std::string_view word, BpeScratch& s) const {
  // A unit (a byte; chars: a character) without a token becomes unk (fused with a preceding
  // unk when fuse_unk), or is dropped when there is no unk token, as in tokenizers.
  auto& sym = s.symbols;
  sym.clear();
  auto add = [&](int32_t id, int32_t len) {
    const int32_t n = static_cast<int32_t>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, len});
  };
  int32_t unk_len = 0;
  auto unknown = [&](int32_t len) {
    if (!unk_id_) return;
    if (unk_len > 0 && !fuse_unk_) add(*unk_id_, unk_len), unk_len = 0;
    unk_len += len;
  };
  if (byte_level_) {
    for (char c : word) {
      const int32_t id = byte_id_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        if (unk_len > 0) add(*unk_id_, unk_len), unk_len = 0;
        add(id, 1);
      } else {
        unknown(1);
      }
    }
  } else {
    for (size_t i = 0; i < word.size();) {
      const size_t len = std::min<size_t>(utf8_seq_len(static_cast<uint8_t>(word[i])), word.size() - i);
      const std::string_view ch = word.substr(i, len);
      i += len;
      if (auto it = by_spelling_.find(ch); it != by_spelling_.end()) {
        if (unk_len > 0) add(*unk_id_, unk_len), unk_len = 0;
        add(it->second, static_cast<int32_t>(len));
        continue;
      }
      bool bytes_known = byte_fallback_;
      for (char c : ch) bytes_known = bytes_known && byte_id_[static_cast<uint8_t>(c)] >= 0;
      if (bytes_known) {  // tokenizers adds these without closing a pending unk first
        for (char c : ch) add(byte_id_[static_cast<uint8_t>(c)], 1);
        continue;
      }
      unknown(static_cast<int32_t>(len));
    }
  }
  if (unk_len > 0) add(*unk_id_, unk_len);
}

void BpeModel::encode_word(std::string_view word, BpeScratch& s, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  // Llama 3 sets ignore_merges: a piece that is itself a token is emitted whole, even where
  // the merges would have split it differently.
  if (ignore_merges_) {
    const TokenMap& whole = byte_level_ ? by_bytes_ : by_spelling_;
    if (auto it = whole.find(word); it != whole.end()) {
      out.push_back(it->second);
      return;
    }
  }
  initial_symbols(word, s);
  auto& sym = s.symbols;
  if (sym.size() <= 1) {
    if (!sym.empty()) out.push_back(sym[0].id);
    return;
  }

  // The heap's top is the lowest rank, then the leftmost position.
  auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto& heap = s.heap;
  heap.clear();
  auto push = [&](int32_t pos, const MergeTable::Value* v) {
    heap.push_back({v->rank, pos, v->merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) {
    if (const MergeTable::Value* v = merges_.find(sym[i].id, sym[i + 1].id)) heap.push_back({v->rank, int32_t(i), v->merged});
  }
  std::make_heap(heap.begin(), heap.end(), later);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;  // merged away, or nothing to its right
    const int32_t right_pos = cur.next;
    const BpeScratch::Symbol right = sym[right_pos];
    // A stale candidate: one of the two symbols has changed since it was queued.
    const MergeTable::Value* v = merges_.find(cur.id, right.id);
    if (!v || v->merged != top.merged) continue;

    cur.id = top.merged;
    cur.len += right.len;
    cur.next = right.next;
    sym[right_pos].len = 0;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeTable::Value* pv = merges_.find(sym[cur.prev].id, cur.id)) push(cur.prev, pv);
    }
    if (cur.next >= 0) {
      if (const MergeTable::Value* nv = merges_.find(cur.id, sym[cur.next].id)) push(top.pos, nv);
    }
  }
  for (const BpeScratch::Symbol& x : sym)
    if (x.len != 0) out.push_back(x.id);
}

}  // namespace sluice
