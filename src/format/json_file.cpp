// JSON files: whole-file read, then nlohmann's parser, whose errors are re-worded to point at
// a line and column of the file.
#include "format/json_file.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "format/file_io.h"

namespace sluice {

namespace {

// Drops nlohmann's "[json.exception.parse_error.101] " tag and escapes every byte outside
// printable ASCII: nlohmann quotes the bytes it last read verbatim, and the message may end
// up inside a JSON response, which must be valid UTF-8.
std::string clean_reason(std::string_view what) {
  if (what.substr(0, 16) == "[json.exception." && what.find("] ") != std::string_view::npos) what.remove_prefix(what.find("] ") + 2);
  std::string out;
  for (char ch : what) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace

std::string describe_json_error(const nlohmann::json::exception& e, std::string_view text) {
  const auto* parse_error = dynamic_cast<const nlohmann::json::parse_error*>(&e);
  if (!parse_error) return clean_reason(e.what());  // e.g. out_of_range.406: number overflow
  // byte is the 1-based position of the last character read (the offending one), or one past
  // the end when the text ended early.
  size_t pos = std::min<size_t>(parse_error->byte > 0 ? parse_error->byte - 1 : 0, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  size_t column = pos - line_start + 1;
  // After the tag comes "parse error at line L, column C: reason"; keep the reason only.
  std::string_view what = e.what();
  size_t colon = what.find(": ", what.find("column"));
  if (colon != std::string_view::npos) what.remove_prefix(colon + 2);
  return str("line ", line, ", column ", column, ": ", clean_reason(what));
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::string text = read_file_bytes(path, json_file_max, "a JSON file");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(Status::corrupt, path.string(), ": invalid JSON: ", describe_json_error(e, text));
  }
}

}  // namespace sluice
