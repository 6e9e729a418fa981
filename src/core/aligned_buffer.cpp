// AlignedBuffer (aligned_buffer.h).
#include "core/aligned_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace sluice {

void AlignedBuffer::Free::operator()(void* p) const { std::free(p); }

AlignedBuffer::AlignedBuffer(uint64_t bytes) {
  size_ = io_align_up(std::max<uint64_t>(bytes, 1));
  void* p = std::aligned_alloc(kIoAlign, size_);
  SLUICE_CHECK(p != nullptr, Status::out_of_memory, "cannot allocate ", size_, " bytes of aligned IO memory");
  std::memset(p, 0, size_);
  ptr_.reset(p);
}

}  // namespace sluice
