// AlignedBuffer: zero-filled host memory aligned to the 4096-byte block of direct IO, so
// that O_DIRECT reads and writes can use it (expert slots of the CPU streamer, pack writers,
// PLE row caches). An anonymous mapping: memory is taken as pages are first written, so a
// large tier costs only what it holds.
#pragma once

#include <cstdint>
#include <memory>

namespace sluice {

constexpr uint64_t kIoAlign = 4096;  // O_DIRECT alignment of offsets, lengths and buffers

inline uint64_t io_align_up(uint64_t n) { return (n + kIoAlign - 1) / kIoAlign * kIoAlign; }

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(uint64_t bytes);  // rounded up to kIoAlign; zero-filled
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_.get()); }
  uint64_t size() const { return size_; }

 private:
  struct Free {
    uint64_t bytes;  // of the mapping
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
  uint64_t size_ = 0;
};

}  // namespace sluice
