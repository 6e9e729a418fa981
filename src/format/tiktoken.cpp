// tiktoken.model: the rank file, Kimi's split pattern and special tokens, and the Tokenizer
// built from them (a byte-level BPE whose merges rank as their joined tokens).
#include "format/tiktoken.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "format/file_io.h"
#include "format/json_file.h"
#include "format/tokenizer_impl.h"

namespace sluice {

const std::string_view kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

namespace {

// Standard base64 (RFC 4648, '=' padding), as Python's base64.b64decode takes it; nullopt for
// anything else.
std::optional<std::string> base64_decode(std::string_view in) {
  static const std::array<int8_t, 256> value = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) v[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
    return v;
  }();
  if (in.empty() || in.size() % 4 != 0) return std::nullopt;
  size_t pad = 0;
  while (pad < 2 && in[in.size() - 1 - pad] == '=') ++pad;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  for (size_t i = 0; i < in.size() - pad; ++i) {
    const int8_t v = value[static_cast<uint8_t>(in[i])];
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    if (i % 4 == 3) {
      out += static_cast<char>(acc >> 16);
      out += static_cast<char>(acc >> 8);
      out += static_cast<char>(acc);
      acc = 0;
    }
  }
  if (pad == 1) {  // 3 symbols: 18 bits, 2 bytes (the low 2 bits must be 0)
    if (acc & 0x3) return std::nullopt;
    out += static_cast<char>(acc >> 10);
    out += static_cast<char>(acc >> 2);
  } else if (pad == 2) {  // 2 symbols: 12 bits, 1 byte
    if (acc & 0xf) return std::nullopt;
    out += static_cast<char>(acc >> 4);
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, int32_t>> parse_tiktoken_ranks(std::string_view text, const std::string& where) {
  constexpr int64_t kMaxRank = int64_t{1} << 24;  // as tokenizer.json ids (bpe.cpp)
  std::vector<std::pair<std::string, int32_t>> out;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    SLUICE_CHECK(sp != std::string_view::npos, Status::corrupt, where, ": line ", line_no,
                 " is not \"<base64 token> <rank>\"");
    std::optional<std::string> bytes = base64_decode(line.substr(0, sp));
    SLUICE_CHECK(bytes && !bytes->empty(), Status::corrupt, where, ": line ", line_no, ": the token is not base64");
    const std::string_view rank_text = line.substr(sp + 1);
    int64_t rank = 0;
    SLUICE_CHECK(!rank_text.empty() && rank_text.size() <= 9 &&
                     std::all_of(rank_text.begin(), rank_text.end(), [](char c) { return c >= '0' && c <= '9'; }),
                 Status::corrupt, where, ": line ", line_no, ": rank \"", rank_text, "\" is not a number");
    for (char c : rank_text) rank = rank * 10 + (c - '0');
    SLUICE_CHECK(rank < kMaxRank, Status::corrupt, where, ": line ", line_no, ": rank ", rank, " is too large");
    out.emplace_back(std::move(*bytes), static_cast<int32_t>(rank));
  }
  SLUICE_CHECK(!out.empty(), Status::corrupt, where, ": no tokens");
  std::vector<bool> seen(out.size(), false);
  for (const auto& [bytes, rank] : out) {
    SLUICE_CHECK(static_cast<size_t>(rank) < out.size() && !seen[static_cast<size_t>(rank)], Status::corrupt, where,
                 ": ranks are not 0 .. ", out.size() - 1, " each once (rank ", rank, ")");
    seen[static_cast<size_t>(rank)] = true;
  }
  return out;
}

std::vector<std::pair<int32_t, std::string>> tiktoken_special_tokens(int32_t n_ranks, const nlohmann::json* config) {
  std::map<int32_t, std::string> named;
  if (config && config->is_object()) {
    if (auto it = config->find("added_tokens_decoder"); it != config->end() && it->is_object()) {
      for (auto t = it->begin(); t != it->end(); ++t) {
        const std::string& key = t.key();
        SLUICE_CHECK(!key.empty() && key.size() <= 9 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }),
                     Status::corrupt, "tokenizer_config.json: added_tokens_decoder key \"", key, "\" is not a token id");
        const auto content = t->find("content");
        SLUICE_CHECK(t->is_object() && content != t->end() && content->is_string() && !content->get<std::string>().empty(),
                     Status::corrupt, "tokenizer_config.json: added_tokens_decoder[\"", key, "\"] has no content");
        const int32_t id = std::stoi(key);
        SLUICE_CHECK(id >= n_ranks, Status::corrupt, "tokenizer_config.json: added_tokens_decoder[\"", key,
                     "\"] is inside the tiktoken vocabulary (", n_ranks, " tokens)");
        named[id] = content->get<std::string>();
      }
    }
  }
  for (int32_t id = n_ranks; id < n_ranks + kTiktokenReservedSpecials; ++id)
    named.emplace(id, "<|reserved_token_" + std::to_string(id) + "|>");
  return {named.begin(), named.end()};
}

Tokenizer Tokenizer::from_tiktoken(const std::vector<std::pair<std::string, int32_t>>& ranks, std::string_view pattern,
                                   const std::vector<std::pair<int32_t, std::string>>& specials,
                                   const nlohmann::json* config) {
  auto impl = std::make_shared<Impl>();
  impl->normalizer = Normalizer::from_json(nlohmann::json());
  impl->pre_tokenizer = PreTokenizer::from_json(
      {{"type", "Sequence"},
       {"pretokenizers",
        {{{"type", "Split"}, {"pattern", {{"Regex", std::string(pattern)}}}, {"behavior", "Isolated"}, {"invert", false}},
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}});
  std::vector<std::pair<int32_t, std::string>> vocab;
  impl->model = BpeModel::from_ranks(ranks, vocab);
  std::set<std::string> contents;
  impl->added.reserve(specials.size());
  for (const auto& [id, content] : specials) {
    SLUICE_CHECK(contents.insert(content).second, Status::corrupt, "tokenizer_config.json: special token \"", content,
                 "\" is named twice");
    AddedToken t;
    t.id = id;
    t.content = content;
    t.special = true;  // tiktoken matches every special token in the text (allowed_special="all")
    t.normalized = false;
    impl->added.push_back(std::move(t));
  }
  tokenizer_finish(*impl, vocab, config, nullptr);
  return Tokenizer(std::move(impl));
}

Tokenizer load_tiktoken_tokenizer(const std::filesystem::path& dir) {
  const std::filesystem::path model = dir / "tiktoken.model", config_path = dir / "tokenizer_config.json";
  const std::string text = read_file_bytes(model, json_file_max, "a tiktoken vocabulary");
  std::error_code ec;
  std::optional<nlohmann::json> config;
  if (std::filesystem::is_regular_file(config_path, ec)) config = read_json_file(config_path);
  const auto ranks = parse_tiktoken_ranks(text, model.string());
  const auto specials = tiktoken_special_tokens(static_cast<int32_t>(ranks.size()), config ? &*config : nullptr);
  try {
    return Tokenizer::from_tiktoken(ranks, kKimiPattern, specials, config ? &*config : nullptr);
  } catch (const Error& e) {
    rethrow_with_paths(e, {model, config_path});
  }
}

}  // namespace sluice
