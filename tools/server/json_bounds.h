// Bounds on a request body's JSON, checked on its text before it is parsed. Nesting depth:
// every later walk of the parsed value (the UTF-8 check, dump(), the chat template's tojson,
// the destructor of older nlohmann versions) recurses once per level, and a worker's stack
// holds some ten thousand levels. Values: what parsing allocates (some 50-100 bytes each), so
// a body's parsed size is bounded by the count, not by how the bytes are spent.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sluice::server {

struct JsonBounds {
  size_t max_depth = 128;       // arrays and objects inside each other
  size_t max_values = 1 << 18;  // scalars, arrays and objects together (262,144)
};

// "" when the text keeps within the bounds (whether it is valid JSON is the parser's to say);
// otherwise why not, in a client's words. One pass over the bytes, no allocation.
std::string json_bounds_error(std::string_view text, const JsonBounds& bounds);

}  // namespace sluice::server
