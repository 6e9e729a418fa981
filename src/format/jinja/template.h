// The public face of the Jinja interpreter: parse a template once, render it many times
// (concurrently too: a parsed template is immutable). It mirrors @huggingface/jinja 0.5.11,
// the Jinja of transformers.js, with transformers' settings (trim_blocks, lstrip_blocks):
// the renders are byte for byte the reference's, and where the reference throws, parse or
// render throws Error(invalid_argument) "line N: reason".
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "format/jinja/value.h"

namespace sluice::jinja {

struct Program;

struct RenderOptions {
  // What strftime_now(format) returns; unset: the local time through js_strftime.
  std::function<std::string(std::string_view format)> strftime_now;
};

// The template's variables, in the order they are declared. A name may appear once and may
// not be one of the globals (true, false, none, True, False, None, range, namespace,
// raise_exception, strftime_now).
using Variables = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  // Throws Error(invalid_argument) "line N: reason" for a syntax error.
  static Template parse(std::string_view source);

  std::string render(const Variables& variables, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

// JSON as the reference receives it from JavaScript: numbers with an integral value are
// integers (1.0 too), and in objects the keys that are array indexes ("0", "17") come first
// in numeric order, the rest in their order (JavaScript's property order). nlohmann::json
// has already sorted its keys; ordered_json keeps the document's order. `what` names the
// variable in the error for a string that is not valid UTF-8.
Value value_from_json(const nlohmann::json& j, std::string_view what);
Value value_from_json(const nlohmann::ordered_json& j, std::string_view what);

}  // namespace sluice::jinja
