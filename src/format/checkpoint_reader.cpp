// CheckpointReader: pread of a checkpoint's tensors, FP8 weights dequantized row by row.
#include "format/checkpoint_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "format/file_io.h"

namespace sluice {

CheckpointReader::~CheckpointReader() {
  for (auto& [path, fd] : fds_) ::close(fd);
}

int CheckpointReader::fd(const std::string& tensor) {
  const std::filesystem::path& p = ck_.file_of(tensor).path();
  std::lock_guard<std::mutex> lock(m_);
  if (auto it = fds_.find(p); it != fds_.end()) return it->second;
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(Status::io, p.string(), ": cannot open: ", errno_text(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  fds_[p] = fd;
  return fd;
}

uint64_t CheckpointReader::offset(const std::string& tensor) const {
  return ck_.file_of(tensor).data_offset() + ck_.entry(tensor).begin;
}

std::string CheckpointReader::where(const std::string& tensor) const {
  return str(ck_.file_of(tensor).path().string(), ": tensor ", tensor);
}

void CheckpointReader::read(const std::string& tensor, uint64_t at, void* dst, size_t n) {
  SLUICE_ASSERT(at + n <= ck_.entry(tensor).end - ck_.entry(tensor).begin);
  pread_all(fd(tensor), static_cast<uint8_t*>(dst), n, offset(tensor) + at, where(tensor));
}

uint64_t CheckpointReader::read_rows_f32(const std::string& tensor, int64_t r0, int64_t n, float* dst,
                                         std::vector<uint8_t>& scratch) {
  const SafetensorsEntry& e = ck_.entry(tensor);
  const DType stored = e.dtype;
  SLUICE_CHECK(dtype_is_float(stored) || dtype_is_fp8(stored), Status::internal, where(tensor), " is ",
               dtype_name(stored), ", not a float or FP8 tensor");
  const int64_t rows = e.shape.empty() ? 1 : e.shape[0];
  int64_t cols = 1;
  for (size_t i = 1; i < e.shape.size(); ++i) cols *= e.shape[i];
  SLUICE_ASSERT(r0 >= 0 && n >= 0 && r0 + n <= rows);
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(stored);
  scratch.resize(static_cast<size_t>(n) * row_bytes);
  read(tensor, static_cast<uint64_t>(r0) * row_bytes, scratch.data(), scratch.size());
  const Fp8Weight* w = ck_.fp8(tensor);
  if (!w) {
    dtype_row_to_f32(scratch.data(), stored, n * cols, dst);
    return scratch.size();
  }
  if (n == 0) return 0;
  // The scale rows blocks [r0 / br, (r0 + n - 1) / br] use, converted to f32.
  const SafetensorsEntry& se = ck_.entry(w->scale);
  const int64_t br = w->config.block_rows ? w->config.block_rows : rows;
  const int64_t scale_cols = fp8_scale_cols(w->config, cols);
  const int64_t b0 = r0 / br, nb = (r0 + n - 1) / br - b0 + 1;
  const size_t scale_bytes = static_cast<size_t>(nb * scale_cols) * dtype_size(se.dtype);
  std::vector<uint8_t> raw(scale_bytes);
  read(w->scale, static_cast<uint64_t>(b0 * scale_cols) * dtype_size(se.dtype), raw.data(), raw.size());
  std::vector<float> scales(static_cast<size_t>(nb * scale_cols));
  dtype_row_to_f32(raw.data(), se.dtype, nb * scale_cols, scales.data());
  fp8_dequantize_rows(stored, scratch.data(), r0, n, rows, cols, scales.data(), w->config, dst, where(tensor));
  return scratch.size() + scale_bytes;
}

}  // namespace sluice
