// Backend: the narrow interface that model code runs on. The CPU backend (backends/cpu) is
// the reference implementation; the CUDA backend must match it op by op. Model code sees
// only this header: it never includes a backend's own headers.
//
// Conventions: activations are f32, row-major, contiguous; weights may be f32, bf16 or f16
// (quantized kinds come with the pack format). "rows" is the product of all but the
// innermost dimension. Ops may run asynchronously on a device; to_host synchronizes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "backends/tensor.h"

namespace sluice {

struct AttentionParams {
  int64_t n_past = 0;          // position of query row 0; query row i sits at n_past + i
  float scale = 1.0f;          // applied to q.k, usually 1/sqrt(head_dim)
  int64_t sliding_window = 0;  // 0: full causal; w > 0: query at p sees keys in (p - w, p]
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory ----
  // An uninitialized tensor of this backend.
  virtual Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) = 0;
  // A weight given in host memory (for example a file mapping) made usable by this backend.
  // The CPU backend returns it as is (no copy); a device backend copies it.
  virtual Tensor upload(const Tensor& host) = 0;
  virtual void to_host(const Tensor& src, void* dst) = 0;      // src.nbytes() bytes; synchronizes
  virtual void from_host(const Tensor& dst, const void* src) = 0;  // dst.nbytes() bytes
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;     // same dtype and numel
  virtual void fill(const Tensor& dst, float value) = 0;            // f32 dst
  virtual void synchronize() = 0;

  // ---- ops ----
  // y[n, m] = x[n, k] . w[m, k]^T; w is f32, bf16 or f16; y is f32 and may not alias x.
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
  // y[r, :] += b[:] for every row r (b has y.cols() elements, f32/bf16/f16).
  virtual void add_bias(const Tensor& y, const Tensor& b) = 0;
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]; w has x.cols() elements (any
  // weight dtype) or is empty (no scale). y may alias x.
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) = 0;
  // Rotary embedding in place on x[n, n_head, head_dim], over the first rot_dim dims of each
  // head. cos and sin are f32 [n, rot_dim / 2] (one row per token of x). Neox layout
  // (interleaved = false) pairs dim i with i + rot_dim/2; GPT-J layout pairs 2i with 2i+1.
  virtual void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim,
                    bool interleaved) = 0;
  // Causal grouped-query attention. q [n, n_head, d]; k, v [n_ctx, n_kv_head, d] holding
  // positions [0, n_past + n); out [n, n_head, d]. Query head h reads kv head
  // h / (n_head / n_kv_head). Softmax in f32.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const AttentionParams& params) = 0;
  // out = silu(gate) * up, elementwise; out may alias gate or up.
  virtual void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // x += y, elementwise.
  virtual void add(const Tensor& x, const Tensor& y) = 0;
  // x = min(max(x, lo), hi), elementwise, in place (f32).
  virtual void clamp(const Tensor& x, float lo, float hi) = 0;
  // out[i, :] = table[ids[i], :] converted to f32; table is f32/bf16/f16 [n_rows, cols].
  virtual void get_rows(const Tensor& table, std::span<const int32_t> ids, const Tensor& out) = 0;
  // out[i, :] = src[idx[i], :] (f32).
  virtual void gather_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& out) = 0;
  // dst[idx[i], :] = src[i, :] (f32).
  virtual void scatter_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& dst) = 0;
  // Mixture combine, in routing-rank order so the result never depends on which expert ran
  // first: out[t, :] = sum over r = 0..k-1 of weights[t*k + r] * expert_out[t*k + r, :].
  // expert_out [n*k, c], out [n, c], weights has n*k entries (host memory).
  virtual void moe_combine(const Tensor& expert_out, std::span<const float> weights, int64_t k,
                           const Tensor& out) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();
// Only in builds with SLUICE_CUDA (cuda_built() says whether this one is).
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
bool cuda_built();
// By name: "cpu", "cuda" or "cuda:N", or "auto" (CUDA when built and a device answers, else
// the CPU). An unknown name or an unusable GPU is a clear error.
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace sluice
