// Tokenizer: HF tokenizer.json for BPE, matching the `tokenizers` library's encode and decode
// (and tiktoken vocabularies, matching tiktoken's: format/tiktoken.h):
// byte-level BPE (GPT-2, Qwen, Llama 3, gpt-oss and kin) and SentencePiece-style BPE in plain
// UTF-8 (Gemma: spaces as U+2581 by a normalizer Replace, byte-fallback tokens, decoders
// Replace / ByteFallback / Fuse). Encoding runs: added-token split on the raw text,
// normalizer, added-token split of normalized tokens, pre_tokenizer chain, BPE per piece.
// Loading parses tokenizer.json once; a Tokenizer is immutable afterwards, cheap to copy
// (shared state) and safe to use from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace sluice {

class Tokenizer {
 public:
  // dir holds tokenizer.json, or else a tiktoken vocabulary (tiktoken.model: Kimi K2's,
  // format/tiktoken.h), and optionally tokenizer_config.json (bos/eos/add_bos_token).
  // Errors: not_found (neither file, naming the path), corrupt (malformed JSON, merges or
  // ids naming unknown tokens), unsupported (model, normalizer, pre_tokenizer or decoder types
  // other than these two kinds of BPE need).
  static Tokenizer load(const std::filesystem::path& dir);
  // Whether dir holds a tokenizer load() reads (tokenizer.json or tiktoken.model).
  static bool present(const std::filesystem::path& dir);
  static Tokenizer from_json(const nlohmann::json& tokenizer_json, const nlohmann::json* tokenizer_config = nullptr);
  // A tiktoken vocabulary ((bytes, rank) with ranks 0 .. n-1, the ids), its split pattern
  // (Oniguruma syntax, as tokenizer.json's Split patterns) and its special tokens (id,
  // content; matched anywhere in the text, all special).
  static Tokenizer from_tiktoken(const std::vector<std::pair<std::string, int32_t>>& ranks, std::string_view pattern,
                                 const std::vector<std::pair<int32_t, std::string>>& specials,
                                 const nlohmann::json* tokenizer_config = nullptr);

  // Ids of text, with no special tokens added except bos as below. Added and special tokens
  // that appear literally in the text are matched first, as tokenizers does.
  // Invalid UTF-8: Error(Status::invalid_argument) naming the byte offset.
  // add_bos: prepend bos when tokenizer_config says add_bos_token and a bos exists.
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false) const;

  // The bytes the ids stand for, concatenated (tokenizers would additionally replace
  // ill-formed UTF-8 with U+FFFD; StreamDecoder does that). Special tokens yield their content
  // unless skip_special. An id outside [0, vocab_size()) or in a gap of the vocabulary:
  // invalid_argument.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  std::string token_text(int32_t id) const;  // raw bytes of one token; bad id: invalid_argument

  int32_t vocab_size() const;  // max id + 1 over the vocabulary and the added tokens
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // tokenizer_config.json's add_bos_token; when absent, whether the post_processor template
  // starts with the bos token (Llama 3 says so only there).
  bool add_bos() const;
  bool is_special(int32_t id) const;  // an added token flagged special; false for unknown ids
  // The id of an added token by its content ("<|im_end|>"), else of a vocabulary token by its
  // raw bytes (" world"): token_id(token_text(id)) == id.
  std::optional<int32_t> token_id(std::string_view content) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

// Streaming decode: push ids one at a time, get the text that is now complete. Never emits
// half a UTF-8 character: trailing incomplete bytes are held until they complete, and bytes
// that can never form a character become U+FFFD. flush() emits what remains, replacing an
// incomplete tail with U+FFFD. For ids whose bytes are valid UTF-8, the concatenated output
// equals decode(ids, skip_special). Keeps the tokenizer's state alive by itself.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);  // bad id: invalid_argument, state unchanged
  std::string flush();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete trailing character
};

}  // namespace sluice
