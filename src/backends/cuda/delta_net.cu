// Gated DeltaNet on CUDA: the gates (delta_net_gates) and the gated delta rule. CPU reference
// and both of its forms: cpu/delta_net.cpp.
//
// The delta rule, per value head h and token t (S [dk, dv], q and k L2-normalized, q / sqrt(dk)):
//   S = exp(g_t) S;  kv[j] = sum_i S[i, j] k[i];  delta[j] = beta_t (v_t[j] - kv[j]);
//   S[i, j] += k[i] delta[j];  out[j] = sum_i S[i, j] q[i]
// Column j of S evolves on its own: kv[j], delta[j] and out[j] read only column j. So one warp
// serves one value head and 32 columns (grid [hv, ceil(dv / 32)]), each lane carries its
// column of S in registers (dk <= DK, the template bound) for the whole call, and a token
// costs 2 DK fmas per lane plus one warp reduction for the norms of q and k, with no
// synchronization beyond the warp. The state is read from and written back to device memory
// once per call, so decode (n = 1) touches it once.
//
// Chunked calls (chunk_size > 0, prefill) run this same recurrent form. The chunked (WY) form
// exists to turn the token loop into matrix products; on the CPU it is the reference's
// prefill path, but its result is the same sum with other roundings: the CPU's two forms agree
// within 1e-9 normalized squared error of a double reference (tests/unit/hybrid_ops_test.cpp),
// so comparing this kernel with the CPU's chunked form stays within the 1e-6 bound of every
// f32 op (tests/gpu/cuda_hybrid_ops_test.cpp compares each chunk size with the CPU's matching
// form). A tensor-core chunked kernel is a speed-up for long prefills, not a correctness need.
#include "backends/cuda/common.cuh"
#include "backends/cuda/hybrid_kernels.h"

namespace sluice::cuda {
namespace {

__global__ void delta_net_gates_kernel(const float* a, const float* b, const float* A_log, const float* dt_bias,
                                       float* g, float* beta, int64_t n, int64_t H) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t h = i % H;
  const float x = __fadd_rn(a[i], dt_bias[h]);
  const float softplus = x > 20.0f ? x : log1pf(expf(x));  // torch's threshold
  g[i] = __fmul_rn(-expf(A_log[h]), softplus);
  beta[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b[i])));
}

template <int DK>
__global__ void __launch_bounds__(32) gated_delta_rule_kernel(DeltaRuleKernelParams p) {
  constexpr int kPer = DK / 32;  // elements of q and k each lane loads
  __shared__ float qs[DK], ks[DK];
  const int lane = threadIdx.x;
  const int64_t h = blockIdx.x, j = static_cast<int64_t>(blockIdx.y) * 32 + lane;
  const int64_t kh = h / (p.hv / p.hk), dk = p.dk, dv = p.dv;
  const bool active = j < dv;
  const float sqrt_dk = sqrtf(static_cast<float>(dk));
  float* S = p.state + h * dk * dv;
  float s[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) s[i] = (active && i < dk) ? S[i * dv + j] : 0.0f;

  for (int64_t t = 0; t < p.n; ++t) {
    const float* qt = p.q + (t * p.hk + kh) * dk;
    const float* kt = p.k + (t * p.hk + kh) * dk;
    float qv[kPer], kv_[kPer], qss = 0.0f, kss = 0.0f;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int i = lane + 32 * u;
      qv[u] = i < dk ? qt[i] : 0.0f;
      kv_[u] = i < dk ? kt[i] : 0.0f;
      qss = fmaf(qv[u], qv[u], qss);
      kss = fmaf(kv_[u], kv_[u], kss);
    }
    qss = warp_sum(qss);
    kss = warp_sum(kss);
    const float qinv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(qss, 1e-6f)));
    const float kinv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(kss, 1e-6f)));
    __syncwarp();  // the previous token's reads of qs, ks are done
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      qs[lane + 32 * u] = __fdiv_rn(__fmul_rn(qv[u], qinv), sqrt_dk);
      ks[lane + 32 * u] = __fmul_rn(kv_[u], kinv);
    }
    __syncwarp();
    const float decay = expf(p.g[t * p.hv + h]), b = p.beta[t * p.hv + h];
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      s[i] = __fmul_rn(s[i], decay);
      kv = fmaf(s[i], ks[i], kv);
    }
    const float vt = active ? p.v[(t * p.hv + h) * dv + j] : 0.0f;
    const float delta = __fmul_rn(__fsub_rn(vt, kv), b);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      s[i] = fmaf(ks[i], delta, s[i]);
      o = fmaf(s[i], qs[i], o);
    }
    if (active) p.out[(t * p.hv + h) * dv + j] = o;
  }
  if (active) {
#pragma unroll
    for (int i = 0; i < DK; ++i)
      if (i < dk) S[i * dv + j] = s[i];
  }
}

}  // namespace

void launch_delta_net_gates(const float* a, const float* b, const float* A_log, const float* dt_bias, float* g,
                            float* beta, int64_t n, int64_t H, Stream s) {
  if (n == 0) return;
  delta_net_gates_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(a, b, A_log, dt_bias, g,
                                                                                        beta, n, H);
  CUDA_CHECK(cudaGetLastError());
}

void launch_gated_delta_rule(const DeltaRuleKernelParams& p, Stream s) {
  SLUICE_CHECK(p.dk <= kDeltaMaxDk, Status::unsupported, "cuda gated_delta_rule: key head dim ", p.dk,
               " exceeds ", kDeltaMaxDk);
  if (p.n == 0 || p.hv == 0 || p.dv == 0) return;
  const dim3 grid(static_cast<unsigned>(p.hv), static_cast<unsigned>((p.dv + 31) / 32));
  auto st = static_cast<cudaStream_t>(s);
  if (p.dk <= 32) gated_delta_rule_kernel<32><<<grid, 32, 0, st>>>(p);
  else if (p.dk <= 64) gated_delta_rule_kernel<64><<<grid, 32, 0, st>>>(p);
  else if (p.dk <= 128) gated_delta_rule_kernel<128><<<grid, 32, 0, st>>>(p);
  else gated_delta_rule_kernel<256><<<grid, 32, 0, st>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
