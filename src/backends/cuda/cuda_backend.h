// CudaBackend: Backend on one NVIDIA GPU. Tensors live in device memory owned through
// Tensor::storage: weights (upload) in their own cudaMalloc blocks, activations (alloc) in a
// caching pool (cuda_memory.h). Ops are kernels enqueued on one stream; only to_host
// synchronizes. Host-side arrays (token ids, indices, routing weights, from_host) travel
// through a ring of pinned buffers, asynchronously. Compiled as C++20 by the host compiler:
// the kernels (.cu, C++17) are reached through kernels.h.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "backends/backend.h"
#include "backends/cuda/attention_decode.h"
#include "backends/cuda/cuda_memory.h"

namespace sluice {
namespace cuda {
class CublasGemm;
struct MoeShape;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  // The stream every op is enqueued on (the CUDA streamer enqueues its handshake on it).
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  Tensor upload(const Tensor& host) override;
  void to_host(const Tensor& src, void* dst) override;
  std::unique_ptr<HostReadback> make_readback(size_t bytes) override;
  void from_host(const Tensor& dst, const void* src) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  void synchronize() override;
  std::optional<uint64_t> memory_available() const override;

  void matmul(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void add_bias(const Tensor& y, const Tensor& b) override;
  void add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) override;
  void matmul_add_rms_norm(const Tensor& a, const Tensor& w, const Tensor& x, const Tensor& norm, float eps,
                           const Tensor& out) override;
  void attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const Tensor& cos, const Tensor& sin, int64_t rot_dim, bool interleaved,
                        const Tensor& k_cache, const Tensor& v_cache, int64_t n_past, const Tensor& positions) override;
  void attention_inputs_rows(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                             const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin, int64_t rot_dim,
                             bool interleaved, const RowCaches& caches) override;
  void attention_rows(const Tensor& q, const Tensor& out, const RowCaches& caches, float scale,
                      int64_t sliding_window, const Tensor& sinks) override;
  Tensor concat_rows(std::span<const Tensor> parts) override;
  // Multi-head latent attention (cuda/mla_ops.cpp; kernels in attention_latent.h): the
  // absorbed form's per-head products and attention over the latent cache; a prompt chunk
  // takes the expanded form, its heads zero-padded to the flash kernel's sizes.
  void matmul_heads(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void attention_latent(const Tensor& q, const Tensor& cache, const Tensor& out, const AttentionParams& params) override;
  void attention_latent_rows(const Tensor& q, const Tensor& out, const RowCaches& caches, float scale) override;
  void write_rows(const Tensor& src, const Tensor& dst, int64_t row0, const Tensor& positions) override;
  bool latent_attention_expands_prompts() const override { return true; }
  int64_t attention_padded_dim(int64_t d) const override;
  // f32 or bf16 caches: every attention kernel reads either (bf16 converted as read, f32 math).
  bool kv_dtype_supported(DType t) const override { return t == DType::f32 || t == DType::bf16; }
  DType auto_kv_dtype() const override { return DType::bf16; }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override;
  void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim, bool interleaved) override;
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
  void get_rows_at(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void scatter_rows_at(const Tensor& src, const Tensor& idx, const Tensor& dst) override;

  // CUDA graphs (stream capture), on unless SLUICE_CUDA_GRAPHS=0. While capturing, alloc
  // draws from a pool the graph owns, so no block a replay writes is ever handed to others.
  bool graphs_enabled() const override { return graphs_enabled_; }
  void graph_begin() override;
  std::unique_ptr<BackendGraph> graph_end() override;
  void graph_launch(const BackendGraph& graph) override;

  // Device-side MoE (cuda_moe.cpp): an ExpertRef table per layer, moe_kernels.h.
  std::unique_ptr<ExpertTable> make_expert_table(std::span<const ExpertWeights> experts, const ExpertMath& math,
                                                 const TableRouting& routing = {}) override;
  // moe_routed's path when the routing weights scale the experts' inputs (cuda_moe.cpp).
  void moe_scaled_inputs(const ExpertTable& table, const Tensor& ids, const Tensor& weights, const Tensor& h,
                         const Tensor& out, const cuda::MoeShape& shape);
  void moe_routed(const ExpertTable& table, const Tensor& logits, int64_t n_expert_used, bool norm_topk,
                  const Tensor& h, const Tensor& out, const ReplayRows& replay = {}) override;
  // A replayed routing's rows and predictions in device memory (cuda_moe.cpp).
  std::unique_ptr<RoutingReplayTable> make_routing_replay(int64_t n_layers, int64_t n_tokens, int64_t k,
                                                          std::span<const int32_t> ids, std::span<const float> weights,
                                                          std::span<const int32_t> predicted) override;

  // Ops of the hybrid Qwen families (cuda/hybrid_ops.cpp; kernels in cuda/hybrid_kernels.h).
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
  void sample(const Tensor& logits, int64_t n_valid, const SampleRule& rule, const Tensor& uniform,
              const Tensor& ids) override;

 private:
  // A device copy of host bytes, enqueued on the stream (the caller keeps the returned owner
  // alive until its kernel is enqueued; the pool orders any reuse behind that kernel).
  std::shared_ptr<void> stage(const void* host, size_t bytes);
  // A batch step's positions on the device (*dev): caches.positions, or caches.n_past staged
  // (the returned owner; eagerly only).
  std::shared_ptr<void> row_positions(const RowCaches& caches, int64_t n, const int32_t** dev);
  // The split decode attention (attention_decode.h) with its partials and counters.
  void decode_attention(cuda::AttentionDecodeParams a);
  // attention_inputs, with rows: a batch step's rows into caches of their own.
  void attention_inputs_launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                               const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin, int64_t rot_dim,
                               bool interleaved, const Tensor& k_cache, const Tensor& v_cache, int64_t n_past,
                               const Tensor& positions, const cuda::RowCachePtrs* rows);
  // Host bytes to device memory on the stream; the host buffer may be reused at once.
  void copy_from_host(void* dst, const void* src, size_t bytes);

  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<cuda::DevicePool> pool_;          // activations
  std::shared_ptr<cuda::DevicePool> capture_pool_;  // the graph being captured, else null
  bool graphs_enabled_ = true;
  std::unique_ptr<cuda::PinnedRing> pinned_;
  // Page-locked bounce buffer of to_host (up to kReadbackMax bytes): a decode token's logits
  // come back at copy-engine speed, not through the driver's pageable staging.
  static constexpr size_t kReadbackMax = size_t{64} << 20;
  void* readback_ = nullptr;
  size_t readback_bytes_ = 0;
  std::shared_ptr<void> sample_counters_;     // [kSampleMaxRows] i32, zero between launches
  std::shared_ptr<void> norm_counter_;        // one i32 (matvec_add_rms_norm), zero between launches
  std::unique_ptr<cuda::CublasGemm> cublas_;  // prefill products of bf16 weights, made at the first one
};

}  // namespace sluice
