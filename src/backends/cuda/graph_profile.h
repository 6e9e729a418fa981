// profile_graph: each kernel node of a captured graph timed on its own, summed per kernel,
// against a replay of the whole graph; a markdown table on stderr. A developer's tool
// (SLUICE_CUDA_PROFILE=1 profiles every graph the backend captures), for want of Nsight on
// the GPU machine.
#pragma once

#include <cuda_runtime.h>

namespace sluice::cuda {

// Launches each kernel node `reps` times alone and the graph `reps` times: run it only where
// re-running the graph's kernels is harmless (a decode step rewrites the same values).
void profile_graph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, int reps = 20);

}  // namespace sluice::cuda
