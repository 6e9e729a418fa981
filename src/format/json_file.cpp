// JSON files: whole-file read, then nlohmann's parser, whose errors are re-worded to point at
// a line and column of the file.
#include "format/json_file.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "format/file_io.h"

namespace sluice {

std::string describe_json_error(const nlohmann::json::parse_error& e, std::string_view text) {
  // e.byte is the 1-based position of the last character read (the offending one), or one
  // past the end when the text ended early.
  size_t pos = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  size_t column = pos - line_start + 1;
  // nlohmann's text is "[json.exception.parse_error.101] parse error at line L, column C:
  // reason"; keep the reason only. It quotes the bytes last read verbatim, so escape
  // everything outside printable ASCII: the message may end up inside a JSON response.
  std::string what = e.what();
  size_t colon = what.find(": ", what.find("column"));
  if (colon != std::string::npos) what = what.substr(colon + 2);
  std::string reason;
  for (char ch : what) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      reason += ch;
    } else {
      static const char hex[] = "0123456789abcdef";
      reason += "\\x";
      reason += hex[c >> 4];
      reason += hex[c & 15];
    }
  }
  return str("line ", line, ", column ", column, ": ", reason);
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::string text = read_file_bytes(path, json_file_max, "a JSON file");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(Status::corrupt, path.string(), ": invalid JSON at ", describe_json_error(e, text));
  } catch (const nlohmann::json::exception& e) {
    fail(Status::corrupt, path.string(), ": invalid JSON: ", e.what());
  }
}

}  // namespace sluice
