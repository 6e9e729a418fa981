// The opt-in for CUDA paths not yet run on a GPU (unverified.h).
#include "core/unverified.h"

#include <cstdlib>
#include <cstring>

namespace sluice {

bool unverified_opted_in() {
  const char* e = std::getenv("SLUICE_CUDA_UNVERIFIED");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

}  // namespace sluice
