// The template source to tokens, as @huggingface/jinja's lexer.ts does it: first its
// preprocessing (the final newline dropped, lstrip_blocks and trim_blocks as transformers
// sets them, the transformers-only {% generation %} tags removed), then the scan, with the
// `-` whitespace controls applied to the neighbouring text. Each token keeps the line of the
// original template it came from, for error messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::jinja {

enum class TokenType : uint8_t {
  text,                            // the text between tags
  numeric_literal,                 // 123, 1.5, -2 (a sign directly before digits, unary context)
  string_literal,                  // 'a' or "a", escapes resolved
  identifier,                      // names and keywords alike (if, in, not, true, ...)
  equals,                          // =
  open_paren, close_paren,         // ( )
  open_statement, close_statement, // {% %}
  open_expression, close_expression,  // {{ }}
  open_square_bracket, close_square_bracket,  // [ ]
  open_curly_bracket, close_curly_bracket,    // { }
  comma, dot, colon, pipe,         // , . : |
  additive_binary_operator,        // + - ~
  multiplicative_binary_operator,  // * / // %
  exponentiation_binary_operator,  // **
  comparison_binary_operator,      // < > <= >= == !=
  unary_operator,                  // + - in unary context (not followed by digits)
  comment,                         // {# ... #}
};

// The reference's name of the token type ("OpenStatement", ...), used in parser messages.
const char* token_type_name(TokenType type);

struct Token {
  TokenType type;
  std::string value;
  int line;  // 1-based line of the original template
};

// The preprocessed text and, for each of its bytes, the original line it came from.
struct PreprocessedSource {
  std::string text;
  std::vector<int> line;
};
PreprocessedSource preprocess(std::string_view source);

// Throws Error(invalid_argument) "line N: reason" for what the reference's lexer rejects
// (an unknown character, an unterminated string or comment, a bad escape).
std::vector<Token> tokenize(std::string_view source);

}  // namespace sluice::jinja
