// Read-only zero pages: an anonymous mapping that costs address space, not memory, for a view
// that must have a size but whose values nobody reads (the made-up weights of a dry run).
#pragma once

#include <cstddef>
#include <memory>

namespace sluice {

// A read-only mapping of `bytes` zero bytes (at least one page); the pointer is its address
// and unmaps it when the last copy goes. Error(out_of_memory) when the address space is short.
std::shared_ptr<void> zero_pages(size_t bytes);

}  // namespace sluice
