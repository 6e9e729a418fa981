// Normalizers and pre-tokenizers of HF tokenizer.json, as the `tokenizers` library runs them
// for byte-level BPE: Unicode normalization (NFC and friends, through utf8proc), regex splits
// (PCRE2 with Unicode properties standing in for Oniguruma), digit splits and the ByteLevel
// step. Pieces are byte ranges into one arena string so a 1 MB text costs no per-word copies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace sluice {

// A compiled regex with `tokenizers`' (Oniguruma's) matching semantics. Thread-safe: the
// per-call state lives in a RegexScratch.
class Regex {
 public:
  // pattern is Oniguruma syntax as stored in tokenizer.json; literal compiles it verbatim
  // (the {"String": ...} form). where names the JSON field for error messages.
  Regex(std::string_view pattern, bool literal, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  struct Match {
    uint32_t begin, end;  // byte offsets into the searched text
  };
  // All matches in text, left to right, as Rust's onig::Regex::find_iter reports them: an empty
  // match right where the previous one ended is skipped. text must be valid UTF-8.
  void find_all(std::string_view text, pcre2_real_match_data_8* match_data, std::vector<Match>& out) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  std::string where_;
};

// Per-call scratch for regex matching (PCRE2 match data); one per thread.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;
  pcre2_real_match_data_8* get() { return match_data_; }
  std::vector<Regex::Match> matches;

 private:
  pcre2_real_match_data_8* match_data_;
};

// Rewrites Oniguruma's \s / \S into explicit classes: PCRE2's \s under UCP also matches
// U+180E, which Oniguruma's (and Unicode's White_Space) does not. Exposed for tests.
std::string regex_onig_to_pcre2(std::string_view pattern);

// tokenizer.json "normalizer": null, NFC, NFD, NFKC, NFKD, Replace (a String pattern:
// SentencePiece-style files spell spaces as U+2581 this way), Prepend, or a Sequence of those.
class Normalizer {
 public:
  static Normalizer from_json(const nlohmann::json& j);  // unsupported types throw
  bool empty() const { return steps_.empty(); }
  // Normalizes valid UTF-8 text; returns false (out untouched) when nothing would change.
  bool apply(std::string_view text, std::string& out) const;

 private:
  struct Step {
    enum class Kind { unicode, replace, prepend } kind = Kind::unicode;
    int form = 0;                // unicode: utf8proc option set
    std::string pattern, content;  // replace: every pattern by content; prepend: content
  };
  std::vector<Step> steps_;  // applied in order
};

// The {"String": ...} pattern of a normalizer's or decoder's Replace step `j` (where: which,
// for messages); a Regex pattern is unsupported.
std::string replace_pattern(const nlohmann::json& j, const char* where);
// text with every occurrence of pattern (not empty) replaced by content, left to right, as a
// Replace step does.
std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content);

// How a Split step turns matches into pieces (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// One piece of text on its way to the model: a byte range of the arena.
struct Piece {
  uint32_t begin, end;
};

// The pre_tokenizer chain. Every step but ByteLevel splits pieces; ByteLevel (which must come
// last) may prepend a space and split with the GPT-2 regex; its byte-to-unicode mapping is
// left to the BPE model, which works on raw bytes. Null: the text is one piece
// (SentencePiece-style files).
class PreTokenizer {
 public:
  // Throws unsupported for types sluice does not implement.
  static PreTokenizer from_json(const nlohmann::json& j);
  // Whether the chain ends in ByteLevel (the vocabulary is then spelled in its alphabet).
  bool byte_level() const;

  // Splits arena[0, arena.size()) into pieces, in order, none empty. May append to arena
  // (prefix spaces), so pieces are offsets rather than views.
  void run(std::string& arena, std::vector<Piece>& pieces, RegexScratch& scratch) const;

 private:
  struct Step {
    enum class Kind { split, byte_level } kind;
    std::shared_ptr<const Regex> regex;  // split pattern; for byte_level, the GPT-2 regex or null
    SplitBehavior behavior = SplitBehavior::isolated;
    bool invert = false;
    bool add_prefix_space = false;  // byte_level only
  };
  static void parse_step(const nlohmann::json& j, std::vector<Step>& steps);
  std::vector<Step> steps_;
};

}  // namespace sluice
