// Tokenizer's insides, shared by its two loaders: tokenizer.json (tokenizer.cpp) and a
// tiktoken vocabulary (tiktoken.cpp). Not for use outside format/.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "format/added_tokens.h"
#include "format/bpe.h"
#include "format/pretokenizer.h"
#include "format/tokenizer.h"

namespace sluice {

struct Tokenizer::Impl {
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::vector<AddedToken> added;  // stable: the matchers and maps point into it
  AddedTokenMatcher raw_matcher;         // normalized == false: matched in the raw text
  AddedTokenMatcher normalized_matcher;  // normalized == true: matched after normalization
  TokenMap added_by_content;

  // Per id, [0, vocab_size): bytes the decoder yields, and what the id is.
  enum class Kind : uint8_t { none, model, added, special };
  std::string token_blob;
  std::vector<uint32_t> token_offset;  // [vocab_size + 1] into token_blob
  std::vector<Kind> token_kind;        // [vocab_size]

  std::optional<int32_t> bos, eos;
  bool add_bos = false;

  int32_t vocab_size() const { return static_cast<int32_t>(token_kind.size()); }
  void check_id(int32_t id) const {
    SLUICE_CHECK(id >= 0 && id < vocab_size(), Status::invalid_argument, "tokenizer: token id ", id,
                 " is outside [0, ", vocab_size(), ")");
    SLUICE_CHECK(token_kind[id] != Kind::none, Status::invalid_argument, "tokenizer: token id ", id,
                 " is not in the vocabulary (a gap between ids)");
  }
  std::string_view bytes(int32_t id) const {
    return std::string_view(token_blob).substr(token_offset[id], token_offset[id + 1] - token_offset[id]);
  }
  std::optional<int32_t> find(std::string_view content) const {
    if (auto it = added_by_content.find(content); it != added_by_content.end()) return it->second;
    return model.find(content);
  }
};

// Completes a tokenizer whose model, normalizer, pre_tokenizer and added tokens are set:
// registers the added tokens with the matchers, builds the id tables from the model's
// vocabulary (id, decoded bytes) and the added tokens, and reads bos / eos / add_bos_token
// from tokenizer_config.json (post_processor: tokenizer.json's, where add_bos_token is absent).
void tokenizer_finish(Tokenizer::Impl& impl, const std::vector<std::pair<int32_t, std::string>>& vocab,
                      const nlohmann::json* config, const nlohmann::json* post_processor);

// Rethrows e with a message that starts with one of the files' names ("tokenizer.json: ...")
// naming the whole path instead.
[[noreturn]] void rethrow_with_paths(const Error& e, std::initializer_list<std::filesystem::path> files);

}  // namespace sluice
