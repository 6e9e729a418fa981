// JSON schemas to grammars (engine/grammar.h), for structured output: the text a grammar
// accepts is JSON that validates against the schema. The subset: type (one or a list),
// properties / required / additionalProperties (properties are written in the schema's order;
// extra properties are never written, so additionalProperties true or a schema is accepted
// and an object without declared properties takes any keys whose values follow
// additionalProperties), enum / const, items / minItems / maxItems, anyOf / oneOf (oneOf's
// branches are alternatives: the output validates when the branches do not overlap), allOf
// and siblings of anyOf that do not clash (merged), $ref into the same document ($defs,
// definitions, "#", any JSON pointer; recursion allowed), strings with minLength / maxLength
// or a pattern (an ECMAScript regex subset: literals, classes, ., \d \w \s, groups,
// alternation, quantifiers), integers with minimum / maximum / exclusiveMinimum /
// exclusiveMaximum, numbers with integral minimum / maximum; annotations (title,
// description, default, examples, ...) are ignored. Any other keyword is refused:
// Error(invalid_argument) whose message names it ("json_schema: 'uniqueItems' is not
// supported (at #/properties/tags)").
//
// Whitespace between tokens is one space or a newline and an indent (at most 12 bytes), numbers have at most 16
// digits in each part, so that a sampled reply cannot run on forever inside one token.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/grammar.h"

namespace sluice {

class JsonGrammar {
 public:
  // compact: whitespace between tokens is at most one space (tool-call arguments, where
  // models write compact JSON and a newline's indent would only cost tokens).
  explicit JsonGrammar(GrammarBuilder& builder, bool compact = false);

  GExpr ws();            // whitespace: nothing, one space, or a newline and up to 11 spaces or tabs
  GExpr any_value();     // any JSON value
  GExpr any_object();    // any JSON object
  GExpr string_char();   // one character inside a JSON string (escapes included)
  GExpr any_string();    // any JSON string, quotes included
  // The values the schema accepts. Each call is its own document for $ref ("#" is this
  // schema). Throws Error(invalid_argument) naming an unsupported keyword and where it is.
  GExpr schema(const nlohmann::json& schema);

 private:
  struct Doc;
  GExpr node(const nlohmann::json& s, const std::string& at, int depth);
  GExpr typed(const nlohmann::json& s, const std::string& type, const std::string& at, int depth);
  GExpr object(const nlohmann::json& s, const std::string& at, int depth);
  GExpr array(const nlohmann::json& s, const std::string& at, int depth);
  GExpr string(const nlohmann::json& s, const std::string& at);
  GExpr integer(const nlohmann::json& s, const std::string& at);
  GExpr number(const nlohmann::json& s, const std::string& at);
  GExpr ref(const std::string& pointer, const std::string& at, int depth);

  GrammarBuilder& b_;
  bool compact_ = false;
  int value_ = -1, object_ = -1, array_ = -1, string_ = -1, char_ = -1, ws_ = -1;
  int doc_counter_ = 0;
  const nlohmann::json* doc_ = nullptr;  // the document of the schema() call in progress
  std::map<std::string, int> refs_;      // "doc#pointer" -> rule
};

// Whole grammars: a value of the schema, or any JSON object (response_format json_object).
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::json& schema);
std::shared_ptr<const Grammar> json_object_grammar();

// A regex (the pattern subset above) as the content of a JSON string: each character the
// regex matches, written as JSON writes it (quotes and backslashes escaped, control
// characters as \uXXXX). Throws Error(invalid_argument) for what it does not support.
GExpr json_string_pattern(const std::string& pattern);

}  // namespace sluice
