// safetensors: the header parser (pure, hostile-input code), a read-only memory-mapped file
// that hands out host Tensor views, and a writer for tests and tools.
//
// File layout: u64 little-endian header length n, n bytes of JSON header, then the data
// section. Header: {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}}, offsets in bytes relative to the data section.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/dtype.h"

namespace sluice {

// Bound on the header length field, as the reference implementation sets it; a larger value
// is treated as corrupt rather than read.
inline constexpr uint64_t safetensors_header_max = 100'000'000;
// Bound on the rank of a tensor in a header (Tensor itself holds at most 4 dimensions).
inline constexpr size_t safetensors_ndim_max = 8;

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // outermost first; [] is a scalar (one element)
  uint64_t begin, end;         // byte offsets relative to the data section, begin <= end
};

// Parses and fully validates the header of a whole safetensors file held in `file`.
// Returns the tensors in file order (sorted by begin). Throws Error(corrupt) for malformed
// input and Error(unsupported) for a dtype sluice does not load (F64, BOOL, F8_E8M0, ...); the
// message names `file_name` and, where one is involved, the tensor. Accepted dtypes: F32,
// BF16, F16, I32, I64, U8, I8, and F8_E4M3 / F8_E5M2 (FP8 weights, which Checkpoint pairs
// with their block scales and hands out dequantized). Tensors may leave gaps between them but may not overlap.
// When `metadata` is given it receives the "__metadata__" object.
std::vector<SafetensorsEntry> parse_safetensors_header(std::span<const uint8_t> file,
                                                       std::string_view file_name,
                                                       std::map<std::string, std::string>* metadata = nullptr);

// A safetensors file mapped read-only. Tensors returned by tensor() point into the mapping
// (which they keep alive) and must not be written to. The file must not be truncated while
// mapped (the process would get SIGBUS), as with any mmap reader.
class SafetensorsFile {
 public:
  // Missing file: Error(not_found) naming the path; other open/stat/mmap failures:
  // Error(io) with strerror; a malformed file: the parse errors above.
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsEntry* find(const std::string& name) const;
  // Absolute file offset of the data section (8 + header length): entry.begin + this is where
  // a tensor's bytes start in the file, for readers that bypass the mapping.
  uint64_t data_offset() const { return data_offset_; }

  // A host Tensor over the tensor's bytes. A scalar (shape []) becomes shape [1]. Throws
  // Error(not_found) for an unknown name and Error(unsupported) for more than 4 dimensions.
  // Bytes that are not aligned to the element size (only a hand-made file does that: the
  // reference writer keeps everything aligned) are copied to an aligned buffer.
  Tensor tensor(const std::string& name) const;
  // The tensor's raw bytes inside the mapping.
  std::span<const uint8_t> bytes(const SafetensorsEntry& entry) const;

  struct Mapping;  // the mmap region; defined in safetensors.cpp

 private:
  SafetensorsFile() = default;

  std::filesystem::path path_;
  std::shared_ptr<Mapping> mapping_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;          // file order
  std::map<std::string, size_t> index_;            // name -> position in entries_
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (host memory, 1 to 4 dimensions) as a safetensors file. Tensors are laid
// out contiguously, larger element sizes first (stable otherwise), so every tensor is
// aligned to its element size; the header is padded with spaces to a multiple of 8 bytes as
// the reference implementation does. Writes to a temporary name and renames, so a reader
// never sees half a file. Throws Error(invalid_argument) for a bad tensor or a duplicate name
// and Error(io) when the write fails.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype name of a DType ("F32", "BF16", ...).
std::string_view safetensors_dtype_name(DType t);

}  // namespace sluice
