// DevicePool, PinnedRing and the owned buffers (cuda_memory.h).
#include "backends/cuda/cuda_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/units.h"

namespace sluice::cuda {

DevicePool::~DevicePool() { release_cached(); }

size_t DevicePool::round_size(size_t bytes) {
  // Powers of two up to 1 MiB (decode's many small activations reuse few classes), then whole
  // MiB (large prefill buffers waste at most 1 MiB each).
  constexpr size_t kMiB = size_t{1} << 20;
  if (bytes <= 512) return 512;
  if (bytes <= kMiB) {
    size_t r = 512;
    while (r < bytes) r <<= 1;
    return r;
  }
  return (bytes + kMiB - 1) / kMiB * kMiB;
}

std::shared_ptr<void> DevicePool::get(size_t bytes) {
  const size_t rounded = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= rounded;
    }
  }
  if (!p) {
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err != cudaSuccess) {  // the cached blocks may be what fills the device: give them back
      (void)cudaGetLastError();
      release_cached();
      err = cudaMalloc(&p, rounded);
    }
    SLUICE_CHECK(err == cudaSuccess, Status::out_of_memory, "cuda: cannot allocate ", bytes, " bytes on device ",
                 device_, ": ", cudaGetErrorString(err));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ += rounded;
  }
  std::shared_ptr<DevicePool> self = shared_from_this();
  return std::shared_ptr<void>(p, [self, rounded](void* q) { self->put(q, rounded); });
}

void DevicePool::put(void* p, size_t rounded) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[rounded].push_back(p);
  in_use_ -= rounded;
  cached_ += rounded;
}

void DevicePool::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) cudaFree(p);
  free_.clear();
  cached_ = 0;
}

size_t DevicePool::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
size_t DevicePool::bytes_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

PinnedRing::PinnedRing() {
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&base_), kSlotBytes * kSlots, cudaHostAllocDefault));
  for (auto& e : events_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

PinnedRing::~PinnedRing() {
  for (int i = 0; i < kSlots; ++i) {
    if (pending_[i]) cudaEventSynchronize(events_[i]);
    cudaEventDestroy(events_[i]);
  }
  cudaFreeHost(base_);
}

bool PinnedRing::copy_async(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes > kSlotBytes) return false;
  const int slot = next_;
  next_ = (next_ + 1) % kSlots;
  // The copy that last read this slot was enqueued kSlots copies ago: normally long done.
  if (pending_[slot]) CUDA_CHECK(cudaEventSynchronize(events_[slot]));
  char* buf = base_ + static_cast<size_t>(slot) * kSlotBytes;
  std::memcpy(buf, src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(dst, buf, bytes, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaEventRecord(events_[slot], stream));
  pending_[slot] = true;
  return true;
}

DeviceBuffer::DeviceBuffer(size_t bytes, const char* what) {
  cudaError_t err = cudaMalloc(&p_, std::max<size_t>(bytes, 1));
  SLUICE_CHECK(err == cudaSuccess, Status::out_of_memory, "cuda: cannot allocate ", byte_size_text(bytes),
               " of device memory for ", what, ": ", cudaGetErrorString(err));
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

MappedHostBuffer::MappedHostBuffer(size_t bytes, const char* what) {
  cudaError_t err = cudaHostAlloc(&p_, std::max<size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped);
  SLUICE_CHECK(err == cudaSuccess, Status::out_of_memory, "cuda: cannot pin ", byte_size_text(bytes),
               " of host memory for ", what, ": ", cudaGetErrorString(err));
  std::memset(p_, 0, std::max<size_t>(bytes, 1));
  CUDA_CHECK(cudaHostGetDevicePointer(&dev_, p_, 0));
}

MappedHostBuffer::~MappedHostBuffer() {
  if (p_) cudaFreeHost(p_);
}

RegisteredHostBuffer::RegisteredHostBuffer(size_t bytes, const char* what)
    : bytes_(std::max<size_t>(io_align_up(bytes), kIoAlign)) {
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  SLUICE_CHECK(p != MAP_FAILED, Status::out_of_memory, "cannot allocate ", byte_size_text(bytes_), " of host memory for ",
               what);
  p_ = p;
  cudaError_t err = cudaHostRegister(p_, bytes_, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err != cudaSuccess) {
    ::munmap(p_, bytes_);
    p_ = nullptr;
    fail(Status::out_of_memory, "cuda: cannot page-lock ", byte_size_text(bytes_), " of host memory for ", what, ": ",
         cudaGetErrorString(err), " (a smaller --host-cache or --expert-cache needs less)");
  }
  CUDA_CHECK(cudaHostGetDevicePointer(&dev_, p_, 0));
}

RegisteredHostBuffer::~RegisteredHostBuffer() {
  if (!p_) return;
  cudaHostUnregister(p_);
  ::munmap(p_, bytes_);
}

}  // namespace sluice::cuda
