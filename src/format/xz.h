// .xz files (liblzma): the committed routing traces (traces/*.jsonl.xz) are read as they are.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace sluice {

// Whether path names an .xz file (by its extension).
bool is_xz_path(const std::filesystem::path& path);

// The decompressed contents of an .xz file, at most size_max bytes (more is Error(corrupt),
// before it is held): Error(not_found) / Error(io) as read_file_bytes, Error(corrupt) naming
// the path for data that is not a valid .xz stream (truncated, damaged, another format).
std::string read_xz_file(const std::filesystem::path& path, uint64_t size_max);

}  // namespace sluice
