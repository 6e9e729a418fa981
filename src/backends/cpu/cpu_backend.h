// CpuBackend: the reference implementation of Backend, and the fast path on machines
// without a GPU. Memory is host memory (64-byte aligned allocations); ops run synchronously
// on a ThreadPool. The op bodies live one family per file (matmul.cpp, norm.cpp, rope.cpp,
// attention.cpp, elementwise.cpp, rows.cpp; for the hybrid families columns.cpp,
// activation.cpp, norm_groups.cpp, conv1d.cpp, delta_net.cpp, hyper.cpp, qsa.cpp).
//
// Reproducibility contract (other backends are checked against it): every output element
// of every op is computed in one fixed order that depends only on the op's sizes along the
// reduced dimension, never on the number of rows, the thread count or the code path, so a
// batched prefill and a token-by-token decode produce identical bits. See simd.h.
#pragma once

#include <string>

#include "backends/backend.h"
#include "core/thread_pool.h"

namespace sluice {

namespace cpu {
// matmul with a quantized weight (q8, q4, q2, mxfp4; core/quant.h), in matmul_quant.cpp:
// y[n, m] = x[n, k] . dequantize(w)[m, k]^T, each element bit for bit cpu::dot of the x row
// and the dequantized f32 weight row, whatever n or the thread count.
void matmul_quantized(const Tensor& x, const Tensor& w, const Tensor& y, ThreadPool& pool);
}  // namespace cpu

class CpuBackend final : public Backend {
 public:
  // pool: the threads the ops run on; null means ThreadPool::global(), looked up on use.
  explicit CpuBackend(ThreadPool* pool = nullptr) : pool_(pool) {}

  std::string name() const override { return "cpu"; }
  bool kv_dtype_supported(DType t) const override { return t == DType::f32 || t == DType::bf16; }

  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  Tensor upload(const Tensor& host) override;
  void to_host(const Tensor& src, void* dst) override;
  void from_host(const Tensor& dst, const void* src) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  void synchronize() override {}
  std::optional<uint64_t> memory_available() const override;

  void matmul(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void add_bias(const Tensor& y, const Tensor& b) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override;
  void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim,
            bool interleaved) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                 const AttentionParams& params) override;
  void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void swiglu_clamped(const Tensor& gate, const Tensor& up, const Tensor& out, float alpha, float limit) override;
  void add(const Tensor& x, const Tensor& y) override;
  void clamp(const Tensor& x, float lo, float hi) override;
  void get_rows(const Tensor& table, std::span<const int32_t> ids, const Tensor& out) override;
  void gather_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& out) override;
  void scatter_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& dst) override;
  void moe_combine(const Tensor& expert_out, std::span<const float> weights, int64_t k,
                   const Tensor& out) override;

  // Hybrid families (columns.cpp, activation.cpp, norm_groups.cpp, conv1d.cpp, delta_net.cpp,
  // hyper.cpp, qsa.cpp).
  void copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t n_cols) override;
  void activate(const Tensor& x, Activation act, float in_div, float out_mul) override;
  void mul(const Tensor& x, const Tensor& y) override;
  void rms_norm_groups(const Tensor& x, const Tensor& w, float eps, int64_t group, const Tensor& y) override;
  void causal_conv1d(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& out, int64_t dilation,
                     bool silu) override;
  void delta_net_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
                       const Tensor& beta) override;
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const Tensor& state, const Tensor& out, const DeltaRuleParams& params) override;
  void hyper_mix(const Tensor& xn, const Tensor& logits, const Tensor& out) override;
  void hyper_inject(const Tensor& x, const Tensor& y, const Tensor& w) override;
  void ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& out) override;
  void mean_rows(const Tensor& src, int64_t group, const Tensor& dst) override;
  void qsa_select(const Tensor& q, const Tensor& block_keys, const Tensor& idx, const QsaParams& params) override;
  void attention_indexed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& idx, const Tensor& out,
                         float scale) override;

  ThreadPool& pool() const { return pool_ ? *pool_ : ThreadPool::global(); }

 private:
  ThreadPool* pool_;
};

}  // namespace sluice
