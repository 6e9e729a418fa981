// Tokenizer (see tokenizer.h): loading tokenizer.json and tokenizer_config.json, the encode
// pipeline, decode and streaming decode.
#include "format/tokenizer.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "format/json_file.h"
#include "format/tiktoken.h"
#include "format/tokenizer_impl.h"
#include "format/utf8.h"

namespace sluice {

// Texts are addressed with 32-bit offsets (pieces) and prefix spaces may grow the arena; 1 GiB
// leaves room for both.
constexpr size_t max_text_bytes = size_t(1) << 30;

namespace {

const nlohmann::json* field(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

bool bool_field(const nlohmann::json& j, const char* key, bool fallback) {
  const nlohmann::json* v = field(j, key);
  return v && v->is_boolean() ? v->get<bool>() : fallback;
}

// The decoder's steps: ByteLevel (byte-level spellings back to bytes, per token; a token with
// a character outside the alphabet passes through as is), or the SentencePiece-style Replace
// (String patterns), ByteFallback ("<0xAB>" tokens to bytes) and Fuse (concatenation), which
// all act on each token alone, so sluice applies them to every token once at load.
struct DecoderSteps {
  bool byte_level = false;
  bool piece_steps = false;  // a Replace, ByteFallback or Fuse step
  std::vector<std::pair<std::string, std::string>> replace;
};

void parse_decoder(const nlohmann::json& j, DecoderSteps& out) {
  if (j.is_null()) return;
  const nlohmann::json* type = field(j, "type");
  SLUICE_CHECK(type && type->is_string(), Status::corrupt, "tokenizer.json: decoder has no \"type\"");
  if (*type == "ByteLevel") {
    out.byte_level = true;
  } else if (*type == "Sequence") {
    const nlohmann::json* list = field(j, "decoders");
    SLUICE_CHECK(list && list->is_array(), Status::corrupt, "tokenizer.json: decoder Sequence has no list");
    for (const auto& d : *list) parse_decoder(d, out);
  } else if (*type == "Replace") {
    const nlohmann::json* content = field(j, "content");
    SLUICE_CHECK(content && content->is_string(), Status::corrupt, "tokenizer.json: decoder Replace has no content");
    out.replace.emplace_back(replace_pattern(j, "decoder"), content->get<std::string>());
    out.piece_steps = true;
  } else if (*type == "ByteFallback" || *type == "Fuse") {
    out.piece_steps = true;
  } else {
    fail(Status::unsupported, "tokenizer.json: decoder type \"", type->get<std::string>(),
         "\" is not supported (sluice has ByteLevel, Replace, ByteFallback, Fuse and Sequence)");
  }
}

AddedToken parse_added_token(const nlohmann::json& j, size_t index) {
  SLUICE_CHECK(j.is_object(), Status::corrupt, "tokenizer.json: added_tokens[", index, "] is not an object");
  const nlohmann::json* id = field(j, "id");
  const nlohmann::json* content = field(j, "content");
  SLUICE_CHECK(id && id->is_number_integer() && content && content->is_string(), Status::corrupt,
               "tokenizer.json: added_tokens[", index, "] lacks an integer id or a string content");
  AddedToken t;
  const int64_t v = id->get<int64_t>();
  SLUICE_CHECK(v >= 0 && v < (int64_t(1) << 24), Status::corrupt, "tokenizer.json: added_tokens[", index, "] id ", v,
               " is out of range");
  t.id = static_cast<int32_t>(v);
  t.content = content->get<std::string>();
  t.special = bool_field(j, "special", false);
  t.single_word = bool_field(j, "single_word", false);
  t.lstrip = bool_field(j, "lstrip", false);
  t.rstrip = bool_field(j, "rstrip", false);
  t.normalized = bool_field(j, "normalized", !t.special);  // tokenizers' AddedToken default
  return t;
}

// tokenizer_config.json names bos/eos as a string or as {"content": ...}.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  const nlohmann::json* v = field(config, key);
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (const nlohmann::json* c = field(*v, "content"); c && c->is_string()) return c->get<std::string>();
  fail(Status::corrupt, "tokenizer_config.json: ", key, " is neither a string nor {\"content\": ...}");
}

// Whether the post_processor's single-sequence template starts with the special token named
// bos (TemplateProcessing, possibly inside a Sequence: Llama 3 adds bos this way).
bool template_adds(const nlohmann::json& pp, const std::string& bos) {
  const nlohmann::json* type = field(pp, "type");
  if (!type || !type->is_string()) return false;
  if (*type == "Sequence") {
    if (const nlohmann::json* list = field(pp, "processors"); list && list->is_array())
      for (const auto& p : *list)
        if (template_adds(p, bos)) return true;
    return false;
  }
  if (*type != "TemplateProcessing") return false;
  const nlohmann::json* single = field(pp, "single");
  if (!single || !single->is_array() || single->empty()) return false;
  const nlohmann::json* special = field((*single)[0], "SpecialToken");
  const nlohmann::json* name = special ? field(*special, "id") : nullptr;
  return name && name->is_string() && *name == bos;
}

}  // namespace

void tokenizer_finish(Tokenizer::Impl& impl, const std::vector<std::pair<int32_t, std::string>>& vocab,
                      const nlohmann::json* config, const nlohmann::json* post_processor) {
  for (const AddedToken& t : impl.added) {
    impl.added_by_content.emplace(t.content, t.id);
    if (!t.normalized) {
      impl.raw_matcher.add(t.content, &t);
    } else {
      // Normalized tokens are looked for in normalized text, so their content is normalized too.
      std::string normalized;
      impl.normalized_matcher.add(impl.normalizer.apply(t.content, normalized) ? normalized : t.content, &t);
    }
  }

  // Id tables: the bytes the decoder yields for each id. Added tokens win over a
  // vocabulary entry with the same id, as in tokenizers' id_to_token.
  int32_t n = 0;
  for (const auto& [id, bytes] : vocab) n = std::max(n, id + 1);
  for (const AddedToken& t : impl.added) n = std::max(n, t.id + 1);
  std::vector<const std::string*> text_of(n, nullptr);
  std::vector<std::string> added_bytes(impl.added.size());
  impl.token_kind.assign(n, Tokenizer::Impl::Kind::none);
  for (const auto& [id, bytes] : vocab) {
    text_of[id] = &bytes;
    impl.token_kind[id] = Tokenizer::Impl::Kind::model;
  }
  for (size_t i = 0; i < impl.added.size(); ++i) {
    const AddedToken& t = impl.added[i];
    added_bytes[i] = impl.model.decoded(t.content);
    text_of[t.id] = &added_bytes[i];
    impl.token_kind[t.id] = t.special ? Tokenizer::Impl::Kind::special : Tokenizer::Impl::Kind::added;
  }
  impl.token_offset.resize(size_t(n) + 1);
  size_t total = 0;
  for (int32_t id = 0; id < n; ++id) total += text_of[id] ? text_of[id]->size() : 0;
  SLUICE_CHECK(total < (size_t(1) << 32), Status::corrupt, "tokenizer.json: token texts exceed 4 GiB");
  impl.token_blob.reserve(total);
  for (int32_t id = 0; id < n; ++id) {
    impl.token_offset[id] = static_cast<uint32_t>(impl.token_blob.size());
    if (text_of[id]) impl.token_blob += *text_of[id];
  }
  impl.token_offset[n] = static_cast<uint32_t>(impl.token_blob.size());

  if (config) {
    SLUICE_CHECK(config->is_object(), Status::corrupt, "tokenizer_config.json: top level is not an object");
    for (const char* key : {"bos_token", "eos_token"}) {
      const std::optional<std::string> content = config_token(*config, key);
      if (!content) continue;
      const std::optional<int32_t> id = impl.find(*content);
      SLUICE_CHECK(id.has_value(), Status::corrupt, "tokenizer_config.json: ", key, " \"", *content,
                   "\" is not a token of tokenizer.json");
      (key == std::string_view("bos_token") ? impl.bos : impl.eos) = id;
    }
    if (const nlohmann::json* v = field(*config, "add_bos_token"); v && v->is_boolean()) {
      impl.add_bos = v->get<bool>();
    } else if (impl.bos) {
      impl.add_bos = post_processor && template_adds(*post_processor, std::string(impl.bytes(*impl.bos)));
    }
  }
}

bool Tokenizer::present(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir / "tokenizer.json", ec) ||
         std::filesystem::is_regular_file(dir / "tiktoken.model", ec);
}

void rethrow_with_paths(const Error& e, std::initializer_list<std::filesystem::path> files) {
  const std::string_view what = e.what();
  for (const std::filesystem::path& p : files)
    if (what.starts_with(p.filename().string() + ": "))
      throw Error(e.status(), p.string() + std::string(what.substr(p.filename().string().size())));
  throw e;
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  std::error_code ec;
  // A path to tokenizer.json itself is accepted too.
  const bool is_file = std::filesystem::is_regular_file(dir, ec);
  if (!is_file && !std::filesystem::is_regular_file(dir / "tokenizer.json", ec) &&
      std::filesystem::is_regular_file(dir / "tiktoken.model", ec))
    return load_tiktoken_tokenizer(dir);
  const std::filesystem::path json_path = is_file ? dir : dir / "tokenizer.json";
  SLUICE_CHECK(std::filesystem::is_regular_file(json_path, ec), Status::not_found, "tokenizer.json not found: ",
               json_path.string());
  const nlohmann::json tokenizer_json = read_json_file(json_path);
  const std::filesystem::path config_path = json_path.parent_path() / "tokenizer_config.json";
  std::optional<nlohmann::json> config;
  if (std::filesystem::is_regular_file(config_path, ec)) config = read_json_file(config_path);
  // from_json names the file only as "tokenizer.json: "; the message gets the whole path, and
  // a JSON type error that slipped past its checks gets one (not nlohmann's error id).
  try {
    return from_json(tokenizer_json, config ? &*config : nullptr);
  } catch (const Error& e) {
    rethrow_with_paths(e, {json_path, config_path});
  } catch (const nlohmann::json::exception& e) {
    fail(Status::corrupt, json_path.string(), ": ", describe_json_error(e, ""));
  }
}

Tokenizer Tokenizer::from_json(const nlohmann::json& tj, const nlohmann::json* config) {
  SLUICE_CHECK(tj.is_object(), Status::corrupt, "tokenizer.json: top level is not an object");
  const nlohmann::json* model_json = field(tj, "model");
  SLUICE_CHECK(model_json, Status::corrupt, "tokenizer.json: no \"model\"");

  auto impl = std::make_shared<Impl>();
  static const nlohmann::json null_json;
  const nlohmann::json* normalizer = field(tj, "normalizer");
  const nlohmann::json* pre_tokenizer = field(tj, "pre_tokenizer");
  const nlohmann::json* decoder = field(tj, "decoder");
  impl->normalizer = Normalizer::from_json(normalizer ? *normalizer : null_json);
  impl->pre_tokenizer = PreTokenizer::from_json(pre_tokenizer ? *pre_tokenizer : null_json);
  DecoderSteps steps;
  parse_decoder(decoder ? *decoder : null_json, steps);
  // Byte-level (GPT-2, Qwen, Llama 3, gpt-oss) when a ByteLevel step says so; otherwise the
  // vocabulary is plain UTF-8 (SentencePiece-style: Gemma).
  BpeSpelling spelling;
  spelling.byte_level = impl->pre_tokenizer.byte_level();
  SLUICE_CHECK(spelling.byte_level || !steps.byte_level, Status::unsupported,
               "tokenizer.json: a ByteLevel decoder with a pre_tokenizer that has no ByteLevel step is not supported");
  SLUICE_CHECK(!(spelling.byte_level && steps.piece_steps), Status::unsupported,
               "tokenizer.json: a ByteLevel pre_tokenizer with Replace / ByteFallback / Fuse decoders is not supported");
  spelling.decode_replace = std::move(steps.replace);
  std::vector<std::pair<int32_t, std::string>> vocab;
  impl->model = BpeModel::from_json(*model_json, vocab, spelling);

  if (const nlohmann::json* list = field(tj, "added_tokens")) {
    SLUICE_CHECK(list->is_array(), Status::corrupt, "tokenizer.json: added_tokens is not a list");
    impl->added.reserve(list->size());
    for (size_t i = 0; i < list->size(); ++i) {
      AddedToken t = parse_added_token((*list)[i], i);
      // tokenizers gives an added token whose content is already a vocabulary entry (by its
      // spelling) that entry's id, whatever the file says.
      if (std::optional<int32_t> id = impl->model.find_spelling(t.content)) t.id = *id;
      impl->added.push_back(std::move(t));
    }
  }
  tokenizer_finish(*impl, vocab, config, field(tj, "post_processor"));
  return Tokenizer(std::move(impl));
}

namespace {

// Buffers of one encode call. The word cache maps a piece's bytes to its ids: natural text
// repeats words, and BPE of a word is far dearer than a hash lookup.
struct EncodeState {
  RegexScratch regex;
  BpeScratch bpe;
  std::string arena;
  std::vector<Piece> pieces;
  std::string normalized;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> cache_ids;  // ids of cached words, [offset, offset + count) per entry
};

// Pieces longer than this are not cached (tokenizers' limit is 256 bytes too).
constexpr size_t max_cached_piece = 256;

void encode_plain(const Tokenizer::Impl& t, std::string_view text, EncodeState& st, std::vector<int32_t>& ids) {
  st.arena.assign(text);
  t.pre_tokenizer.run(st.arena, st.pieces, st.regex);
  for (const Piece& p : st.pieces) {
    const std::string_view word(st.arena.data() + p.begin, p.end - p.begin);
    if (word.size() > max_cached_piece) {
      t.model.encode_word(word, st.bpe, ids);
      continue;
    }
    if (auto it = st.cache.find(word); it != st.cache.end()) {
      ids.insert(ids.end(), st.cache_ids.begin() + it->second.first,
                 st.cache_ids.begin() + it->second.first + it->second.second);
      continue;
    }
    const size_t before = ids.size();
    t.model.encode_word(word, st.bpe, ids);
    const auto offset = static_cast<uint32_t>(st.cache_ids.size());
    st.cache_ids.insert(st.cache_ids.end(), ids.begin() + before, ids.end());
    st.cache.emplace(std::string(word), std::make_pair(offset, static_cast<uint32_t>(ids.size() - before)));
  }
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  if (std::optional<Utf8Error> err = utf8_find_invalid(text))
    fail(Status::invalid_argument, "tokenizer: invalid UTF-8 at byte offset ", err->offset, ": ", err->reason);
  SLUICE_CHECK(text.size() <= max_text_bytes, Status::invalid_argument, "tokenizer: text of ", text.size(),
               " bytes exceeds the limit of ", max_text_bytes);
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);  // ~4 bytes per token in English; a guess, not a bound
  if (add_bos && t.add_bos && t.bos) ids.push_back(*t.bos);

  EncodeState st;
  auto on_token = [&](const AddedToken& tok) { ids.push_back(tok.id); };
  t.raw_matcher.split(
      text,
      [&](std::string_view plain) {
        // Normalize each stretch between raw-text added tokens separately, as tokenizers does.
        std::string normalized;
        const std::string_view norm = t.normalizer.apply(plain, normalized) ? std::string_view(normalized) : plain;
        t.normalized_matcher.split(norm, [&](std::string_view piece) { encode_plain(t, piece, st, ids); }, on_token);
      },
      on_token);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& t = *impl_;
  std::string out;
  for (int32_t id : ids) {
    t.check_id(id);
    if (skip_special && t.token_kind[id] == Impl::Kind::special) continue;
    out += t.bytes(id);
  }
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  impl_->check_id(id);
  return std::string(impl_->bytes(id));
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size() && impl_->token_kind[id] == Impl::Kind::special;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view content) const { return impl_->find(content); }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const Tokenizer::Impl& t = *tokenizer_.impl_;
  t.check_id(id);
  if (skip_special_ && t.token_kind[id] == Tokenizer::Impl::Kind::special) return {};
  pending_ += t.bytes(id);
  std::string out;
  pending_.erase(0, utf8_repair(pending_, false, out));
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8_repair(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace sluice
