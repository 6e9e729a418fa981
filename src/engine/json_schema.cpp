// JSON schemas to grammars (json_schema.h).
#include "engine/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <limits>
#include <set>

#include "core/error.h"
#include "format/utf8.h"

namespace sluice {

using nlohmann::json;

namespace {

constexpr int kMaxWs = 12;       // whitespace bytes between two tokens
constexpr int kMaxDigits = 16;   // digits of an integer part, a fraction, (3) an exponent
constexpr int kMaxDepth = 64;    // schema nesting the compiler follows

[[noreturn]] void refuse(const std::string& at, const std::string& what) {
  fail(Status::invalid_argument, "json_schema: ", what, " (at ", at.empty() ? "#" : at, ")");
}

// A count keyword of schema s (minItems, maxLength, ...): 0 to 10000, or dflt when absent.
int64_t count_keyword(const json& s, const std::string& at, const char* kw, int64_t dflt) {
  const auto v = s.find(kw);
  if (v == s.end()) return dflt;
  if (!v->is_number_integer() || v->get<int64_t>() < 0) refuse(at, str("'", kw, "' must be a non-negative integer"));
  if (v->get<int64_t>() > 10000) refuse(at, str("'", kw, "' above 10000 is not supported"));
  return v->get<int64_t>();
}

GExpr digit() { return g_bytes(byte_range('0', '9')); }
GExpr digits(int min, int max) { return g_repeat(digit(), min, max); }

// Any non-ASCII code point in UTF-8 (no surrogates, no overlong forms).
GExpr utf8_multibyte() {
  const GExpr cont = g_bytes(byte_range(0x80, 0xBF));
  return g_alt({
      g_seq({g_bytes(byte_range(0xC2, 0xDF)), cont}),
      g_seq({g_lit("\xE0"), g_bytes(byte_range(0xA0, 0xBF)), cont}),
      g_seq({g_bytes(byte_range(0xE1, 0xEC)), cont, cont}),
      g_seq({g_lit("\xED"), g_bytes(byte_range(0x80, 0x9F)), cont}),
      g_seq({g_bytes(byte_range(0xEE, 0xEF)), cont, cont}),
      g_seq({g_lit("\xF0"), g_bytes(byte_range(0x90, 0xBF)), cont, cont}),
      g_seq({g_bytes(byte_range(0xF1, 0xF3)), cont, cont, cont}),
      g_seq({g_lit("\xF4"), g_bytes(byte_range(0x80, 0x8F)), cont, cont}),
  });
}

// ASCII characters as JSON writes them inside a string: printable ones raw (quote and
// backslash escaped), control characters as \uXXXX (or their short escapes).
GExpr json_ascii_chars(const std::array<bool, 128>& in) {
  ByteSet raw{};
  std::vector<GExpr> alts;
  for (int c = 0; c < 128; ++c) {
    if (!in[static_cast<size_t>(c)]) continue;
    if (c == '"') alts.push_back(g_lit("\\\""));
    else if (c == '\\') alts.push_back(g_lit("\\\\"));
    else if (c == '\n') alts.push_back(g_lit("\\n"));
    else if (c == '\t') alts.push_back(g_lit("\\t"));
    else if (c == '\r') alts.push_back(g_lit("\\r"));
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      alts.push_back(g_lit(buf));
    } else {
      raw[static_cast<size_t>(c) >> 6] |= uint64_t{1} << (c & 63);
    }
  }
  if (raw != ByteSet{}) alts.insert(alts.begin(), g_bytes(raw));
  SLUICE_CHECK(!alts.empty(), Status::invalid_argument, "json_schema: a pattern's character class matches nothing");
  return g_alt(std::move(alts));
}

// ---- the pattern subset: a recursive-descent parser straight to grammar expressions ----

struct CharClass {
  std::array<bool, 128> ascii{};
  bool non_ascii = false;             // every code point >= 0x80
  std::vector<uint32_t> extra;        // single code points >= 0x80 (positive classes)
  GExpr expr() const {
    std::vector<GExpr> alts;
    if (std::any_of(ascii.begin(), ascii.end(), [](bool b) { return b; })) alts.push_back(json_ascii_chars(ascii));
    if (non_ascii) alts.push_back(utf8_multibyte());
    else
      for (uint32_t cp : extra) {
        std::string bytes;
        utf8_append(bytes, cp);
        alts.push_back(g_lit(std::move(bytes)));
      }
    SLUICE_CHECK(!alts.empty(), Status::invalid_argument, "json_schema: a pattern's character class matches nothing");
    return g_alt(std::move(alts));
  }
  void add_range(uint32_t lo, uint32_t hi, const std::string& pattern) {
    for (uint32_t c = lo; c <= hi && c < 128; ++c) ascii[c] = true;
    if (hi >= 128) {
      SLUICE_CHECK(hi - std::max<uint32_t>(lo, 128) < 256, Status::invalid_argument, "json_schema: pattern '", pattern,
                   "': a range of non-ASCII characters wider than 256 is not supported");
      for (uint32_t c = std::max<uint32_t>(lo, 128); c <= hi; ++c) extra.push_back(c);
    }
  }
  void invert() {
    for (auto& b : ascii) b = !b;
    SLUICE_CHECK(extra.empty(), Status::invalid_argument,
                 "json_schema: a negated character class with non-ASCII characters is not supported");
    non_ascii = !non_ascii;
  }
};

class PatternParser {
 public:
  explicit PatternParser(const std::string& p) : p_(p) {}

  GExpr parse() {
    size_t end = p_.size();
    if (!p_.empty() && p_[0] == '^') ++at_;
    if (end > at_ && p_[end - 1] == '$' && (end < 2 || p_[end - 2] != '\\')) --end;
    end_ = end;
    GExpr e = alternation();
    if (at_ != end_) bad("unexpected '" + std::string(1, p_[at_]) + "'");
    return e;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    fail(Status::invalid_argument, "json_schema: pattern '", p_, "': ", why, " (sluice supports literals, classes, ., "
         "\\d \\w \\s, groups, | and quantifiers)");
  }
  bool more() const { return at_ < end_; }
  char peek() const { return p_[at_]; }

  GExpr alternation() {
    std::vector<GExpr> alts{sequence()};
    while (more() && peek() == '|') {
      ++at_;
      alts.push_back(sequence());
    }
    return g_alt(std::move(alts));
  }
  GExpr sequence() {
    std::vector<GExpr> items;
    while (more() && peek() != '|' && peek() != ')') items.push_back(quantified());
    return g_seq(std::move(items));
  }
  int number() {
    size_t start = at_;
    while (more() && std::isdigit(static_cast<unsigned char>(peek()))) ++at_;
    if (start == at_) bad("a number is expected in {}");
    if (at_ - start > 5) bad("a repetition count above 99999");
    return std::stoi(p_.substr(start, at_ - start));
  }
  GExpr quantified() {
    GExpr atom_e = atom();
    if (!more()) return atom_e;
    int min = -1, max = -1;
    const char c = peek();
    if (c == '*') min = 0, max = -1, ++at_;
    else if (c == '+') min = 1, max = -1, ++at_;
    else if (c == '?') min = 0, max = 1, ++at_;
    else if (c == '{') {
      ++at_;
      min = number();
      max = min;
      if (more() && peek() == ',') {
        ++at_;
        max = more() && peek() == '}' ? -1 : number();
      }
      if (!more() || peek() != '}') bad("'{' without '}'");
      ++at_;
      if (max >= 0 && max < min) bad("a repetition {m,n} with n < m");
    } else {
      return atom_e;
    }
    if (more() && peek() == '?') ++at_;  // lazy: the same strings
    if (more() && (peek() == '*' || peek() == '+' || peek() == '{')) bad("a quantifier after a quantifier");
    return g_repeat(atom_e, min, max);
  }
  uint32_t utf8_char() {  // one code point of the pattern (UTF-8)
    const unsigned char c = static_cast<unsigned char>(p_[at_]);
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < n && at_ + i < p_.size(); ++i) cp = (cp << 6) | (static_cast<unsigned char>(p_[at_ + i]) & 0x3F);
    at_ += static_cast<size_t>(n);
    return cp;
  }
  // An escape after '\': a class (\d ...) into cls, or one character (returned).
  std::optional<uint32_t> escape(CharClass& cls) {
    if (!more()) bad("a trailing backslash");
    const char c = p_[at_++];
    auto set_class = [&](const char* ranges, bool negate) {
      CharClass k;
      for (const char* r = ranges; *r; r += 2) k.add_range(static_cast<uint8_t>(r[0]), static_cast<uint8_t>(r[1]), p_);
      if (negate) k.invert();
      for (size_t i = 0; i < 128; ++i) cls.ascii[i] = cls.ascii[i] || k.ascii[i];
      cls.non_ascii = cls.non_ascii || k.non_ascii;
    };
    switch (c) {
      case 'd': set_class("09", false); return std::nullopt;
      case 'D': set_class("09", true); return std::nullopt;
      case 'w': set_class("09azAZ__", false); return std::nullopt;
      case 'W': set_class("09azAZ__", true); return std::nullopt;
      case 's': set_class("\t\r  ", false); return std::nullopt;
      case 'S': set_class("\t\r  ", true); return std::nullopt;
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'u': {
        if (at_ + 4 > p_.size()) bad("\\u needs 4 hex digits");
        const uint32_t cp = static_cast<uint32_t>(std::stoul(p_.substr(at_, 4), nullptr, 16));
        at_ += 4;
        if (cp >= 0xD800 && cp <= 0xDFFF) bad("a surrogate \\u escape");
        return cp;
      }
      case 'x': {
        if (at_ + 2 > p_.size()) bad("\\x needs 2 hex digits");
        const uint32_t cp = static_cast<uint32_t>(std::stoul(p_.substr(at_, 2), nullptr, 16));
        at_ += 2;
        return cp;
      }
      default:
        if (std::isalnum(static_cast<unsigned char>(c))) bad(std::string("the escape \\") + c);
        return static_cast<uint32_t>(static_cast<unsigned char>(c));
    }
  }
  GExpr atom() {
    const char c = peek();
    if (c == '(') {
      ++at_;
      if (more() && peek() == '?') {
        if (at_ + 1 < end_ && p_[at_ + 1] == ':') at_ += 2;
        else bad("lookaround and named groups");
      }
      GExpr e = alternation();
      if (!more() || peek() != ')') bad("'(' without ')'");
      ++at_;
      return e;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++at_;
      CharClass k;
      k.ascii.fill(true);
      k.ascii['\n'] = k.ascii['\r'] = false;
      k.non_ascii = true;
      return k.expr();
    }
    if (c == '^' || c == '$') bad("an anchor inside the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') bad("a quantifier with nothing before it");
    CharClass k;
    if (c == '\\') {
      ++at_;
      if (more() && (peek() == 'b' || peek() == 'B')) bad("word boundaries");
      if (more() && std::isdigit(static_cast<unsigned char>(peek())) && peek() != '0') bad("back references");
      if (auto one = escape(k)) k.add_range(*one, *one, p_);
      return k.expr();
    }
    const uint32_t cp = utf8_char();
    k.add_range(cp, cp, p_);
    return k.expr();
  }
  GExpr char_class() {
    ++at_;  // [
    CharClass k;
    bool negate = false;
    if (at_ < p_.size() && p_[at_] == '^') negate = true, ++at_;
    bool first = true;
    while (at_ < p_.size() && (p_[at_] != ']' || first)) {
      first = false;
      std::optional<uint32_t> lo;
      if (p_[at_] == '\\') {
        ++at_;
        lo = escape(k);
        if (!lo) continue;
      } else {
        lo = utf8_char();
      }
      if (at_ + 1 < p_.size() && p_[at_] == '-' && p_[at_ + 1] != ']') {
        ++at_;
        std::optional<uint32_t> hi;
        if (p_[at_] == '\\') {
          ++at_;
          hi = escape(k);
          if (!hi) bad("a range ending in a class");
        } else {
          hi = utf8_char();
        }
        if (*hi < *lo) bad("a range out of order");
        k.add_range(*lo, *hi, p_);
      } else {
        k.add_range(*lo, *lo, p_);
      }
    }
    if (at_ >= p_.size()) bad("'[' without ']'");
    ++at_;
    if (negate) k.invert();
    return k.expr();
  }

  const std::string& p_;
  size_t at_ = 0, end_ = 0;
};

// ---- integer ranges ----

// Decimal strings of equal length n from lo to hi (each n digits; leading zeros allowed).
GExpr digit_range(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return g_empty();
  if (lo[0] == hi[0]) return g_seq({g_lit(std::string(1, lo[0])), digit_range(lo.substr(1), hi.substr(1))});
  const size_t n = lo.size() - 1;
  if (lo.substr(1) == std::string(n, '0') && hi.substr(1) == std::string(n, '9'))
    return g_seq({g_bytes(byte_range(static_cast<uint8_t>(lo[0]), static_cast<uint8_t>(hi[0]))), digits(static_cast<int>(n), static_cast<int>(n))});
  std::vector<GExpr> alts;
  alts.push_back(g_seq({g_lit(std::string(1, lo[0])), digit_range(lo.substr(1), std::string(n, '9'))}));
  if (lo[0] + 1 <= hi[0] - 1)
    alts.push_back(g_seq({g_bytes(byte_range(static_cast<uint8_t>(lo[0] + 1), static_cast<uint8_t>(hi[0] - 1))),
                          digits(static_cast<int>(n), static_cast<int>(n))}));
  alts.push_back(g_seq({g_lit(std::string(1, hi[0])), digit_range(std::string(n, '0'), hi.substr(1))}));
  return g_alt(std::move(alts));
}

// Non-negative integers from lo to hi (hi < 0: up to kMaxDigits digits), without leading zeros.
GExpr natural_range(int64_t lo, int64_t hi) {
  const std::string los = std::to_string(lo);
  const size_t max_len = hi < 0 ? static_cast<size_t>(std::max<int>(kMaxDigits, static_cast<int>(los.size())))
                                : std::to_string(hi).size();
  std::vector<GExpr> alts;
  for (size_t len = los.size(); len <= max_len; ++len) {
    const std::string first = len == 1 ? std::string("0") : "1" + std::string(len - 1, '0');
    const std::string last = std::string(len, '9');
    std::string a = len == los.size() ? los : first;
    std::string b = hi >= 0 && len == max_len ? std::to_string(hi) : last;
    if (len == los.size() && a < first) a = first;
    if (a > b) continue;
    if (hi < 0 && len > los.size()) {  // every longer length at once: [1-9][0-9]{len-1, max-1}
      alts.push_back(g_seq({g_bytes(byte_range('1', '9')), digits(static_cast<int>(len) - 1, static_cast<int>(max_len) - 1)}));
      break;
    }
    alts.push_back(digit_range(a, b));
  }
  if (alts.empty()) fail(Status::invalid_argument, "json_schema: no integer lies between ", lo, " and ", hi);
  return g_alt(std::move(alts));
}

// Integers in [lo, hi] (either side may be open).
GExpr integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi, const std::string& at) {
  if (lo && hi && *lo > *hi) refuse(at, str("no integer lies between minimum ", *lo, " and maximum ", *hi));
  const int64_t cap = 999'999'999'999'999LL;  // 15 digits: magnitudes the range grammar spells
  if ((lo && (*lo > cap || *lo < -cap)) || (hi && (*hi > cap || *hi < -cap)))
    refuse(at, "integer bounds beyond 15 digits are not supported");
  std::vector<GExpr> alts;
  if (!lo || *lo < 0) {  // negative part: -magnitude, magnitude in [max(1, -hi), -lo]
    const int64_t mag_lo = hi && *hi < 0 ? -*hi : 1;
    const int64_t mag_hi = lo ? -*lo : -1;
    alts.push_back(g_seq({g_lit("-"), natural_range(mag_lo, mag_hi)}));
  }
  if (!hi || *hi >= 0) alts.push_back(natural_range(lo && *lo > 0 ? *lo : 0, hi ? *hi : -1));
  return g_alt(std::move(alts));
}

const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict",
                                          "$anchor", "contentMediaType", "contentEncoding"};
  return s;
}

const std::set<std::string>& known_keywords() {
  static const std::set<std::string> s = {
      "type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems", "maxItems",
      "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength", "pattern", "minimum", "maximum",
      "exclusiveMinimum", "exclusiveMaximum"};
  return s;
}

std::string pointer_join(const std::string& at, const std::string& key) { return (at.empty() ? "#" : at) + "/" + key; }

bool value_has_type(const json& v, const std::string& t) {
  if (t == "string") return v.is_string();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  return false;
}

// Shallow merge of schema objects (allOf, anyOf's siblings): keys must not clash.
json merged(const json& a, const json& b, const std::string& at, const char* how) {
  // additionalProperties sees only the properties beside it: merged with properties from the
  // other side it would mean something else.
  if ((a.contains("additionalProperties") && b.contains("properties")) ||
      (b.contains("additionalProperties") && a.contains("properties")))
    refuse(at, str("'additionalProperties' beside '", how, "' whose other part sets 'properties' is not supported"));
  json out = a;
  for (auto it = b.begin(); it != b.end(); ++it) {
    if (annotations().count(it.key())) continue;
    if (out.contains(it.key()) && out[it.key()] != it.value())
      refuse(at, str("'", how, "' whose branches and siblings both set '", it.key(), "' is not supported"));
    out[it.key()] = it.value();
  }
  return out;
}

}  // namespace

GExpr json_string_pattern(const std::string& pattern) { return PatternParser(pattern).parse(); }

JsonGrammar::JsonGrammar(GrammarBuilder& b, bool compact) : b_(b), compact_(compact) {}

GExpr JsonGrammar::ws() {
  // Nothing, one space, or a newline and an indent: compact and pretty-printed JSON both,
  // without runs of blank space a sampled reply could spend its tokens on.
  if (ws_ < 0 && compact_) ws_ = b_.rule("ws", g_opt(g_lit(" ")));
  if (ws_ < 0)
    ws_ = b_.rule("ws", g_opt(g_alt({g_lit(" "), g_seq({g_lit("\n"), g_repeat(g_bytes(byte_set_of(" \t")), 0, kMaxWs - 1)})})));
  return g_ref(ws_);
}

GExpr JsonGrammar::string_char() {
  if (char_ < 0) {
    ByteSet raw = byte_range(0x20, 0x7F);
    raw['"' >> 6] &= ~(uint64_t{1} << ('"' & 63));
    raw['\\' >> 6] &= ~(uint64_t{1} << ('\\' & 63));
    const GExpr hex = g_bytes(byte_set_of("0123456789abcdefABCDEF"));
    // \u escapes of surrogates are left out: they would need a pair, and a lone one is not
    // text that every JSON parser takes.
    const GExpr u = g_seq({g_lit("\\u"), g_alt({g_seq({g_bytes(byte_set_of("0123456789abcABC")), hex, hex, hex}),
                                                g_seq({g_bytes(byte_set_of("dD")), g_bytes(byte_range('0', '7')), hex, hex}),
                                                g_seq({g_bytes(byte_set_of("efEF")), hex, hex, hex})})});
    char_ = b_.rule("char", g_alt({g_bytes(raw), g_seq({g_lit("\\"), g_bytes(byte_set_of("\"\\/bfnrt"))}), u, utf8_multibyte()}));
  }
  return g_ref(char_);
}

GExpr JsonGrammar::any_string() {
  if (string_ < 0) string_ = b_.rule("string", g_seq({g_lit("\""), g_star(string_char()), g_lit("\"")}));
  return g_ref(string_);
}

GExpr JsonGrammar::any_value() {
  if (value_ < 0) {
    value_ = b_.declare("value");
    object_ = b_.declare("object");
    array_ = b_.declare("array");
    const GExpr number = g_seq({g_opt(g_lit("-")), g_alt({g_lit("0"), g_seq({g_bytes(byte_range('1', '9')), digits(0, kMaxDigits - 1)})}),
                                g_opt(g_seq({g_lit("."), digits(1, kMaxDigits)})),
                                g_opt(g_seq({g_bytes(byte_set_of("eE")), g_opt(g_bytes(byte_set_of("+-"))), digits(1, 3)}))});
    b_.define(value_, g_alt({g_ref(object_), g_ref(array_), any_string(), number, g_lit("true"), g_lit("false"), g_lit("null")}));
    const GExpr sep = g_seq({ws(), g_lit(","), ws()});
    const GExpr member = g_seq({any_string(), ws(), g_lit(":"), ws(), g_ref(value_)});
    b_.define(object_, g_seq({g_lit("{"), ws(), g_opt(g_seq({member, g_star(g_seq({sep, member}))})), ws(), g_lit("}")}));
    b_.define(array_, g_seq({g_lit("["), ws(), g_opt(g_seq({g_ref(value_), g_star(g_seq({sep, g_ref(value_)}))})), ws(), g_lit("]")}));
  }
  return g_ref(value_);
}

GExpr JsonGrammar::any_object() {
  any_value();
  return g_ref(object_);
}

GExpr JsonGrammar::schema(const json& s) {
  const json* saved = doc_;
  doc_ = &s;
  ++doc_counter_;
  GExpr e;
  try {
    e = node(s, "", 0);
  } catch (...) {
    doc_ = saved;
    throw;
  }
  doc_ = saved;
  return e;
}

GExpr JsonGrammar::ref(const std::string& pointer, const std::string& at, int depth) {
  const std::string key = str(doc_counter_, pointer);
  if (auto it = refs_.find(key); it != refs_.end()) return g_ref(it->second);
  if (pointer.empty() || pointer[0] != '#') refuse(at, str("'$ref' '", pointer, "' is not a reference into this schema"));
  const json* target = doc_;
  std::string rest = pointer.substr(1);
  if (!rest.empty()) {
    json::json_pointer jp;
    try {
      jp = json::json_pointer(rest);
    } catch (const json::exception&) {
      refuse(at, str("'$ref' '", pointer, "' is not a JSON pointer"));
    }
    if (!doc_->contains(jp)) refuse(at, str("'$ref' '", pointer, "' points at nothing"));
    target = &doc_->at(jp);
  }
  const int r = b_.declare("ref" + pointer);
  refs_[key] = r;
  b_.define(r, node(*target, pointer, depth + 1));
  return g_ref(r);
}

GExpr JsonGrammar::node(const json& s, const std::string& at, int depth) {
  if (depth > kMaxDepth) refuse(at, str("the schema nests deeper than ", kMaxDepth, " levels"));
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value();
    refuse(at, "the schema false accepts nothing");
  }
  if (!s.is_object()) refuse(at, "a schema must be an object or a boolean");
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!annotations().count(it.key()) && !known_keywords().count(it.key()))
      refuse(at, str("'", it.key(), "' is not supported"));
  if (const auto r = s.find("$ref"); r != s.end()) {
    if (!r->is_string()) refuse(at, "'$ref' must be a string");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != "$ref" && !annotations().count(it.key()))
        refuse(at, str("'$ref' beside '", it.key(), "' is not supported"));
    return ref(r->get<std::string>(), at, depth);
  }
  if (const auto all = s.find("allOf"); all != s.end()) {
    if (!all->is_array() || all->empty()) refuse(at, "'allOf' must be a non-empty list");
    json rest = s;
    rest.erase("allOf");
    for (const json& branch : *all) {
      if (!branch.is_object()) refuse(at, "'allOf' branches must be objects");
      if (branch.contains("$ref")) refuse(at, "'allOf' with a '$ref' branch is not supported");
      rest = merged(rest, branch, at, "allOf");
    }
    return node(rest, at, depth + 1);
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    const auto any = s.find(kw);
    if (any == s.end()) continue;
    if (!any->is_array() || any->empty()) refuse(at, str("'", kw, "' must be a non-empty list"));
    json siblings = s;
    siblings.erase(kw);
    if (siblings.contains("anyOf") || siblings.contains("oneOf")) refuse(at, "'anyOf' beside 'oneOf' is not supported");
    bool plain = true;
    for (auto it = siblings.begin(); it != siblings.end(); ++it) plain = plain && annotations().count(it.key());
    std::vector<GExpr> alts;
    for (size_t i = 0; i < any->size(); ++i) {
      const std::string where = pointer_join(at, str(kw, "/", i));
      const json& branch = (*any)[i];
      if (plain || branch.is_boolean()) alts.push_back(node(branch, where, depth + 1));
      else if (branch.contains("$ref")) refuse(where, str("a '$ref' branch of '", kw, "' with sibling keywords is not supported"));
      else alts.push_back(node(merged(siblings, branch, where, kw), where, depth + 1));
    }
    return g_alt(std::move(alts));
  }
  if (const auto c = s.find("const"); c != s.end()) return g_lit(c->dump());
  if (const auto e = s.find("enum"); e != s.end()) {
    if (!e->is_array() || e->empty()) refuse(at, "'enum' must be a non-empty list");
    std::vector<GExpr> alts;
    const auto t = s.find("type");
    for (const json& v : *e) {
      bool typed_ok = true;
      if (t != s.end() && t->is_string()) typed_ok = value_has_type(v, t->get<std::string>());
      if (t != s.end() && t->is_array())
        typed_ok = std::any_of(t->begin(), t->end(), [&](const json& x) { return x.is_string() && value_has_type(v, x.get<std::string>()); });
      if (typed_ok) alts.push_back(g_lit(v.dump()));
    }
    if (alts.empty()) refuse(at, "no 'enum' value has the schema's 'type'");
    return g_alt(std::move(alts));
  }
  const auto t = s.find("type");
  if (t == s.end()) {
    // The type the keywords imply, else any value.
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) return typed(s, "object", at, depth);
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed(s, "array", at, depth);
    if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) return typed(s, "string", at, depth);
    if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum"))
      return typed(s, "number", at, depth);
    return any_value();
  }
  if (t->is_string()) return typed(s, t->get<std::string>(), at, depth);
  if (!t->is_array() || t->empty()) refuse(at, "'type' must be a string or a non-empty list of strings");
  std::vector<GExpr> alts;
  for (const json& x : *t) {
    if (!x.is_string()) refuse(at, "'type' must be a string or a non-empty list of strings");
    alts.push_back(typed(s, x.get<std::string>(), at, depth));
  }
  return g_alt(std::move(alts));
}

GExpr JsonGrammar::typed(const json& s, const std::string& type, const std::string& at, int depth) {
  if (type == "object") return object(s, at, depth);
  if (type == "array") return array(s, at, depth);
  if (type == "string") return string(s, at);
  if (type == "integer") return integer(s, at);
  if (type == "number") return number(s, at);
  if (type == "boolean") return g_alt({g_lit("true"), g_lit("false")});
  if (type == "null") return g_lit("null");
  refuse(at, str("'type' '", type, "' is not a JSON-schema type"));
}

GExpr JsonGrammar::object(const json& s, const std::string& at, int depth) {
  std::vector<std::pair<std::string, const json*>> props;  // in the schema's order
  static const json any_schema = json::object();
  if (const auto p = s.find("properties"); p != s.end()) {
    if (!p->is_object()) refuse(at, "'properties' must be an object");
    // nlohmann::json sorts keys; the schema's order is kept by the caller's ordered parse
    // where it matters (tool arguments), and any order validates.
    for (auto it = p->begin(); it != p->end(); ++it) props.emplace_back(it.key(), &it.value());
  }
  std::set<std::string> required;
  if (const auto r = s.find("required"); r != s.end()) {
    if (!r->is_array()) refuse(at, "'required' must be a list of strings");
    for (const json& name : *r) {
      if (!name.is_string()) refuse(at, "'required' must be a list of strings");
      required.insert(name.get<std::string>());
      if (std::none_of(props.begin(), props.end(), [&](const auto& pr) { return pr.first == name.get<std::string>(); }))
        props.emplace_back(name.get<std::string>(), &any_schema);
    }
  }
  const auto addl = s.find("additionalProperties");
  if (addl != s.end() && !addl->is_boolean() && !addl->is_object()) refuse(at, "'additionalProperties' must be a boolean or a schema");
  const GExpr sep = g_seq({ws(), g_lit(","), ws()});
  if (props.empty()) {
    if (addl != s.end() && addl->is_boolean() && !addl->get<bool>()) return g_lit("{}");
    const GExpr value = addl != s.end() && addl->is_object() ? node(*addl, pointer_join(at, "additionalProperties"), depth + 1) : any_value();
    const GExpr member = g_seq({any_string(), ws(), g_lit(":"), ws(), value});
    return g_seq({g_lit("{"), ws(), g_opt(g_seq({member, g_star(g_seq({sep, member}))})), ws(), g_lit("}")});
  }
  std::vector<GExpr> kv;
  for (const auto& [name, schema] : props)
    kv.push_back(g_seq({g_lit(json(name).dump()), ws(), g_lit(":"), ws(),
                        node(*schema, pointer_join(at, "properties/" + name), depth + 1)}));
  // rest(i): properties i.. after something was written; first(i): before anything was.
  const size_t n = props.size();
  std::vector<int> rest(n + 1), first(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    rest[i] = b_.declare(str("props", at, "+", i));
    first[i] = b_.declare(str("props", at, "^", i));
  }
  for (size_t i = n + 1; i-- > 0;) {
    if (i == n) {
      b_.define(rest[i], g_empty());
      b_.define(first[i], g_empty());
      continue;
    }
    const bool req = required.count(props[i].first) > 0;
    const GExpr written = g_seq({sep, kv[i], g_ref(rest[i + 1])});
    b_.define(rest[i], req ? written : g_alt({written, g_ref(rest[i + 1])}));
    const GExpr starts = g_seq({kv[i], g_ref(rest[i + 1])});
    b_.define(first[i], req ? starts : g_alt({starts, g_ref(first[i + 1])}));
  }
  return g_seq({g_lit("{"), ws(), g_ref(first[0]), ws(), g_lit("}")});
}

GExpr JsonGrammar::array(const json& s, const std::string& at, int depth) {
  GExpr item = any_value();
  if (const auto it = s.find("items"); it != s.end()) {
    if (it->is_array()) refuse(at, "'items' as a list (tuples) is not supported");
    item = node(*it, pointer_join(at, "items"), depth + 1);
  }
  const int64_t min = count_keyword(s, at, "minItems", 0), max = count_keyword(s, at, "maxItems", -1);
  if (max >= 0 && max < min) refuse(at, "'maxItems' is below 'minItems'");
  if (max == 0) return g_seq({g_lit("["), ws(), g_lit("]")});
  const GExpr sep = g_seq({ws(), g_lit(","), ws()});
  const GExpr more = g_repeat(g_seq({sep, item}), static_cast<int>(std::max<int64_t>(min - 1, 0)), max < 0 ? -1 : static_cast<int>(max - 1));
  const GExpr items = g_seq({item, more});
  return g_seq({g_lit("["), ws(), min == 0 ? g_opt(items) : items, ws(), g_lit("]")});
}

GExpr JsonGrammar::string(const json& s, const std::string& at) {
  const int64_t min = count_keyword(s, at, "minLength", 0), max = count_keyword(s, at, "maxLength", -1);
  if (max >= 0 && max < min) refuse(at, "'maxLength' is below 'minLength'");
  if (const auto p = s.find("pattern"); p != s.end()) {
    if (!p->is_string()) refuse(at, "'pattern' must be a string");
    if (s.contains("minLength") || s.contains("maxLength")) refuse(at, "'pattern' beside 'minLength' or 'maxLength' is not supported");
    try {
      return g_seq({g_lit("\""), json_string_pattern(p->get<std::string>()), g_lit("\"")});
    } catch (const Error& e) {
      refuse(at, e.what());
    }
  }
  if (min == 0 && max < 0) return any_string();
  return g_seq({g_lit("\""), g_repeat(string_char(), static_cast<int>(min), static_cast<int>(max)), g_lit("\"")});
}

namespace {

// A bound of an integer range from minimum / exclusiveMinimum (lower) or maximum /
// exclusiveMaximum: the tightest integer inside it.
std::optional<int64_t> int_bound(const json& s, bool lower, const std::string& at) {
  std::optional<double> bound;
  const char* incl = lower ? "minimum" : "maximum";
  const char* excl = lower ? "exclusiveMinimum" : "exclusiveMaximum";
  if (const auto v = s.find(incl); v != s.end()) {
    if (!v->is_number()) refuse(at, str("'", incl, "' must be a number"));
    const double d = v->get<double>();
    bound = lower ? std::ceil(d) : std::floor(d);
  }
  if (const auto v = s.find(excl); v != s.end()) {
    if (!v->is_number()) refuse(at, str("'", excl, "' must be a number (the draft-4 boolean form is not supported)"));
    const double d = v->get<double>();
    const double b = lower ? std::floor(d) + 1 : std::ceil(d) - 1;
    bound = !bound ? b : lower ? std::max(*bound, b) : std::min(*bound, b);
  }
  if (!bound) return std::nullopt;
  if (std::fabs(*bound) > 1e15) refuse(at, "integer bounds beyond 15 digits are not supported");
  return static_cast<int64_t>(*bound);
}

}  // namespace

GExpr JsonGrammar::integer(const json& s, const std::string& at) {
  const auto lo = int_bound(s, true, at), hi = int_bound(s, false, at);
  if (!lo && !hi) return g_seq({g_opt(g_lit("-")), g_alt({g_lit("0"), g_seq({g_bytes(byte_range('1', '9')), digits(0, kMaxDigits - 1)})})});
  return integer_range(lo, hi, at);
}

GExpr JsonGrammar::number(const json& s, const std::string& at) {
  const GExpr fraction = g_seq({g_lit("."), digits(1, kMaxDigits)});
  const bool bounded = s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum");
  if (!bounded) {
    const GExpr exponent = g_seq({g_bytes(byte_set_of("eE")), g_opt(g_bytes(byte_set_of("+-"))), digits(1, 3)});
    return g_seq({g_opt(g_lit("-")), g_alt({g_lit("0"), g_seq({g_bytes(byte_range('1', '9')), digits(0, kMaxDigits - 1)})}),
                  g_opt(fraction), g_opt(exponent)});
  }
  // Integral inclusive bounds: an integer part in [lo, hi - 1] with an optional fraction, or
  // hi itself; numbers below zero only when the bounds are whole and the lower one is >= 0.
  if (s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum"))
    refuse(at, "'exclusiveMinimum' / 'exclusiveMaximum' on a number are not supported (on an integer they are)");
  auto whole = [&](const char* kw) -> std::optional<int64_t> {
    const auto v = s.find(kw);
    if (v == s.end()) return std::nullopt;
    if (!v->is_number() || std::floor(v->get<double>()) != v->get<double>() || std::fabs(v->get<double>()) > 1e15)
      refuse(at, str("'", kw, "' on a number must be a whole number (of at most 15 digits)"));
    return static_cast<int64_t>(v->get<double>());
  };
  const auto lo = whole("minimum"), hi = whole("maximum");
  if (!lo || *lo < 0) refuse(at, "a number needs a 'minimum' >= 0 to take bounds (an integer takes any)");
  if (hi && *hi < *lo) refuse(at, "'maximum' is below 'minimum'");
  if (hi && *hi == *lo) return g_lit(std::to_string(*lo));
  const GExpr below = g_seq({integer_range(lo, hi ? std::optional<int64_t>(*hi - 1) : std::nullopt, at), g_opt(fraction)});
  return hi ? g_alt({below, g_lit(std::to_string(*hi))}) : below;
}

std::shared_ptr<const Grammar> json_schema_grammar(const json& schema) {
  GrammarBuilder b;
  JsonGrammar j(b);
  const int root = b.declare("root");
  b.define(root, j.schema(schema));
  return b.build(root);
}

std::shared_ptr<const Grammar> json_object_grammar() {
  GrammarBuilder b;
  JsonGrammar j(b);
  const int root = b.declare("root");
  b.define(root, j.any_object());
  return b.build(root);
}

}  // namespace sluice
