// Device memory and host staging for CudaBackend, so that a decode step never waits on the
// host:
//   - DevicePool: a caching allocator. Freed blocks go to a free list by rounded size and are
//     handed out again without cudaMalloc / cudaFree (cudaFree synchronizes the device). Reuse
//     is safe because every user of a pooled block works on the backend's one stream: work
//     enqueued after a block's release runs after the work that read it.
//   - PinnedRing: host-to-device copies of small host arrays (token ids, rope tables, routing
//     weights) through a ring of pinned slots, so the copy is asynchronous and the caller may
//     reuse its buffer at once. A slot is rewritten only after the copy that last read it has
//     completed (an event per slot).
//   - DeviceBuffer, MappedHostBuffer, RegisteredHostBuffer: owned allocations for the CUDA
//     streamer's slots, handshake tables and page-locked read targets.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice::cuda {

class DevicePool : public std::enable_shared_from_this<DevicePool> {
 public:
  explicit DevicePool(int device) : device_(device) {}
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes` device bytes; freed into the pool when the last owner goes.
  std::shared_ptr<void> get(size_t bytes);
  // Frees every cached block (cudaFree; synchronizes the device).
  void release_cached();

  size_t bytes_in_use() const;
  size_t bytes_cached() const;

 private:
  void put(void* p, size_t rounded);
  static size_t round_size(size_t bytes);

  int device_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // rounded size -> blocks
  size_t in_use_ = 0, cached_ = 0;
};

class PinnedRing {
 public:
  static constexpr size_t kSlotBytes = size_t{1} << 20;  // rope tables of a 2048-token chunk fit
  static constexpr int kSlots = 16;

  PinnedRing();
  ~PinnedRing();
  PinnedRing(const PinnedRing&) = delete;
  PinnedRing& operator=(const PinnedRing&) = delete;

  // Enqueues a copy of `bytes` host bytes to device `dst` on `stream` through the next slot and
  // returns true; false (nothing done) when bytes exceed a slot.
  bool copy_async(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  char* base_ = nullptr;
  cudaEvent_t events_[kSlots] = {};
  bool pending_[kSlots] = {};
  int next_ = 0;
};

// cudaMalloc'ed device memory, freed when the owner goes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Throws out_of_memory naming `what` when the device has not enough free memory.
  DeviceBuffer(size_t bytes, const char* what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  template <typename T = uint8_t>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

// Host memory the device reads: cudaHostAlloc'ed (zero-filled) and mapped into the device's
// address space. For small tables the host publishes (the streamer's handshake): direct reads
// cannot land in it (its pages belong to the driver's device file; O_DIRECT answers EFAULT).
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  MappedHostBuffer(size_t bytes, const char* what);
  ~MappedHostBuffer();
  MappedHostBuffer(MappedHostBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), dev_(o.dev_) {}
  MappedHostBuffer& operator=(MappedHostBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(dev_, o.dev_);
    return *this;
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }
  // The device's address of host address `h` inside this buffer.
  template <typename T>
  T* dev(T* h) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(dev_) + (reinterpret_cast<uint8_t*>(h) - data()));
  }

 private:
  void* p_ = nullptr;
  void* dev_ = nullptr;
};

// Page-aligned anonymous host memory (zero-filled by mmap), page-locked and mapped for the
// device (cudaHostRegister): direct reads land in it, and a kernel reads it over PCIe.
class RegisteredHostBuffer {
 public:
  RegisteredHostBuffer() = default;
  // bytes are rounded up to whole pages. Throws out_of_memory naming `what`.
  RegisteredHostBuffer(size_t bytes, const char* what);
  ~RegisteredHostBuffer();
  RegisteredHostBuffer(RegisteredHostBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), dev_(o.dev_), bytes_(o.bytes_) {}
  RegisteredHostBuffer& operator=(RegisteredHostBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(dev_, o.dev_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }
  const void* dev(const uint8_t* h) const { return static_cast<uint8_t*>(dev_) + (h - data()); }
  void leak() { p_ = nullptr; }  // reads may still write into it: never unmap

 private:
  void* p_ = nullptr;
  void* dev_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace sluice::cuda
