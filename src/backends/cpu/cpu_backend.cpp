// CpuBackend memory: 64-byte aligned host allocations owned through Tensor::storage;
// transfers are memcpy, upload hands the host tensor back as is.
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace sluice {

namespace {

constexpr size_t kAlign = 64;  // a cache line: no two tensors share one, and AVX loads never split one at a row start

}  // namespace

Tensor CpuBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t(dtype, shape, nullptr);
  for (int i = 0; i < t.ndim; ++i)
    SLUICE_CHECK(t.shape[i] >= 0, Status::internal, "cpu alloc: negative dimension in ", t.shape_str());
  // aligned_alloc wants a size that is a multiple of the alignment; a zero-element tensor
  // still gets a (non-null) block so that empty() keeps meaning "no tensor".
  size_t bytes = (std::max<size_t>(t.nbytes(), 1) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, bytes);
  SLUICE_CHECK(p != nullptr, Status::out_of_memory, "cpu alloc: ", bytes, " bytes for ",
               dtype_name(dtype), " ", t.shape_str());
  t.data = p;
  t.storage = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

// MemAvailable of /proc/meminfo (kB), lowered to what a cgroup v2 memory limit leaves.
std::optional<uint64_t> CpuBackend::memory_available() const {
  std::optional<uint64_t> avail;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  while (meminfo >> key >> kb) {
    if (key == "MemAvailable:") avail = kb * 1024;
    meminfo.ignore(64, '\n');  // " kB"
  }
  uint64_t limit = 0, used = 0;
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  if (max_file >> limit && current_file >> used) {  // "max" (no limit) fails the read
    const uint64_t left = limit > used ? limit - used : 0;
    avail = avail ? std::min(*avail, left) : left;
  }
  return avail;
}

Tensor CpuBackend::upload(const Tensor& host) { return host; }

void CpuBackend::to_host(const Tensor& src, void* dst) {
  if (src.nbytes()) std::memcpy(dst, src.data, src.nbytes());
}

void CpuBackend::from_host(const Tensor& dst, const void* src) {
  if (dst.nbytes()) std::memcpy(dst.data, src, dst.nbytes());
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  const bool to_bf16 = src.dtype == DType::f32 && dst.dtype == DType::bf16;  // a bf16 KV cache's rows
  SLUICE_CHECK((src.dtype == dst.dtype || to_bf16) && src.numel() == dst.numel(), Status::internal,
               "cpu copy: ", dtype_name(src.dtype), " ", src.shape_str(), " to ",
               dtype_name(dst.dtype), " ", dst.shape_str(), " (same dtype, or f32 to bf16)");
  if (to_bf16) return dtype_convert_row(src.data, src.dtype, dst.data, dst.dtype, src.numel());  // nearest even
  if (src.nbytes() && src.data != dst.data) std::memmove(dst.data, src.data, src.nbytes());
}

void CpuBackend::fill(const Tensor& dst, float value) {
  SLUICE_CHECK(dst.dtype == DType::f32, Status::internal, "cpu fill: dst is ",
               dtype_name(dst.dtype), " ", dst.shape_str(), ", want f32");
  float* p = dst.ptr<float>();
  int64_t n = dst.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace sluice
