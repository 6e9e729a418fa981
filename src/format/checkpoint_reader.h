// CheckpointReader: reads a Checkpoint's tensors with pread, a piece at a time, never through
// its mapping (whose pages would count as the process's resident memory): how the converter
// streams a checkpoint of any size through bounded memory. FP8 weights come out as f32,
// dequantized with their block scales (format/fp8.h), the same values Checkpoint::get gives.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "format/checkpoint.h"

namespace sluice {

class CheckpointReader {
 public:
  explicit CheckpointReader(const Checkpoint& ck) : ck_(ck) {}
  ~CheckpointReader();  // closes the files
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const Checkpoint& checkpoint() const { return ck_; }
  // The open file holding `tensor` (opened on first use, read sequentially; any thread).
  int fd(const std::string& tensor);
  // The file offset of the tensor's first stored byte.
  uint64_t offset(const std::string& tensor) const;
  // "<file>: tensor <name>", for messages.
  std::string where(const std::string& tensor) const;
  // `n` stored bytes of the tensor from byte `at` of its data on.
  void read(const std::string& tensor, uint64_t at, void* dst, size_t n);
  // Rows [r0, r0 + n) of a float or FP8 tensor (rows: its outermost dimension; a row: the
  // product of the others) as f32 in dst: float values converted exactly, FP8 ones
  // dequantized. `scratch` keeps the stored bytes between calls (one per thread). Returns
  // the stored bytes read (scales included).
  uint64_t read_rows_f32(const std::string& tensor, int64_t r0, int64_t n, float* dst, std::vector<uint8_t>& scratch);

 private:
  const Checkpoint& ck_;
  std::mutex m_;
  std::map<std::filesystem::path, int> fds_;
};

}  // namespace sluice
