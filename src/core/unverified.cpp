// The opt-in for CUDA paths not yet run on a GPU (unverified.h).
#include "core/unverified.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace sluice {

bool unverified_opted_in() {
  const char* e = std::getenv("SLUICE_CUDA_UNVERIFIED");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

void require_opt_in(const char* what) {
  SLUICE_CHECK(unverified_opted_in(), Status::unsupported, what,
               ": not supported on the cuda backend yet (written, not yet run on a GPU; "
               "SLUICE_CUDA_UNVERIFIED=1 runs it for testing); use --backend cpu");
}

}  // namespace sluice
