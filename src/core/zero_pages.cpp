// zero_pages: an anonymous read-only mapping (MAP_NORESERVE).
#include "core/zero_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace sluice {

std::shared_ptr<void> zero_pages(size_t bytes) {
  const size_t size = bytes ? bytes : 1;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  SLUICE_CHECK(p != MAP_FAILED, Status::out_of_memory, "cannot reserve ", size, " bytes of address space: ",
               std::strerror(errno));
  return std::shared_ptr<void>(p, [size](void* addr) { ::munmap(addr, size); });
}

}  // namespace sluice
