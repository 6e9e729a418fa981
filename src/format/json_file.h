// read_json_file: loads a JSON file (config.json, tokenizer.json, an index) with errors that
// name the file and, for syntax errors, the line and column.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <nlohmann/json.hpp>

namespace sluice {

// Largest JSON file read (tokenizer.json files run to tens of MB; 1 GiB is far beyond any).
inline constexpr uint64_t json_file_max = uint64_t{1} << 30;

// Throws Error(not_found) for a missing file, Error(io) when it cannot be read and
// Error(corrupt) "FILE: invalid JSON: line L, column C: reason" for a syntax error.
nlohmann::json read_json_file(const std::filesystem::path& path);

// "line L, column C: reason" for a parse error in `text` (1-based; only the reason for other
// nlohmann errors, such as a number overflow), with bytes outside printable ASCII escaped as
// \xNN so the message is safe to print or embed in JSON.
std::string describe_json_error(const nlohmann::json::exception& e, std::string_view text);

}  // namespace sluice
