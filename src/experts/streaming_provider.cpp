// make_streamer: the streamer for a backend; the host-side lookahead prediction (the router's,
// or a replayed routing's).
#include "experts/streaming_provider.h"

#include "experts/plan.h"

#include "experts/streamer.h"
#ifdef SLUICE_HAVE_CUDA
#include "experts/cuda/cuda_streamer.h"
#endif

namespace sluice {

std::shared_ptr<StreamingProvider> make_streamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k,
                                                 Backend& backend, const StreamerOptions& opt) {
#ifdef SLUICE_HAVE_CUDA
  if (auto cuda = make_cuda_streamer(pack, kind, top_k, backend, opt)) return cuda;  // slots in device memory
#endif
  return std::make_shared<ExpertStreamer>(std::move(pack), kind, top_k, opt);  // slots in host memory
}

std::vector<std::pair<float, int32_t>> predict_next_union(Backend& be, const MoeLayerCall& call, int64_t row0,
                                                          int64_t row1, int64_t n_expert) {
  const int64_t m = row1 - row0;
  Tensor logits_dev = be.alloc(DType::f32, {m, n_expert});  // [m, n_expert]
  be.matmul(call.h.slice_rows(row0, m), call.next_router, logits_dev);
  if (!call.next_router_bias.empty()) be.add_bias(logits_dev, call.next_router_bias);
  std::vector<float> logits(static_cast<size_t>(m * n_expert));
  be.to_host(logits_dev, logits.data());
  std::vector<float> bias(static_cast<size_t>(call.next_score_bias.numel()));
  if (!bias.empty()) be.to_host(call.next_score_bias, bias.data());
  const Routing pred = route_topk(*call.router, logits, m, bias);
  return predicted_union(pred.ids, pred.weights, n_expert);
}

std::vector<std::pair<float, int32_t>> lookahead_union(Backend& be, const MoeLayerCall& call, int64_t row0,
                                                       int64_t row1, int64_t n_expert) {
  if (!call.replay) return predict_next_union(be, call, row0, row1, n_expert);
  const std::optional<Routing> pred = call.replay.replay->predicted(call.moe_layer, call.replay.first + row0, row1 - row0);
  if (!pred) return {};
  return predicted_union(pred->ids, pred->weights, n_expert);  // ids of -1 (none recorded) are skipped
}

}  // namespace sluice
