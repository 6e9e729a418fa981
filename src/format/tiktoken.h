// tiktoken vocabularies: the `tiktoken.model` file Kimi K2 (and Kimi K2.5, Moonlight) ships
// instead of a tokenizer.json, read into a Tokenizer (format/tokenizer.h) that encodes as
// tiktoken does.
//
// The file: one token a line, `<base64 of the token's bytes> <rank>`; the rank is the token's
// id, ranks are 0 .. n-1. tiktoken's BPE merges, in a piece, the adjacent pair whose joined
// bytes rank lowest (leftmost first) until no pair is a token, after emitting a piece that is
// a token whole as that token: a byte-level BPE whose merge of (a, b) ranks as the token a + b
// (BpeModel::from_ranks). The text is split into pieces by the model's pattern, which lives in
// its Python tokenizer code rather than in a data file: for Kimi, kKimiPattern. Special tokens
// (Kimi's tokenization_kimi.py): the 256 ids after the vocabulary, each named by
// tokenizer_config.json's added_tokens_decoder or "<|reserved_token_<id>|>", matched anywhere
// in the text (tiktoken's allowed_special="all").
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace sluice {

// Kimi's pat_str (tokenization_kimi.py) in the Oniguruma syntax tokenizer.json patterns use:
// its class intersections [X&&[^\p{Han}]] written as (?:(?!\p{Han})[X]).
extern const std::string_view kKimiPattern;

// The 256 special tokens after the vocabulary.
inline constexpr int32_t kTiktokenReservedSpecials = 256;

// Parses tiktoken.model text: (bytes, rank) in file order. Error(corrupt) naming `where` and
// the line for a line that is not base64 and a rank, a repeated token or rank, or ranks that
// are not 0 .. n-1.
std::vector<std::pair<std::string, int32_t>> parse_tiktoken_ranks(std::string_view text, const std::string& where);

// Kimi's special tokens: for id in [n_ranks, n_ranks + 256), added_tokens_decoder[id].content
// or "<|reserved_token_<id>|>", plus any other entry of added_tokens_decoder; config may be
// null (reserved names only).
std::vector<std::pair<int32_t, std::string>> tiktoken_special_tokens(int32_t n_ranks, const nlohmann::json* config);

// The Tokenizer of a directory holding tiktoken.model (and optionally tokenizer_config.json:
// bos / eos and added_tokens_decoder), split by kKimiPattern. Errors name the file.
class Tokenizer;
Tokenizer load_tiktoken_tokenizer(const std::filesystem::path& dir);

}  // namespace sluice
