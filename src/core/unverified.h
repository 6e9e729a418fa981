// Paths of the CUDA backend written in sessions without a GPU to run them on: compiled, with
// their GPU tests written, but never run. Until a GPU session has run those tests they stay
// off unless SLUICE_CUDA_UNVERIFIED=1, which the GPU tests set to run them; off, the verified
// path they would replace runs. The session that verifies a path removes its check and its
// line here.
//   - the device-routed experts of gpt-oss (biases, the clamped SwiGLU, MXFP4 weights), Gemma
//     4 (GeGLU, per-expert routing scales) and Llama 4 (sigmoid routing, inputs scaled by the
//     weights): the expert tables of CudaBackend::make_expert_table
//     (backends/cuda/cuda_moe.cpp) and the CUDA streamer's device routing
//     (CudaStreamer::routes_on_device, Impl::expert_inputs); off, those experts are routed on
//     the host and computed by the generic ops.
//   - the persistent decode MoE step (backends/cuda/moe_persistent.h), asked for with
//     SLUICE_CUDA_PERSISTENT=1 in CudaBackend::moe_routed; off, the three chained launches.
//   - the CUDA streamer's prefill copies beside its compute (experts/cuda/grouped.cpp,
//     land_group_in_chunks: a group's records copied on a stream of their own in chunks, each
//     wave waiting for its chunk's event); off, the copies and the waves take turns on the
//     one stream (land_group).
// Plain C++ (core/), so that host code outside the CUDA backend can ask too.
#pragma once

namespace sluice {

// Whether SLUICE_CUDA_UNVERIFIED=1 (read at every call: the GPU tests turn it on and off).
bool unverified_opted_in();

}  // namespace sluice
