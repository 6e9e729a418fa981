// NumPy .npy files (format 1.0 written; 1.0, 2.0 and 3.0 read) for little-endian, C-order
// float arrays: reference activations and logits that the parity tests compare against.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

namespace sluice {

struct NpyArray {
  std::vector<int64_t> shape;  // outermost first; [] is a scalar
  std::vector<float> data;     // product(shape) elements, row-major
};

// Bound on the rank read (NumPy itself allows at most 64).
inline constexpr size_t npy_ndim_max = 64;

// Writes `data` (product(shape) floats, row-major) as '<f4', format 1.0. Throws
// Error(invalid_argument) for a negative dimension and Error(io) when the write fails.
void write_npy(const std::filesystem::path& path, const float* data, std::span<const int64_t> shape);

// Reads '<f4' exactly, and '<f2' / '<f8' converted to float (f8 values beyond the float
// range become infinities). Throws Error(not_found) for a missing file, Error(corrupt) for
// bad magic, a malformed header or a data size that does not match the shape, and
// Error(unsupported) for big-endian data, Fortran order or another dtype; messages name the file.
NpyArray read_npy(const std::filesystem::path& path);

// The parser behind read_npy, over a whole file's bytes (also the fuzz target's entry).
NpyArray parse_npy(std::span<const uint8_t> file, std::string_view file_name);

}  // namespace sluice
