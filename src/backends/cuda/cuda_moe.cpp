// CudaBackend's device-side MoE: a table of ExpertRef (moe_kernels.h) per layer over the
// resident experts (their biases and activation in each entry; the router's scoring and
// per-expert scales in the table), built once at load, and moe_routed = router top-k, the
// experts and the combine, all enqueued on the backend's stream with no host round trip; many
// pairs per expert (prefill) take the grouped kernels.
#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/moe_kernels.h"
#include "backends/cuda/router_group_topk.h"
#include "core/quant.h"
#include "core/router_scoring.h"
#include "core/switches.h"

#include "backends/cuda/cuda_check.h"

namespace sluice {
namespace {

struct CudaExpertTable final : ExpertTable {
  Tensor refs;  // [n_expert] ExpertRef in device memory (as bytes)
  Tensor expert_scale;  // [n_expert] f32 multiplying the chosen experts' weights, or empty
  RouterScoring scoring = RouterScoring::softmax;
  cuda::RouterGroupParams group;  // sigmoid_grouped: groups, scaling and the layer's correction bias
  Tensor score_bias;            // [n_expert] f32 behind group.score_bias, or empty
  bool scale_input = false;  // the weights scale the experts' inputs; their outputs are summed (Llama 4)
  int64_t n_expert = 0, n_embd = 0, n_ff = 0;
  cuda::WType wtype = cuda::WType::unavailable;  // every expert's (they share one dtype)
};

}  // namespace

// A replayed routing in device memory: [n_layers, n_tokens, k] ids, weights and predicted ids.
struct CudaRoutingReplayTable final : RoutingReplayTable {
  cuda::DeviceBuffer ids, weights, predicted;
  int64_t n_layers = 0, n_tokens = 0, k = 0;
  // Layer L's rows, or (predicted) its predictions of layer L + 1, with no weights.
  cuda::ReplaySource source(int64_t layer, bool of_predictions) const {
    const size_t at = static_cast<size_t>(layer * n_tokens * k);
    if (of_predictions) return {predicted.as<int32_t>() + at, nullptr, n_tokens, k};
    return {ids.as<int32_t>() + at, weights.as<float>() + at, n_tokens, k};
  }
};

cuda::ReplaySource cuda::replay_source(const RoutingReplayTable& table, int64_t layer, bool of_predictions) {
  const auto* t = dynamic_cast<const CudaRoutingReplayTable*>(&table);
  SLUICE_CHECK(t != nullptr && layer >= 0 && layer < t->n_layers && (!of_predictions || t->predicted.as()),
               Status::internal, "cuda replay: not a CUDA replay table of layer ", layer,
               of_predictions ? " with predictions" : "");
  return t->source(layer, of_predictions);
}

std::unique_ptr<RoutingReplayTable> CudaBackend::make_routing_replay(int64_t n_layers, int64_t n_tokens, int64_t k,
                                                                     std::span<const int32_t> ids,
                                                                     std::span<const float> weights,
                                                                     std::span<const int32_t> predicted) {
  const auto n = static_cast<size_t>(n_layers * n_tokens * k);
  SLUICE_CHECK(n > 0 && ids.size() == n && weights.size() == n && (predicted.empty() || predicted.size() == n),
               Status::internal, "cuda replay: ", ids.size(), " ids, ", weights.size(), " weights, ", predicted.size(),
               " predictions for ", n_layers, " layers of ", n_tokens, " tokens of ", k);
  auto t = std::make_unique<CudaRoutingReplayTable>();
  t->n_layers = n_layers;
  t->n_tokens = n_tokens;
  t->k = k;
  t->ids = cuda::DeviceBuffer(n * sizeof(int32_t), "the replayed routing's ids");
  t->weights = cuda::DeviceBuffer(n * sizeof(float), "the replayed routing's weights");
  // On the backend's stream (a plain cudaMemcpy from pageable memory may still be in flight on
  // the legacy stream when the first kernel of this non-blocking one reads the table).
  copy_from_host(t->ids.as(), ids.data(), n * sizeof(int32_t));
  copy_from_host(t->weights.as(), weights.data(), n * sizeof(float));
  if (!predicted.empty()) {
    t->predicted = cuda::DeviceBuffer(n * sizeof(int32_t), "the replayed routing's predictions");
    copy_from_host(t->predicted.as(), predicted.data(), n * sizeof(int32_t));
  }
  return t;
}

namespace {

// Whether the device MoE kernels compute these experts: SwiGLU without biases under softmax
// routing in any type the matrix kernels read, and gpt-oss's experts (clamped SwiGLU, f32
// biases, MXFP4 or any other type), Gemma 4's (GeGLU, per-expert scales) and Llama 4's (sigmoid
// routing whose weights scale the inputs) unless SLUICE_CUDA_HOST_ROUTED=1 (core/switches.h).
bool device_experts_ok(std::span<const ExpertWeights> experts, const ExpertMath& math, const TableRouting& routing) {
  const bool verified = math.activation == ExpertActivation::swiglu && !math.scale_input &&
                        routing.scoring == RouterScoring::softmax && routing.expert_scale.empty() &&
                        std::none_of(experts.begin(), experts.end(), [](const ExpertWeights& w) {
                          return w.has_biases() || w.gate.dtype == DType::mxfp4;
                        });
  if (verified) return true;
  if (switches::on(Switch::cuda_host_routed)) return false;
  for (const ExpertWeights& w : experts)
    for (const Tensor* b : {&w.gate_bias, &w.up_bias, &w.down_bias})
      if (!b->empty() && b->dtype != DType::f32) return false;  // the kernels add f32 biases
  return true;
}

}  // namespace

cuda::ExpertAct cuda::expert_act_of(const ExpertMath& math) {
  switch (math.activation) {
    case ExpertActivation::swiglu_clamped: return ExpertAct::swiglu_clamped;
    case ExpertActivation::geglu_tanh: return ExpertAct::geglu_tanh;
    default: return ExpertAct::swiglu;
  }
}

void cuda::launch_router(RouterScoring scoring, const float* logits, int64_t n, int64_t n_expert, int64_t k,
                         bool norm_topk, int32_t* ids, float* weights, Stream s, const float* expert_scale,
                         RoutingCopy copy, const RouterGroupParams* group) {
  if (scoring == RouterScoring::sigmoid_grouped) {
    SLUICE_CHECK(group != nullptr, Status::internal, "cuda router: group-limited routing without its parameters");
    launch_router_group_topk(logits, n, n_expert, k, norm_topk, *group, ids, weights, s, copy);
  } else if (scoring == RouterScoring::sigmoid) {
    launch_router_topk_sigmoid(logits, n, n_expert, k, ids, weights, s, copy);
  } else {
    launch_router_topk(logits, n, n_expert, k, norm_topk, ids, weights, s, expert_scale, copy);
  }
}

bool cuda::router_fits_device(RouterScoring scoring, int64_t n_expert, int64_t k, int64_t n_group) {
  switch (scoring) {
    case RouterScoring::sigmoid_grouped: return router_group_topk_supported(n_expert, k, n_group);
    case RouterScoring::sigmoid: return n_expert <= 512 && k <= 32;
    default: return true;
  }
}

std::unique_ptr<ExpertTable> CudaBackend::make_expert_table(std::span<const ExpertWeights> experts,
                                                          const ExpertMath& math, const TableRouting& routing) {
  // Experts device_experts_ok refuses (the families' math with SLUICE_CUDA_HOST_ROUTED=1) are
  // routed on the host and computed by the generic ops (expert_forward).
  if (!device_experts_ok(experts, math, routing)) return nullptr;
  const std::span<const float> expert_scale = routing.expert_scale;
  SLUICE_CHECK(expert_scale.empty() || expert_scale.size() == experts.size(), Status::internal, "cuda moe: ",
               expert_scale.size(), " expert scales for ", experts.size(), " experts");
  // Past the device top-k's bounds: routed on the host. Without the top-k (a table made
  // outside make_expert_tables) the bound at one expert a token is asked; moe_routed's launch
  // checks the call's.
  if (!cuda::router_fits_device(routing.scoring, static_cast<int64_t>(experts.size()),
                                routing.top_k > 0 ? routing.top_k : 1, routing.grouped.n_group))
    return nullptr;
  SLUICE_CHECK(routing.score_bias.empty() || routing.score_bias.size() == experts.size(), Status::internal,
               "cuda moe: ", routing.score_bias.size(), " correction biases for ", experts.size(), " experts");
  auto table = std::make_unique<CudaExpertTable>();
  table->n_expert = static_cast<int64_t>(experts.size());
  SLUICE_CHECK(table->n_expert > 0, Status::internal, "cuda moe: an expert table needs experts");
  table->n_ff = experts[0].gate.shape[0];
  table->n_embd = experts[0].gate.cols();
  std::vector<cuda::ExpertRef> refs(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const ExpertWeights& w = experts[e];
    const DType t = w.gate.dtype;
    SLUICE_CHECK(w.up.dtype == t && w.down.dtype == t && w.gate.rows() == table->n_ff &&
                     w.gate.cols() == table->n_embd && w.up.rows() == table->n_ff && w.up.cols() == table->n_embd &&
                     w.down.rows() == table->n_embd && w.down.cols() == table->n_ff,
                 Status::internal, "cuda moe: expert ", e, " differs from expert 0 in dtype or shape (gate ",
                 w.gate.shape_str(), ", up ", w.up.shape_str(), ", down ", w.down.shape_str(), ")");
    const Tensor* parts[3] = {&w.gate, &w.up, &w.down};
    const Tensor* biases[3] = {&w.gate_bias, &w.up_bias, &w.down_bias};
    const int64_t bias_len[3] = {table->n_ff, table->n_ff, table->n_embd};
    for (int i = 0; i < 3; ++i) {
      refs[e].data[i] = parts[i]->data;
      refs[e].scales[i] = parts[i]->scales;
      SLUICE_CHECK(!dtype_is_quantized(t) || parts[i]->scales, Status::internal, "cuda moe: expert ", e,
                   " is quantized without scales");
      if (biases[i]->empty()) continue;
      SLUICE_CHECK(biases[i]->numel() == bias_len[i], Status::internal, "cuda moe: expert ", e, " has a bias of ",
                   biases[i]->shape_str(), " for a product of ", bias_len[i], " rows");
      refs[e].bias[i] = static_cast<const float*>(biases[i]->data);
    }
    refs[e].wtype = cuda::matmul_wtype_of(t, "moe");
    refs[e].act = cuda::expert_act_of(math);
    refs[e].alpha = math.alpha;
    refs[e].limit = math.limit;
  }
  table->wtype = refs[0].wtype;
  table->scoring = routing.scoring;
  table->scale_input = math.scale_input;
  const int64_t bytes = table->n_expert * static_cast<int64_t>(sizeof(cuda::ExpertRef));
  table->refs = alloc(DType::u8, {bytes});
  from_host(table->refs, refs.data());
  if (!expert_scale.empty()) {
    table->expert_scale = alloc(DType::f32, {table->n_expert});
    from_host(table->expert_scale, expert_scale.data());
  }
  table->group = {routing.grouped.n_group, routing.grouped.topk_group, routing.grouped.routed_scaling_factor,
                  routing.grouped.norm_eps, nullptr};
  if (!routing.score_bias.empty()) {
    table->score_bias = alloc(DType::f32, {table->n_expert});
    from_host(table->score_bias, routing.score_bias.data());
    table->group.score_bias = table->score_bias.ptr<float>();
  }
  return table;
}

// moe_routed when the routing weights scale the experts' inputs (Llama 4): each pair's input
// row x[p] = weight[p] h[p / k] (one rounding an element, as expert_pairs_forward), the pairs
// computed as rows of their own (top-1 over n k rows), their outputs summed in rank order with
// weight 1 (combine_weights).
void CudaBackend::moe_scaled_inputs(const ExpertTable& table_base, const Tensor& ids, const Tensor& weights,
                                    const Tensor& h, const Tensor& out, const cuda::MoeShape& shape) {
  const auto& table = static_cast<const CudaExpertTable&>(table_base);
  const int64_t n = shape.n_rows, k = shape.k, pairs = n * k;
  const auto* refs = static_cast<const cuda::ExpertRef*>(table.refs.data);
  Tensor x = alloc(DType::f32, {pairs, table.n_embd});
  cuda::launch_scale_pair_inputs(h.ptr<float>(), weights.ptr<float>(), x.ptr<float>(), n, k, table.n_embd, stream_);
  Tensor act = alloc(DType::f32, {pairs, table.n_ff});
  Tensor pair_out = alloc(DType::f32, {pairs, table.n_embd});
  const cuda::MoeShape per_pair = cuda::pairs_as_rows(shape);  // x's row p is pair p's input
  if (pairs >= cuda::kMoeGroupedPairsPerExpert * table.n_expert) {
    Tensor group = alloc(DType::u8, {cuda::moe_grouped_scratch_bytes(per_pair)});
    const cuda::MoeGroupedParams p{x.ptr<float>(), ids.ptr<int32_t>(), nullptr, refs, group.data,
                                   act.ptr<float>(), pair_out.ptr<float>(), out.ptr<float>(), per_pair};
    cuda::launch_moe_grouped_prepare(p, stream_);
    cuda::launch_moe_grouped_experts(p, stream_);
    cuda::launch_moe_combine(pair_out.ptr<float>(), nullptr, out.ptr<float>(), n, k, table.n_embd, stream_);  // weight 1
    return;
  }
  Tensor done = alloc(DType::u8, {pairs});
  CUDA_CHECK(cudaMemsetAsync(done.data, 0, static_cast<size_t>(pairs), stream_));
  cuda::launch_moe_experts(x.ptr<float>(), ids.ptr<int32_t>(), refs, static_cast<uint8_t*>(done.data),
                           act.ptr<float>(), pair_out.ptr<float>(), per_pair, stream_);
  cuda::launch_moe_combine_done(pair_out.ptr<float>(), nullptr, static_cast<const uint8_t*>(done.data),
                                out.ptr<float>(), shape, stream_);  // weight 1
}

void CudaBackend::moe_routed(const ExpertTable& table_base, const Tensor& logits, int64_t k, bool norm_topk,
                             const Tensor& h, const Tensor& out, const ReplayRows& replay) {
  const auto* table = dynamic_cast<const CudaExpertTable*>(&table_base);
  SLUICE_CHECK(table != nullptr, Status::internal, "cuda moe_routed: the table is not a CUDA expert table");
  const int64_t n = h.rows();
  SLUICE_CHECK(logits.dtype == DType::f32 && h.dtype == DType::f32 && out.dtype == DType::f32 &&
                   logits.rows() == n && logits.cols() == table->n_expert && h.cols() == table->n_embd &&
                   out.rows() == n && out.cols() == table->n_embd && k > 0 && k <= table->n_expert,
               Status::internal, "cuda moe_routed: logits ", logits.shape_str(), ", h ", h.shape_str(), ", out ",
               out.shape_str(), ", k ", k, " for a table of ", table->n_expert, " experts [", table->n_ff, ", ",
               table->n_embd, "]");
  if (n == 0) return;
  const cuda::MoeShape shape{n, k, table->n_embd, table->n_ff, table->n_expert, table->wtype};
  Tensor ids = alloc(DType::i32, {n * k});
  Tensor weights = alloc(DType::f32, {n * k});
  Tensor act = alloc(DType::f32, {n * k, table->n_ff});
  const auto* refs = static_cast<const cuda::ExpertRef*>(table->refs.data);
  const float* expert_scale = table->expert_scale.empty() ? nullptr : table->expert_scale.ptr<float>();
  if (replay.table)  // a replayed routing (benchmarks) where the top-k would store its own
    cuda::launch_router_replay(cuda::replay_source(*replay.table, replay.layer, false), replay.first, n,
                               replay.normalize, ids.ptr<int32_t>(), weights.ptr<float>(), stream_, expert_scale);
  else
    cuda::launch_router(table->scoring, logits.ptr<float>(), n, table->n_expert, k, norm_topk, ids.ptr<int32_t>(),
                        weights.ptr<float>(), stream_, expert_scale, {}, &table->group);
  if (table->scale_input) return moe_scaled_inputs(*table, ids, weights, h, out, shape);
  if (n * k >= cuda::kMoeGroupedPairsPerExpert * table->n_expert) {
    // Prefill: many pairs per expert; read each expert's weights once per tile of pairs.
    Tensor group = alloc(DType::u8, {cuda::moe_grouped_scratch_bytes(shape)});
    Tensor pair_out = alloc(DType::f32, {n * k, table->n_embd});
    cuda::launch_moe_experts_grouped({h.ptr<float>(), ids.ptr<int32_t>(), weights.ptr<float>(), refs, group.data,
                                      act.ptr<float>(), pair_out.ptr<float>(), out.ptr<float>(), shape},
                                     stream_);
    return;
  }
  // Every expert resident: no done flags, the down product and the combine in one launch.
  cuda::launch_moe_experts_combine(h.ptr<float>(), ids.ptr<int32_t>(), weights.ptr<float>(), refs, act.ptr<float>(),
                                   out.ptr<float>(), shape, stream_);
}

}  // namespace sluice
