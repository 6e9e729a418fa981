// The handshake's signals: host-mapped memory and the host's loads and stores.
#include "experts/cuda/handshake.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "backends/cuda/cuda_check.h"
#include "core/error.h"

namespace sluice::cuda {

const char* signal_name(Signal s) {
  switch (s) {
    case Signal::router_ready: return "router_ready";
    case Signal::resident_ready: return "resident_ready";
    case Signal::resident_done: return "resident_done";
    case Signal::misses_ready: return "misses_ready";
    case Signal::hits_taken: return "hits_taken";
  }
  return "?";
}

Handshake::Handshake(int64_t n_layers) : n_layers_(n_layers) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n_layers, 1) * kSignalCount) * sizeof(uint64_t);
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  host_ = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) host_[i] = 0;
  void* d = nullptr;
  CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
  dev_ = reinterpret_cast<uint64_t>(d);
}

Handshake::~Handshake() {
  if (host_) cudaFreeHost(host_);
}

uint64_t Handshake::load(int64_t layer, Signal sig) const {
  return std::atomic_ref<uint64_t>(*at(layer, sig)).load(std::memory_order_acquire);
}

void Handshake::store(int64_t layer, Signal sig, uint64_t value) const {
  // Everything the host wrote before (the tables) is visible before the signal.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint64_t>(*at(layer, sig)).store(value, std::memory_order_seq_cst);
}

void host_idle(HostWait mode) {
  if (mode == HostWait::spin) {
    for (int i = 0; i < 16; ++i) _mm_pause();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace sluice::cuda
