// The handshake's signals: host-mapped memory, the driver's stream memory operations, and the
// host's loads and stores.
#include "experts/cuda/handshake.h"

#include <cuda.h>
#include <immintrin.h>

#include <atomic>
#include <thread>

#include "backends/cuda/cuda_check.h"
#include "core/error.h"

namespace sluice::cuda {
namespace {

using StreamValueFn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

// cuStreamWriteValue64 / cuStreamWaitValue64 of the driver, through the runtime: a binary
// that never uses them needs no libcuda at load time.
void* driver_entry_point(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &q);
  SLUICE_CHECK(err == cudaSuccess && q == cudaDriverEntryPointSuccess && fn, Status::unsupported,
               "the CUDA driver does not provide ", symbol, " (stream memory operations, needed by the expert ",
               "streamer's handshake): ", err == cudaSuccess ? "symbol not found" : cudaGetErrorString(err));
  return fn;
}

void check_driver(CUresult r, const char* what, int64_t layer, Signal sig) {
  SLUICE_CHECK(r == CUDA_SUCCESS, Status::internal, "CUDA driver error ", static_cast<int>(r), " in ", what,
               " (MoE layer ", layer, ", signal ", signal_name(sig), ")");
}

}  // namespace

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
  write_fn_ = driver_entry_point("cuStreamWriteValue64");
  wait_fn_ = driver_entry_point("cuStreamWaitValue64");
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

void Handshake::device_write(cudaStream_t s, int64_t layer, Signal sig, uint64_t value) const {
  const CUdeviceptr addr = dev_ + static_cast<uint64_t>(layer * kSignalCount + static_cast<int>(sig)) * sizeof(uint64_t);
  check_driver(reinterpret_cast<StreamValueFn>(write_fn_)(reinterpret_cast<CUstream>(s), addr, value,
                                                           CU_STREAM_WRITE_VALUE_DEFAULT),
               "cuStreamWriteValue64", layer, sig);
}

void Handshake::device_wait(cudaStream_t s, int64_t layer, Signal sig, uint64_t value) const {
  const CUdeviceptr addr = dev_ + static_cast<uint64_t>(layer * kSignalCount + static_cast<int>(sig)) * sizeof(uint64_t);
  check_driver(reinterpret_cast<StreamValueFn>(wait_fn_)(reinterpret_cast<CUstream>(s), addr, value,
                                                          CU_STREAM_WAIT_VALUE_GEQ),
               "cuStreamWaitValue64", layer, sig);
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
