// Whole-file reads and atomic writes shared by the format readers and writers, with errors
// that name the path: Error(not_found) for a missing file, Error(io) with the OS's reason
// for everything else.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace sluice {

// Reads a regular file whole. Files larger than `size_max` bytes are refused with
// Error(corrupt) before anything is allocated (`what` names the kind of file in the message).
std::string read_file_bytes(const std::filesystem::path& path, uint64_t size_max, std::string_view what);

// Writes the concatenation of `parts` through an OutputFile (format/output_file.h): a regular
// file by `path.tmp` and a rename, so a reader sees either the old file or the whole new one;
// a device or FIFO in place.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::span<const uint8_t>> parts);

// Reads [offset, offset + size) of fd into buf, whole (EINTR and short reads retried); a
// failed read is Error(io), a file that ends first Error(corrupt), both naming `what` and the
// offset.
void pread_all(int fd, uint8_t* buf, size_t size, uint64_t offset, const std::string& what);

// The OS's text for an errno value (thread-safe, unlike strerror).
std::string errno_text(int err);

}  // namespace sluice
