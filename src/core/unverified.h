// Paths of the CUDA backend written in sessions without a GPU to run them on: compiled, with
// their GPU tests written, but never run. Until a GPU session has run those tests they are
// refused in one line (Status::unsupported) unless SLUICE_CUDA_UNVERIFIED=1, which the GPU
// tests set to run them. The session that verifies a path removes its require_opt_in call
// and its line here (none at present).
// Plain C++ (core/), so that host code outside the CUDA backend can ask too.
#pragma once

namespace sluice {

// Whether SLUICE_CUDA_UNVERIFIED=1 (read at every call: the GPU tests turn it on and off).
bool unverified_opted_in();
// Throws Error(unsupported) naming `what` unless unverified_opted_in().
void require_opt_in(const char* what);

}  // namespace sluice
