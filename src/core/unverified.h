// Paths of the CUDA backend written in sessions without a GPU to run them on: compiled, with
// their GPU tests written, but never run. Until a GPU session has run those tests they stay
// off unless SLUICE_CUDA_UNVERIFIED=1, which the GPU tests set to run them; off, the verified
// path they would replace runs. The session that verifies a path removes its check and its
// line here.
// At present none: the paths written in the tenth to fourteenth sessions (the families'
// device-routed experts, the persistent MoE step, the prefill's copies beside its compute)
// passed their GPU tests on 2026-12-05 and lost their checks (the last two stay off behind
// switches of their own, SLUICE_CUDA_PERSISTENT and SLUICE_CUDA_PREFILL_COPY_STREAM, having
// measured no faster).
// Plain C++ (core/), so that host code outside the CUDA backend can ask too.
#pragma once

namespace sluice {

// Whether SLUICE_CUDA_UNVERIFIED=1 (read at every call: the GPU tests turn it on and off).
bool unverified_opted_in();

}  // namespace sluice
