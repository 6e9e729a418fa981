// parse_body_json (request_body.h).
#include "request_body.h"

#include <string>

#include "core/error.h"
#include "format/utf8.h"
#include "json_bounds.h"
#include "openai_api.h"

namespace sluice::server {

using ojson = nlohmann::ordered_json;

namespace {

[[noreturn]] void invalid_json(std::string message) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.code = "invalid_json";
  throw e;
}

// The JSON path of the first string (key or value) that is not valid UTF-8, or empty.
// Recursive: the depth was bounded before the text was parsed.
std::string invalid_utf8_path(const ojson& j, const std::string& at) {
  if (j.is_string()) return utf8_find_invalid(j.get_ref<const std::string&>()) ? at : std::string();
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i)
      if (std::string p = invalid_utf8_path(j[i], str(at, "[", i, "]")); !p.empty()) return p;
  }
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (utf8_find_invalid(it.key())) return at.empty() ? "a key" : at + " (a key)";
      if (std::string p = invalid_utf8_path(it.value(), at.empty() ? it.key() : at + "." + it.key()); !p.empty())
        return p;
    }
  }
  return {};
}

}  // namespace

ojson parse_body_json(std::string_view text) {
  // Depth and size first: the parsed value is walked recursively (below, by dump() and by the
  // template), and parsing allocates per value.
  if (const std::string why = json_bounds_error(text, JsonBounds{}); !why.empty()) invalid_json(why);
  ojson body;
  try {
    body = ojson::parse(text);
  } catch (const ojson::exception& e) {
    // nlohmann's message starts with its error id; the client needs the reason and where.
    const std::string what = e.what();
    const size_t at = what.find("] ");
    invalid_json("the body is not valid JSON: " + (at == std::string::npos ? what : what.substr(at + 2)));
  }
  if (const std::string bad = invalid_utf8_path(body, ""); !bad.empty())
    invalid_json("the body is not valid JSON: '" + bad + "' holds bytes that are not UTF-8");
  return body;
}

}  // namespace sluice::server
