// causal_conv1d: the depthwise causal convolution of the Gated DeltaNet (kernel 4, dilation
// 1) and of PLE (dilated by the n-gram size), with the state a decode step carries. One
// thread per output element accumulates the K taps in tap order from +0 with fma, then SiLU
// = acc / (1 + e^-acc), as the CPU reference (cpu/conv1d.cpp). A second kernel then moves the
// state (one thread per channel, rows in increasing order, so a row is read before it is
// overwritten when n < S); stream order puts it after every output has read the old state.
#include "backends/cuda/common.cuh"
#include "backends/cuda/hybrid_kernels.h"

namespace sluice::cuda {
namespace {

__global__ void conv1d_kernel(Conv1dParams p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.n * p.c) return;
  const int64_t row = t / p.c, ch = t % p.c, S = (p.K - 1) * p.dilation;
  float acc = 0.0f;
  for (int64_t j = 0; j < p.K; ++j) {
    const int64_t u = S + row - (p.K - 1 - j) * p.dilation;  // row of xx = [state; x]
    const float xv = u < S ? p.state[u * p.c + ch] : p.x[(u - S) * p.c + ch];
    acc = fmaf(p.w[ch * p.K + j], xv, acc);
  }
  if (p.silu) acc = __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
  p.out[t] = acc;
}

// state = the last S rows of [state; x]: row u takes xx row n + u.
__global__ void conv1d_state_kernel(Conv1dParams p) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= p.c) return;
  const int64_t S = (p.K - 1) * p.dilation;
  for (int64_t u = 0; u < S; ++u) {
    const int64_t src = p.n + u;
    p.state[u * p.c + ch] = src < S ? p.state[src * p.c + ch] : p.x[(src - S) * p.c + ch];
  }
}

}  // namespace

void launch_causal_conv1d(const Conv1dParams& p, Stream s) {
  if (p.n == 0 || p.c == 0) return;
  auto st = static_cast<cudaStream_t>(s);
  conv1d_kernel<<<blocks_for(p.n * p.c, 256), 256, 0, st>>>(p);
  CUDA_CHECK(cudaGetLastError());
  if (p.K > 1) {
    conv1d_state_kernel<<<blocks_for(p.c, 256), 256, 0, st>>>(p);
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace sluice::cuda
