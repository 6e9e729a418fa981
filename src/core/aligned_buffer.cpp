// AlignedBuffer (aligned_buffer.h): anonymous mappings, which the kernel hands out zeroed and
// backs with memory only where touched.
#include "core/aligned_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace sluice {

void AlignedBuffer::Free::operator()(void* p) const { ::munmap(p, bytes); }

AlignedBuffer::AlignedBuffer(uint64_t bytes) {
  size_ = io_align_up(std::max<uint64_t>(bytes, 1));
  // Page-aligned (4096 divides the page size) and zero: a tier of which a run reads a few
  // records costs those records' pages, not its whole size in resident memory.
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  SLUICE_CHECK(p != MAP_FAILED, Status::out_of_memory, "cannot allocate ", size_, " bytes of aligned IO memory: ",
               std::strerror(errno));
  ptr_ = std::unique_ptr<void, Free>(p, Free{size_});
}

}  // namespace sluice
