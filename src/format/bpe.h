// The BPE model of a byte-level tokenizer.json: vocabulary, merge ranks, and the merge loop.
// Tokens are keyed by their raw bytes (the byte-level spelling decoded), so the pre-tokenized
// pieces go to the model without being respelled in the GPT-2 alphabet.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace sluice {

// Hash for heterogeneous (string_view) lookup in unordered maps keyed by std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing map (left id, right id) -> (rank, merged id): the inner loop's only lookup.
class MergeTable {
 public:
  struct Value {
    int32_t rank;    // position in the merges list; lower merges first
    int32_t merged;  // id of left + right
  };
  void reserve(size_t n);
  void insert(int32_t left, int32_t right, Value v);  // a repeated pair takes the later rank
  const Value* find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return &e.value;
      if (e.key == empty_key) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t empty_key = ~0ull;  // ids are non-negative, so never a real key
  struct Entry {
    uint64_t key = empty_key;
    Value value{};
  };
  static uint64_t pack(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  void grow();
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Reusable buffers of one encode call.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the linked list, -1 at the ends
    int32_t len;         // bytes covered; 0 once merged into the left neighbour
  };
  struct Candidate {
    int32_t rank, pos, merged;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// How a vocabulary is spelled. byte_level: in the GPT-2 byte alphabet (a ByteLevel
// pre-tokenizer); a word's symbols start as its bytes. chars (SentencePiece-style files such
// as Gemma's): in plain UTF-8 (spaces as U+2581 after a normalizer Replace); a word's symbols
// start as its characters, a character without a token falls back to its bytes' "<0xAB>"
// tokens (byte_fallback), and a token decodes through the decoder's Replace steps and
// ByteFallback (decode_replace: pattern -> content, in order).
struct BpeSpelling {
  bool byte_level = true;
  std::vector<std::pair<std::string, std::string>> decode_replace;
};

class BpeModel {
 public:
  // model: tokenizer.json's "model" object (type BPE). Throws corrupt for merges that name
  // unknown tokens, unsupported for options sluice does not implement. Every vocabulary entry
  // is also appended to vocab_out as (id, bytes): what the decoder yields for it (byte-level:
  // the raw bytes of byte-level spellings, the spelling itself otherwise; chars: the spelling
  // through decode_replace, a "<0xAB>" token the byte 0xAB).
  static BpeModel from_json(const nlohmann::json& model, std::vector<std::pair<int32_t, std::string>>& vocab_out,
                            const BpeSpelling& spelling = {});

  // A tiktoken vocabulary (format/tiktoken.h): raw token bytes and their ranks, which are the
  // ids. Byte-level; the merge of (a, b) ranks as the token a + b (for every split of every
  // token into two tokens), and a piece that is a token whole is that token (ignore_merges):
  // tiktoken's BPE. Every single byte must be a token (Error(corrupt) otherwise). Every entry
  // is appended to vocab_out as (id, bytes).
  static BpeModel from_ranks(const std::vector<std::pair<std::string, int32_t>>& ranks,
                             std::vector<std::pair<int32_t, std::string>>& vocab_out);

  // Appends the ids of one pre-tokenized piece (raw bytes), as tokenizers' BPE::tokenize.
  void encode_word(std::string_view word, BpeScratch& scratch, std::vector<int32_t>& out) const;

  // A token by the bytes it decodes to (byte-level: its raw bytes; chars: its decoded text).
  std::optional<int32_t> find(std::string_view bytes) const;
  // What the decoder yields for a token spelled so (an added token's content, too).
  std::string decoded(std::string_view spelling) const;
  // A token by its spelling in tokenizer.json ("Ġworld"); nullopt when absent.
  std::optional<int32_t> find_spelling(std::string_view spelling) const;
  size_t n_merges() const { return merges_.size(); }

 private:
  // The symbols a word starts as (the merge loop after them is the same in both spellings).
  void initial_symbols(std::string_view word, BpeScratch& scratch) const;

  bool byte_level_ = true;
  std::vector<std::pair<std::string, std::string>> decode_replace_;  // chars: the decoder's Replace steps
  TokenMap by_bytes_;                     // raw bytes -> id, for entries in the byte-level alphabet (chars: decoded text)
  TokenMap by_spelling_;                  // spelling -> id, for entries outside it (rare; chars: every entry)
  std::array<int32_t, 256> byte_id_{};    // byte-level: the single-byte token; chars: "<0xAB>"; -1 when absent
  bool byte_fallback_ = false;
  MergeTable merges_;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
};

}  // namespace sluice
