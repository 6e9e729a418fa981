// Normalizers and pre-tokenizers of tokenizer.json for byte-level BPE (see pretokenizer.h).
#include "format/pretokenizer.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/utf8.h"

namespace sluice {

namespace {

// Oniguruma's Unicode classes, from its doc/RE, written for PCRE2 (whose UCP \s adds U+180E
// and whose \w lacks marks and Pc in 10.42, and whose \h is horizontal space, not hex digit).
constexpr std::string_view onig_space_items = "\\t-\\r\\x{85}\\p{Z}";
constexpr std::string_view onig_word_items = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr std::string_view onig_hex_items = "0-9a-fA-F";

// The regex of tokenizers' ByteLevel pre-tokenizer (GPT-2's), used when use_regex is true.
constexpr std::string_view gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return str("PCRE2 error ", code);
  return reinterpret_cast<const char*>(buf);
}

const nlohmann::json* find_field(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

bool bool_field(const nlohmann::json& j, const char* key, bool fallback, std::string_view where) {
  const nlohmann::json* v = find_field(j, key);
  if (!v) return fallback;
  SLUICE_CHECK(v->is_boolean(), Status::corrupt, "tokenizer.json: ", where, ".", key, " is not a boolean");
  return v->get<bool>();
}

std::string type_of(const nlohmann::json& j, std::string_view where) {
  const nlohmann::json* t = find_field(j, "type");
  SLUICE_CHECK(t && t->is_string(), Status::corrupt, "tokenizer.json: ", where, " has no \"type\" string");
  return t->get<std::string>();
}

}  // namespace

// ---- Regex ------------------------------------------------------------------------------

std::string regex_onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  int class_depth = 0;  // Oniguruma allows nested classes; PCRE2 sees them as literals anyway
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      std::string_view items;
      bool negated = false;
      switch (d) {
        case 's': items = onig_space_items; break;
        case 'S': items = onig_space_items; negated = true; break;
        case 'w': items = onig_word_items; break;
        case 'W': items = onig_word_items; negated = true; break;
        case 'h': items = onig_hex_items; break;
        case 'H': items = onig_hex_items; negated = true; break;
        case 'Q': {  // \Q...\E is literal text: copy through untouched
          const size_t e = p.find("\\E", i + 1);
          const size_t stop = e == std::string_view::npos ? p.size() : e + 2;
          out += '\\';
          out.append(p.substr(i, stop - i));
          i = stop - 1;
          continue;
        }
        default: break;
      }
      if (items.empty() || (negated && class_depth > 0)) {
        // Plain escape, or a negated class inside a class (no way to spell it; keep PCRE2's).
        out += '\\';
        out += d;
      } else if (class_depth > 0) {
        out += items;
      } else {
        out += negated ? "[^" : "[";
        out += items;
        out += ']';
      }
      continue;
    }
    if (c == '[') {
      if (class_depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {
        // POSIX bracket [:alpha:] inside a class: copy up to ":]".
        const size_t e = p.find(":]", i + 2);
        const size_t stop = e == std::string_view::npos ? p.size() : e + 2;
        out.append(p.substr(i, stop - i));
        i = stop - 1;
        continue;
      }
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern, bool literal, std::string_view where) : where_(where) {
  const std::string translated = literal ? std::string(pattern) : regex_onig_to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL admits no UCP (nothing in a literal pattern needs Unicode properties).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &error,
                        &error_offset, nullptr);
  if (!code_) {
    fail(Status::unsupported, "tokenizer.json: ", where, ": cannot compile regex \"", pattern, "\" (as \"",
         translated, "\") with PCRE2: ", pcre2_message(error), " at offset ", error_offset);
  }
  // The JIT makes matching several times faster; without it (no JIT support in this build of
  // PCRE2) pcre2_match interprets, which is only slower.
  (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::find_all(std::string_view text, pcre2_match_data* md, std::vector<Match>& out) const {
  out.clear();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  size_t last_match_end = SIZE_MAX;
  while (pos <= n) {
    int rc = pcre2_match(code_, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Deep backtracking overflowed the JIT's 32 KiB stack: the interpreter keeps its
      // backtracking state on the heap.
      rc = pcre2_match(code_, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail(Status::internal, where_, ": regex match failed: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (b == e && e == last_match_end) {
      // onig's find_iter refuses an empty match where the last match ended: step one char.
      if (pos >= n) break;
      pos += utf8_seq_len(static_cast<uint8_t>(text[pos]));
      continue;
    }
    out.push_back({static_cast<uint32_t>(b), static_cast<uint32_t>(e)});
    pos = e;
    last_match_end = e;
  }
}

RegexScratch::RegexScratch() : match_data_(pcre2_match_data_create(1, nullptr)) {
  SLUICE_CHECK(match_data_, Status::out_of_memory, "cannot allocate PCRE2 match data");
}

RegexScratch::~RegexScratch() { pcre2_match_data_free(match_data_); }

// ---- Normalizer --------------------------------------------------------------------------

namespace {

// A string field of j, else corrupt naming `where`.
std::string string_field(const nlohmann::json& j, const char* key, const char* where) {
  const nlohmann::json* v = find_field(j, key);
  SLUICE_CHECK(v && v->is_string(), Status::corrupt, "tokenizer.json: ", where, " has no string \"", key, "\"");
  return v->get<std::string>();
}

}  // namespace

// Replace's {"String": ...} pattern (a Regex pattern is not supported).
std::string replace_pattern(const nlohmann::json& j, const char* where) {
  const nlohmann::json* pattern = find_field(j, "pattern");
  SLUICE_CHECK(pattern && pattern->is_object(), Status::corrupt, "tokenizer.json: ", where, " Replace has no pattern");
  const nlohmann::json* str = find_field(*pattern, "String");
  SLUICE_CHECK(str && str->is_string(), Status::unsupported, "tokenizer.json: ", where,
               " Replace with a Regex pattern is not supported (sluice replaces String patterns)");
  SLUICE_CHECK(!str->get_ref<const std::string&>().empty(), Status::corrupt, "tokenizer.json: ", where,
               " Replace has an empty pattern");
  return str->get<std::string>();
}

std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content) {
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  for (size_t pos = 0;;) {
    const size_t hit = text.find(pattern, pos);
    out.append(text.substr(pos, hit == std::string_view::npos ? std::string_view::npos : hit - pos));
    if (hit == std::string_view::npos) return out;
    out += content;
    pos = hit + pattern.size();
  }
}

namespace {

template <typename Step>
void parse_normalizer(const nlohmann::json& j, std::vector<Step>& steps) {
  if (j.is_null()) return;
  const std::string type = type_of(j, "normalizer");
  if (type == "Sequence") {
    const nlohmann::json* list = find_field(j, "normalizers");
    SLUICE_CHECK(list && list->is_array(), Status::corrupt, "tokenizer.json: normalizer Sequence has no list");
    for (const auto& n : *list) parse_normalizer(n, steps);
    return;
  }
  Step step;
  const int stable = UTF8PROC_STABLE;
  if (type == "NFC") step.form = stable | UTF8PROC_COMPOSE;
  else if (type == "NFD") step.form = stable | UTF8PROC_DECOMPOSE;
  else if (type == "NFKC") step.form = stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  else if (type == "NFKD") step.form = stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  else if (type == "Replace") {
    step.kind = Step::Kind::replace;
    step.pattern = replace_pattern(j, "normalizer");
    step.content = string_field(j, "content", "normalizer Replace");
  } else if (type == "Prepend") {
    step.kind = Step::Kind::prepend;
    step.content = string_field(j, "prepend", "normalizer Prepend");
  } else {
    fail(Status::unsupported, "tokenizer.json: normalizer type \"", type,
         "\" is not supported (sluice has NFC, NFD, NFKC, NFKD, Replace, Prepend and Sequence)");
  }
  steps.push_back(std::move(step));
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  return true;
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& j) {
  Normalizer n;
  parse_normalizer(j, n.steps_);
  return n;
}

bool Normalizer::apply(std::string_view text, std::string& out) const {
  // `now` is the text so far: the input until a step changes it, then `cur`.
  std::string cur;
  std::string_view now = text;
  bool changed = false;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::unicode: {
        if (is_ascii(now)) break;  // ASCII is invariant under all four normalization forms
        utf8proc_uint8_t* dst = nullptr;
        const utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(now.data()),
                                                  static_cast<utf8proc_ssize_t>(now.size()), &dst,
                                                  static_cast<utf8proc_option_t>(step.form));
        if (len < 0) fail(Status::internal, "utf8proc normalization failed: ", utf8proc_errmsg(len));
        const std::string_view normalized(reinterpret_cast<const char*>(dst), static_cast<size_t>(len));
        if (normalized != now) {
          cur.assign(normalized);
          changed = true;
        }
        std::free(dst);
        break;
      }
      case Step::Kind::replace:
        if (now.find(step.pattern) == std::string_view::npos) break;
        cur = replace_all(now, step.pattern, step.content);
        changed = true;
        break;
      case Step::Kind::prepend:
        // tokenizers' Prepend leaves an empty text empty.
        if (now.empty() || step.content.empty()) break;
        cur = step.content + std::string(now);
        changed = true;
        break;
    }
    if (changed) now = cur;
  }
  if (!changed) return false;
  out = std::move(cur);
  return true;
}

// ---- PreTokenizer ------------------------------------------------------------------------

void PreTokenizer::parse_step(const nlohmann::json& j, std::vector<Step>& steps) {
  const std::string type = type_of(j, "pre_tokenizer");
  if (!steps.empty() && steps.back().kind == Step::Kind::byte_level) {
    fail(Status::unsupported, "tokenizer.json: pre_tokenizer \"", type,
         "\" after ByteLevel is not supported (it would split byte-level spelled text)");
  }
  if (type == "Sequence") {
    const nlohmann::json* list = find_field(j, "pretokenizers");
    SLUICE_CHECK(list && list->is_array(), Status::corrupt, "tokenizer.json: pre_tokenizer Sequence has no list");
    for (const auto& s : *list) parse_step(s, steps);
    return;
  }
  Step step;
  if (type == "ByteLevel") {
    step.kind = Step::Kind::byte_level;
    step.add_prefix_space = bool_field(j, "add_prefix_space", true, "pre_tokenizer ByteLevel");
    if (bool_field(j, "use_regex", true, "pre_tokenizer ByteLevel"))
      step.regex = std::make_shared<const Regex>(gpt2_pattern, false, "pre_tokenizer ByteLevel");
  } else if (type == "Split") {
    step.kind = Step::Kind::split;
    const nlohmann::json* pattern = find_field(j, "pattern");
    SLUICE_CHECK(pattern && pattern->is_object(), Status::corrupt, "tokenizer.json: pre_tokenizer Split has no pattern");
    if (const nlohmann::json* re = find_field(*pattern, "Regex"); re && re->is_string()) {
      step.regex = std::make_shared<const Regex>(re->get<std::string>(), false, "pre_tokenizer Split pattern");
    } else if (const nlohmann::json* s = find_field(*pattern, "String"); s && s->is_string()) {
      step.regex = std::make_shared<const Regex>(s->get<std::string>(), true, "pre_tokenizer Split pattern");
    } else {
      fail(Status::corrupt, "tokenizer.json: pre_tokenizer Split pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    const nlohmann::json* behavior = find_field(j, "behavior");
    SLUICE_CHECK(behavior && behavior->is_string(), Status::corrupt, "tokenizer.json: pre_tokenizer Split has no behavior");
    const std::string b = behavior->get<std::string>();
    if (b == "Isolated") step.behavior = SplitBehavior::isolated;
    else if (b == "Removed") step.behavior = SplitBehavior::removed;
    else if (b == "MergedWithPrevious") step.behavior = SplitBehavior::merged_with_previous;
    else if (b == "MergedWithNext") step.behavior = SplitBehavior::merged_with_next;
    else if (b == "Contiguous") step.behavior = SplitBehavior::contiguous;
    else fail(Status::unsupported, "tokenizer.json: pre_tokenizer Split behavior \"", b, "\" is not supported");
    step.invert = bool_field(j, "invert", false, "pre_tokenizer Split");
  } else if (type == "Digits") {
    // tokenizers splits on char::is_numeric (categories Nd, Nl, No): each digit its own match,
    // isolated, or runs kept together.
    step.kind = Step::Kind::split;
    step.regex = std::make_shared<const Regex>("\\p{N}", false, "pre_tokenizer Digits");
    step.behavior = bool_field(j, "individual_digits", false, "pre_tokenizer Digits") ? SplitBehavior::isolated
                                                                                      : SplitBehavior::contiguous;
  } else {
    fail(Status::unsupported, "tokenizer.json: pre_tokenizer type \"", type,
         "\" is not supported (sluice has ByteLevel, Split, Digits and Sequence)");
  }
  steps.push_back(std::move(step));
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer p;
  if (!j.is_null()) parse_step(j, p.steps_);
  return p;
}

bool PreTokenizer::byte_level() const { return !steps_.empty() && steps_.back().kind == Step::Kind::byte_level; }

namespace {

struct Segment {
  uint32_t begin, end;
  bool is_match;
};

// Turns a piece's matches into the pieces tokenizers' NormalizedString::split keeps, in order.
void split_piece(const std::string& arena, Piece piece, const Regex& regex, SplitBehavior behavior, bool invert,
                 RegexScratch& scratch, std::vector<Segment>& segs, std::vector<Piece>& out) {
  const std::string_view text(arena.data() + piece.begin, piece.end - piece.begin);
  regex.find_all(text, scratch.get(), scratch.matches);
  // Segments cover the piece: gaps are non-matches.
  segs.clear();
  uint32_t prev = 0;
  for (const Regex::Match& m : scratch.matches) {
    if (prev != m.begin) segs.push_back({prev, m.begin, invert});
    segs.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev != text.size()) segs.push_back({prev, static_cast<uint32_t>(text.size()), invert});

  auto emit = [&](uint32_t b, uint32_t e) {
    if (b != e) out.push_back({piece.begin + b, piece.begin + e});
  };
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Segment& s : segs) emit(s.begin, s.end);
      break;
    case SplitBehavior::removed:
      for (const Segment& s : segs)
        if (!s.is_match) emit(s.begin, s.end);
      break;
    case SplitBehavior::contiguous:
    case SplitBehavior::merged_with_previous: {
      // Contiguous glues each segment to the last one of the same kind; MergedWithPrevious glues
      // a match to whatever precedes it (unless that was a match too).
      std::vector<Segment> merged;
      bool previous_match = false;
      for (const Segment& s : segs) {
        const bool glue = behavior == SplitBehavior::contiguous ? s.is_match == previous_match
                                                                : (s.is_match && !previous_match);
        if (glue && !merged.empty()) merged.back().end = s.end;
        else merged.push_back(s);
        previous_match = s.is_match;
      }
      for (const Segment& s : merged) emit(s.begin, s.end);
      break;
    }
    case SplitBehavior::merged_with_next: {
      // Walk backwards: a match glues onto the segment after it.
      std::vector<Segment> merged;
      bool previous_match = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) merged.back().begin = it->begin;
        else merged.push_back(*it);
        previous_match = it->is_match;
      }
      for (auto it = merged.rbegin(); it != merged.rend(); ++it) emit(it->begin, it->end);
      break;
    }
  }
}

}  // namespace

void PreTokenizer::run(std::string& arena, std::vector<Piece>& pieces, RegexScratch& scratch) const {
  pieces.clear();
  if (arena.empty()) return;
  pieces.push_back({0, static_cast<uint32_t>(arena.size())});
  std::vector<Piece> next;
  std::vector<Segment> segs;
  for (const Step& step : steps_) {
    next.clear();
    next.reserve(pieces.size());
    for (Piece p : pieces) {
      if (step.kind == Step::Kind::byte_level) {
        if (step.add_prefix_space && arena[p.begin] != ' ') {
          // tokenizers prepends the space to every piece that reaches this step, not only the
          // first one of the text.
          const uint32_t begin = static_cast<uint32_t>(arena.size());
          std::string prefixed;
          prefixed.reserve(p.end - p.begin + 1);
          prefixed += ' ';
          prefixed.append(arena, p.begin, p.end - p.begin);
          arena += prefixed;
          p = {begin, static_cast<uint32_t>(arena.size())};
        }
        if (step.regex) split_piece(arena, p, *step.regex, SplitBehavior::isolated, false, scratch, segs, next);
        else next.push_back(p);
      } else {
        split_piece(arena, p, *step.regex, step.behavior, step.invert, scratch, segs, next);
      }
    }
    pieces.swap(next);
  }
}

}  // namespace sluice
