// json_bounds_error (json_bounds.h): a scan of the JSON text that tracks strings, nesting and
// the values begun.
#include "json_bounds.h"

namespace sluice::server {

std::string json_bounds_error(std::string_view text, const JsonBounds& bounds) {
  size_t depth = 0, values = 0;
  bool in_string = false, escaped = false, in_scalar = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    const bool scalar_char = c != '"' && c != '[' && c != ']' && c != '{' && c != '}' && c != ',' && c != ':' &&
                             c != ' ' && c != '\t' && c != '\n' && c != '\r';
    // A value begins at a quote, a bracket or the first character of a number or literal.
    const bool begins = c == '"' || c == '[' || c == '{' || (scalar_char && !in_scalar);
    in_scalar = scalar_char;
    if (begins && ++values > bounds.max_values)
      return "the body holds more than " + std::to_string(bounds.max_values) + " JSON values";
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > bounds.max_depth)
        return "the body nests arrays and objects deeper than " + std::to_string(bounds.max_depth) + " levels";
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return {};
}

}  // namespace sluice::server
