// DevicePool and PinnedRing (cuda_memory.h).
#include "backends/cuda/cuda_memory.h"

#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "core/error.h"

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

}  // namespace sluice::cuda
