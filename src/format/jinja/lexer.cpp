// The lexer (see lexer.h): a port of @huggingface/jinja 0.5.11's lexer.ts, kept in its order
// so that the two can be read side by side.
#include "format/jinja/lexer.h"

#include <optional>

#include "core/error.h"
#include "format/jinja/js_text.h"
#include "format/utf8.h"

namespace sluice::jinja {

const char* token_type_name(TokenType type) {
  switch (type) {
    case TokenType::text: return "Text";
    case TokenType::numeric_literal: return "NumericLiteral";
    case TokenType::string_literal: return "StringLiteral";
    case TokenType::identifier: return "Identifier";
    case TokenType::equals: return "Equals";
    case TokenType::open_paren: return "OpenParen";
    case TokenType::close_paren: return "CloseParen";
    case TokenType::open_statement: return "OpenStatement";
    case TokenType::close_statement: return "CloseStatement";
    case TokenType::open_expression: return "OpenExpression";
    case TokenType::close_expression: return "CloseExpression";
    case TokenType::open_square_bracket: return "OpenSquareBracket";
    case TokenType::close_square_bracket: return "CloseSquareBracket";
    case TokenType::open_curly_bracket: return "OpenCurlyBracket";
    case TokenType::close_curly_bracket: return "CloseCurlyBracket";
    case TokenType::comma: return "Comma";
    case TokenType::dot: return "Dot";
    case TokenType::colon: return "Colon";
    case TokenType::pipe: return "Pipe";
    case TokenType::additive_binary_operator: return "AdditiveBinaryOperator";
    case TokenType::multiplicative_binary_operator: return "MultiplicativeBinaryOperator";
    case TokenType::exponentiation_binary_operator: return "ExponentiationBinaryOperator";
    case TokenType::comparison_binary_operator: return "ComparisonBinaryOperator";
    case TokenType::unary_operator: return "UnaryOperator";
    case TokenType::comment: return "Comment";
  }
  return "?";
}

namespace {

// Appends s[from, to) of `in` to `out` with its line numbers.
void copy_range(const PreprocessedSource& in, size_t from, size_t to, PreprocessedSource& out) {
  out.text.append(in.text, from, to - from);
  out.line.insert(out.line.end(), in.line.begin() + static_cast<std::ptrdiff_t>(from),
                  in.line.begin() + static_cast<std::ptrdiff_t>(to));
}

// Byte length of a JavaScript line terminator (\n, \r, U+2028, U+2029) at s[pos], or 0.
size_t line_terminator_length(std::string_view s, size_t pos) {
  if (s[pos] == '\n' || s[pos] == '\r') return 1;
  if (s.substr(pos, 3) == "\u2028" || s.substr(pos, 3) == "\u2029") return 3;
  return 0;
}

// lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1" (spaces and tabs before a block at a line start).
PreprocessedSource lstrip_blocks(const PreprocessedSource& in) {
  const std::string_view s = in.text;
  PreprocessedSource out;
  size_t copied = 0;
  bool line_start = true;
  for (size_t i = 0; i < s.size();) {
    if (line_start) {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j > i && j + 1 < s.size() && s[j] == '{' && (s[j + 1] == '#' || s[j + 1] == '%' || s[j + 1] == '-')) {
        copy_range(in, copied, i, out);
        copied = j;
        i = j;
      }
    }
    const size_t term = line_terminator_length(s, i);
    line_start = term > 0;
    i += term > 0 ? term : 1;
  }
  copy_range(in, copied, s.size(), out);
  return out;
}

// trim_blocks: /([#%-]})\n/g -> "$1" (the newline after a block tag).
PreprocessedSource trim_blocks(const PreprocessedSource& in) {
  const std::string_view s = in.text;
  PreprocessedSource out;
  size_t copied = 0;
  for (size_t i = 0; i + 2 < s.size();) {
    if ((s[i] == '#' || s[i] == '%' || s[i] == '-') && s[i + 1] == '}' && s[i + 2] == '\n') {
      copy_range(in, copied, i + 2, out);
      copied = i + 3;
      i += 3;
    } else {
      ++i;
    }
  }
  copy_range(in, copied, s.size(), out);
  return out;
}

// Matches {%(-?)\s*(?:end)?generation\s*(-?)%} at s[pos]: the end of the tag and its two
// strip flags, or nullopt.
struct GenerationTag {
  size_t end;
  bool lstrip, rstrip;
};
std::optional<GenerationTag> match_generation_tag(std::string_view s, size_t pos) {
  if (s.substr(pos, 2) != "{%") return std::nullopt;
  size_t i = pos + 2;
  GenerationTag tag{0, false, false};
  if (i < s.size() && s[i] == '-') tag.lstrip = true, ++i;
  while (size_t n = js_space_length(s, i)) i += n;
  if (s.substr(i, 3) == "end" && s.substr(i + 3, 10) == "generation") i += 3;
  if (s.substr(i, 10) != "generation") return std::nullopt;
  i += 10;
  while (size_t n = js_space_length(s, i)) i += n;
  if (i < s.size() && s[i] == '-') tag.rstrip = true, ++i;
  if (s.substr(i, 2) != "%}") return std::nullopt;
  tag.end = i + 2;
  return tag;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> (lstrip ? "" : before) +
// (rstrip ? "" : after): the tag goes, the whitespace around it stays unless a `-` says not.
PreprocessedSource remove_generation_tags(const PreprocessedSource& in) {
  const std::string_view s = in.text;
  PreprocessedSource out;
  size_t copied = 0;  // also where the regex resumes: `before` never reaches behind it
  for (size_t i = 0; i < s.size();) {
    const auto tag = match_generation_tag(s, i);
    if (!tag) {
      ++i;
      continue;
    }
    size_t before = i;
    while (before > copied) {
      const size_t n = js_space_length_before(s, before);
      if (n == 0 || before - n < copied) break;
      before -= n;
    }
    size_t after = tag->end;
    while (size_t n = js_space_length(s, after)) after += n;
    copy_range(in, copied, tag->lstrip ? before : i, out);
    if (!tag->rstrip) copy_range(in, tag->end, after, out);
    copied = after;
    i = after;
  }
  copy_range(in, copied, s.size(), out);
  return out;
}

class Lexer {
 public:
  explicit Lexer(PreprocessedSource src) : src_(std::move(src)), s_(src_.text) {}

  std::vector<Token> run();

 private:
  [[noreturn]] void error(const std::string& reason) const {
    fail(Status::invalid_argument, "line ", line_at(pos_), ": ", reason);
  }
  int line_at(size_t p) const {
    if (src_.line.empty()) return 1;
    return src_.line[std::min(p, src_.line.size() - 1)];
  }
  char at(size_t p) const { return p < s_.size() ? s_[p] : '\0'; }
  bool has(size_t p) const { return p < s_.size(); }
  std::optional<TokenType> last_type() const {
    if (tokens_.empty()) return std::nullopt;
    return tokens_.back().type;
  }
  void push(TokenType type, std::string value, size_t start) { tokens_.push_back({type, std::move(value), line_at(start)}); }

  // consumeWhile's rule: a token that runs into the end of the input is an error.
  void advance_in_token() {
    ++pos_;
    if (pos_ >= s_.size()) error("unexpected end of input");
  }
  std::string consume_digits() {
    std::string out;
    while (has(pos_) && at(pos_) >= '0' && at(pos_) <= '9') {
      out += at(pos_);
      advance_in_token();
    }
    return out;
  }
  std::string consume_word() {
    std::string out;
    while (has(pos_) && js_is_word(at(pos_))) {
      out += at(pos_);
      advance_in_token();
    }
    return out;
  }
  void consume_whitespace() {
    while (size_t n = js_space_length(s_, pos_)) {
      pos_ += n;
      if (pos_ >= s_.size()) error("unexpected end of input");
    }
  }
  std::string consume_string(char quote);
  void strip_trailing_whitespace();
  void skip_leading_whitespace() {
    while (size_t n = js_space_length(s_, pos_)) pos_ += n;
  }
  bool lex_comment();
  bool lex_unary();
  bool lex_operator();

  PreprocessedSource src_;
  std::string_view s_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

std::string Lexer::consume_string(char quote) {
  // An unterminated string is reported at its start, where the mistake is.
  const size_t start = pos_ - 1;
  const auto unterminated = [&] { fail(Status::invalid_argument, "line ", line_at(start), ": unterminated string (no closing ", quote, ")"); };
  std::string out;
  while (!has(pos_) || at(pos_) != quote) {
    if (!has(pos_)) unterminated();
    if (at(pos_) == '\\') {
      ++pos_;
      if (!has(pos_)) unterminated();
      const char escaped = at(pos_++);
      if (escaped == 'x' || escaped == 'u') {
        const size_t length = escaped == 'x' ? 2 : 4;
        const std::string_view hex = s_.substr(std::min(pos_, s_.size()), length);
        bool ok = hex.size() == length;
        for (char c : hex) ok = ok && std::isxdigit(static_cast<unsigned char>(c));
        if (!ok) error(str("invalid hexadecimal escape sequence \\", escaped, hex));
        uint32_t unit = static_cast<uint32_t>(std::stoul(std::string(hex), nullptr, 16));
        pos_ += length;
        // String.fromCharCode builds UTF-16: a high surrogate pairs with a following \u low one.
        if (unit >= 0xD800 && unit <= 0xDBFF && s_.substr(pos_, 2) == "\\u") {
          const std::string_view low = s_.substr(pos_ + 2, 4);
          bool low_ok = low.size() == 4;
          for (char c : low) low_ok = low_ok && std::isxdigit(static_cast<unsigned char>(c));
          const uint32_t low_unit = low_ok ? static_cast<uint32_t>(std::stoul(std::string(low), nullptr, 16)) : 0;
          if (low_unit >= 0xDC00 && low_unit <= 0xDFFF) {
            unit = 0x10000 + ((unit - 0xD800) << 10) + (low_unit - 0xDC00);
            pos_ += 6;
          }
        }
        if (unit >= 0xD800 && unit <= 0xDFFF) error(str("unpaired surrogate escape \\u", hex, " (UTF-8 cannot hold it)"));
        utf8_append(out, unit);
        continue;
      }
      switch (escaped) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        default: error(str("unexpected escaped character '", escaped, "'"));
      }
      continue;
    }
    out += at(pos_);
    if (++pos_ >= s_.size()) unterminated();
  }
  return out;
}

void Lexer::strip_trailing_whitespace() {
  if (tokens_.empty() || tokens_.back().type != TokenType::text) return;
  std::string& value = tokens_.back().value;
  value.resize(js_trim_end(value).size());
  if (value.empty()) tokens_.pop_back();
}

bool Lexer::lex_comment() {
  if (!(at(pos_) == '{' && at(pos_ + 1) == '#')) return false;
  const size_t start = pos_;
  pos_ += 2;
  const bool strip_before = at(pos_) == '-';
  if (strip_before) ++pos_;
  std::string comment;
  while (at(pos_) != '#' || at(pos_ + 1) != '}') {
    if (pos_ + 2 >= s_.size()) error("missing end of comment tag #}");
    comment += s_[pos_++];
  }
  const bool strip_after = !comment.empty() && comment.back() == '-';
  if (strip_after) comment.pop_back();
  if (strip_before) strip_trailing_whitespace();
  push(TokenType::comment, std::move(comment), start);
  pos_ += 2;
  if (strip_after) skip_leading_whitespace();
  return true;
}

// A + or - where an operand is expected: a signed number literal or a unary operator.
bool Lexer::lex_unary() {
  const char c = at(pos_);
  if (c != '-' && c != '+') return false;
  const auto last = last_type();
  if (!last || *last == TokenType::text) error(str("unexpected character '", c, "'"));
  switch (*last) {
    case TokenType::identifier: case TokenType::numeric_literal: case TokenType::string_literal:
    case TokenType::close_paren: case TokenType::close_square_bracket:
      return false;  // a binary operator: a - 1, (1) - 1, a[1] - 1
    default: break;
  }
  const size_t start = pos_++;
  std::string num = consume_digits();
  if (!num.empty() && at(pos_) == '.' && at(pos_ + 1) >= '0' && at(pos_ + 1) <= '9') {
    ++pos_;
    num += '.';
    num += consume_digits();
  }
  if (num.empty()) push(TokenType::unary_operator, std::string(1, c), start);
  else push(TokenType::numeric_literal, c + num, start);
  return true;
}

bool Lexer::lex_operator() {
  static const std::pair<std::string_view, TokenType> table[] = {
      {"{%", TokenType::open_statement}, {"%}", TokenType::close_statement},
      {"{{", TokenType::open_expression}, {"}}", TokenType::close_expression},
      {"(", TokenType::open_paren}, {")", TokenType::close_paren},
      {"{", TokenType::open_curly_bracket}, {"}", TokenType::close_curly_bracket},
      {"[", TokenType::open_square_bracket}, {"]", TokenType::close_square_bracket},
      {",", TokenType::comma}, {".", TokenType::dot}, {":", TokenType::colon}, {"|", TokenType::pipe},
      {"<=", TokenType::comparison_binary_operator}, {">=", TokenType::comparison_binary_operator},
      {"==", TokenType::comparison_binary_operator}, {"!=", TokenType::comparison_binary_operator},
      {"<", TokenType::comparison_binary_operator}, {">", TokenType::comparison_binary_operator},
      {"+", TokenType::additive_binary_operator}, {"-", TokenType::additive_binary_operator},
      {"~", TokenType::additive_binary_operator},
      {"**", TokenType::exponentiation_binary_operator},  // before "*"
      {"*", TokenType::multiplicative_binary_operator},
      {"//", TokenType::multiplicative_binary_operator},  // before "/"
      {"/", TokenType::multiplicative_binary_operator}, {"%", TokenType::multiplicative_binary_operator},
      {"=", TokenType::equals},
  };
  for (const auto& [seq, type] : table) {
    if (seq == "}}" && curly_depth_ > 0) continue;  // inside an object literal: two closing braces
    if (s_.substr(pos_, seq.size()) != seq) continue;
    push(type, std::string(seq), pos_);
    if (type == TokenType::open_expression) curly_depth_ = 0;
    else if (type == TokenType::open_curly_bracket) ++curly_depth_;
    else if (type == TokenType::close_curly_bracket) --curly_depth_;
    pos_ += seq.size();
    return true;
  }
  return false;
}

std::vector<Token> Lexer::run() {
  while (pos_ < s_.size()) {
    // Text up to the next {% {{ or {#, after a tag (or at the start).
    const auto last = last_type();
    if (!last || *last == TokenType::close_statement || *last == TokenType::close_expression ||
        *last == TokenType::comment) {
      const size_t start = pos_;
      while (pos_ < s_.size() && !(s_[pos_] == '{' && (at(pos_ + 1) == '%' || at(pos_ + 1) == '{' || at(pos_ + 1) == '#')))
        ++pos_;
      if (pos_ > start) {
        push(TokenType::text, std::string(s_.substr(start, pos_ - start)), start);
        continue;
      }
    }
    if (lex_comment()) continue;
    if (s_.substr(pos_, 3) == "{%-") {
      strip_trailing_whitespace();
      push(TokenType::open_statement, "{%", pos_);
      pos_ += 3;
      continue;
    }
    if (s_.substr(pos_, 3) == "{{-") {
      strip_trailing_whitespace();
      push(TokenType::open_expression, "{{", pos_);
      curly_depth_ = 0;
      pos_ += 3;
      continue;
    }
    consume_whitespace();
    if (s_.substr(pos_, 3) == "-%}") {
      push(TokenType::close_statement, "%}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      continue;
    }
    if (s_.substr(pos_, 3) == "-}}") {
      push(TokenType::close_expression, "}}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      continue;
    }
    if (lex_unary()) continue;
    if (lex_operator()) continue;
    const char c = s_[pos_];
    const size_t start = pos_;
    if (c == '\'' || c == '"') {
      ++pos_;
      std::string value = consume_string(c);
      push(TokenType::string_literal, std::move(value), start);
      ++pos_;  // the closing quote
      continue;
    }
    if (c >= '0' && c <= '9') {
      std::string num = consume_digits();
      if (last_type() != TokenType::dot && at(pos_) == '.' && at(pos_ + 1) >= '0' && at(pos_ + 1) <= '9') {
        ++pos_;
        num += '.';
    num += consume_digits();
      }
      push(TokenType::numeric_literal, std::move(num), start);
      continue;
    }
    if (js_is_word(c)) {
      push(TokenType::identifier, consume_word(), start);
      continue;
    }
    if (static_cast<uint8_t>(c) < 0x20 || static_cast<uint8_t>(c) >= 0x80) {
      size_t len = 0;
      const uint32_t cp = static_cast<uint8_t>(c) < 0x80 ? static_cast<uint8_t>(c) : utf8_decode(s_, pos_, &len);
      char buf[16];
      std::snprintf(buf, sizeof buf, "U+%04X", cp);
      error(str("unexpected character ", buf));
    }
    error(str("unexpected character '", c, "'"));
  }
  return std::move(tokens_);
}

}  // namespace

PreprocessedSource preprocess(std::string_view source) {
  PreprocessedSource src;
  src.text.assign(source);
  src.line.resize(source.size());
  int line = 1;
  for (size_t i = 0; i < source.size(); ++i) {
    src.line[i] = line;
    if (source[i] == '\n') ++line;
  }
  if (!src.text.empty() && src.text.back() == '\n') {  // a single trailing newline is dropped
    src.text.pop_back();
    src.line.pop_back();
  }
  return remove_generation_tags(trim_blocks(lstrip_blocks(src)));
}

std::vector<Token> tokenize(std::string_view source) {
  if (const auto bad = utf8_find_invalid(source))
    fail(Status::invalid_argument, "the template is not valid UTF-8 (", bad->reason, " at byte ", bad->offset, ")");
  return Lexer(preprocess(source)).run();
}

}  // namespace sluice::jinja
