// A request body's JSON as every POST route reads it, OpenAI's and Anthropic's: bounded in
// depth and values on its text before it is parsed (json_bounds.h), parsed with its key order
// kept (a chat template prints tools and arguments as they were sent), and every string
// checked as UTF-8 (nlohmann's parser keeps ill-formed bytes, which an answer could not quote).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

namespace sluice::server {

// Throws ApiError (400, code invalid_json) saying why: the bounds, the parser's reason and
// where (a syntax error, a number beyond a double such as 1e999), or the path of a string
// that is not UTF-8.
nlohmann::ordered_json parse_body_json(std::string_view text);

}  // namespace sluice::server
