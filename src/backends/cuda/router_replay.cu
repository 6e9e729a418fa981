// launch_router_replay (moe_kernels.h): a replayed routing's rows stored where the router's
// top-k kernels store theirs, so everything after the top-k runs as it would.
#include "backends/cuda/moe_kernels.h"

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/common.cuh"

namespace sluice::cuda {
namespace {

// One thread per row: its k ids and weights from the replay's row (first + row) mod n_tokens.
__global__ void router_replay_kernel(ReplaySource src, int64_t first, int64_t n, bool normalize, int32_t* ids,
                                     float* weights, const float* __restrict__ expert_scale, RoutingCopy copy) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row < n) {
    const int64_t k = src.k;
    const int64_t at = ((first + row) % src.n_tokens) * k;
    float sum = 0;
    if (src.weights)
      for (int64_t j = 0; j < k; ++j) sum += src.weights[at + j];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = src.ids[at + j];
      float w = src.weights ? src.weights[at + j] : static_cast<float>(k - j);
      if (src.weights && normalize && sum > 0) w /= sum;
      if (expert_scale && id >= 0) w *= expert_scale[id];
      ids[row * k + j] = id;
      weights[row * k + j] = w;
      if (copy.ids) {
        copy.ids[row * k + j] = id;
        copy.weights[row * k + j] = w;
      }
    }
  }
  if (copy.ids) __threadfence_system();  // in host memory before whatever signals the host after this kernel
}

}  // namespace

void launch_router_replay(const ReplaySource& src, int64_t first, int64_t n, bool normalize, int32_t* ids,
                          float* weights, Stream s, const float* expert_scale, RoutingCopy copy) {
  SLUICE_CHECK(src.ids && src.n_tokens > 0 && src.k > 0 && first >= 0, Status::internal,
               "cuda router_replay: a replay of ", src.n_tokens, " tokens of ", src.k, " from row ", first);
  if (n == 0) return;
  constexpr int kThreads = 128;
  router_replay_kernel<<<blocks_for(n, kThreads), kThreads, 0, static_cast<cudaStream_t>(s)>>>(
      src, first, n, normalize, ids, weights, expert_scale, copy);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
