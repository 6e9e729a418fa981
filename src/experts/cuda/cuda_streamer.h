// CudaStreamer: the routed experts of a pack served from a bounded expert cache in device
// memory (DESIGN.md, "The streamed decode step", on CUDA). The sibling of ExpertStreamer
// (experts/streamer.h), sharing its planner (experts/plan.h: every decision of a step),
// residency, eviction policies, IO engine and statistics; what differs is where the bytes go
// and who waits:
//
//   slots       one device allocation of n_slots x slot_bytes
//   misses      read with O_DIRECT through the IO engine into pinned host memory (a host-tier
//               record when there is a tier, else a staging buffer), then copied into their
//               slot on a copy stream; an event per copy tells the service thread it landed
//   host tier   pinned memory holding every record read from the pack (inclusive), so a miss
//               it holds is one host-to-device copy
//   routing     on the device (launch_router_topk); the ids come to the host through the
//               handshake (cuda/handshake.h); for experts the device kernels do not compute
//               (biases, the clamped SwiGLU, GeGLU, input scaling, sigmoid routing, per-expert
//               scales: gpt-oss, Llama 4, Gemma 4) the model routes on the host and the call
//               takes the host-routed path (host_routed.cpp)
//
// Files: streamer_impl.h lists them, one concern each.
//
// Per MoE layer call the model thread only enqueues, on the backend's stream:
//   topk -> ids to host -> write router_ready -> wait resident_ready -> phase 1 (table 1)
//   -> write resident_done -> wait misses_ready -> phase 2 (table 2) -> combine
// and hands the call to the service thread, which waits for router_ready, plans the step
// (StepPlan: union, acquire, misses strongest first, --miss-kind copies; lookahead),
// publishes table 1 (resident experts), waits for the misses to land (at resident_done the
// plan cuts late weak ones with --cut), publishes table 2 and answers misses_ready. A whole token is thus enqueued
// without the model thread waiting on the host. A batch whose experts may not fit the cache
// (a prefill with rows x k > slots) takes a synchronous path instead: rows grouped so each
// group's union fits, one plan-load-compute round per group. A host-routed call takes the
// same rounds, each group's experts computed with the backend's ops (expert_pairs_forward) on
// views of their slots, as the CPU streamer computes them.
//
// Errors: every host wait is bounded (StreamerOptions::wait_timeout) and names the layer and
// the signal. A failure on the service thread is kept and thrown on the model thread by the
// next moe() or forward_done(); before that, the service thread answers every pending signal
// with empty tables, so the device stream drains and nothing hangs.
#pragma once

#include <memory>

#include "experts/streaming_provider.h"
#include "experts/routing.h"

namespace sluice {

class CudaBackend;

class CudaStreamer final : public StreamingProvider {
 public:
  // Throws invalid_argument for a cache below top_k slots (the message states the minimum),
  // a miss kind the pack lacks, bad options; out_of_memory when the slots do not fit.
  CudaStreamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k, CudaBackend& backend,
               const StreamerOptions& opt);
  ~CudaStreamer() override;

  void moe(Backend& be, const MoeLayerCall& call) override;
  // SwiGLU experts without biases under softmax routing: the device kernels' math.
  bool routes_on_device(const ExpertMath& math, const RouterSpec& router) const override;
  void forward_done() override;
  bool forwards_overlap() const override;
  void forward_checked() override;

  RunStats stats() const override;
  void reset_stats() override;
  bool drain(std::chrono::milliseconds wait) override;
  // The decode MoE layers whose phase-1 copies rode with phase 1's gate/up in this process
  // (the tests ask whether a run took that path).
  static int64_t decode_copies_beside();
  // Decode MoE layers (process-wide, for tests) whose plan settled phase 2 with phase 1:
  // nothing left to land or decide, phase 2's list published before resident_ready.
  static int64_t decode_settled_at_plan();
  // Decode MoE layers (process-wide, for tests) whose experts the device took from the slot
  // map without the host (the hits on the device).
  static int64_t decode_hits_on_device();
  // Decode MoE layers (process-wide, for tests) computed with one down + combine after phase 2
  // (every layer but those of pairs run as rows of their own).
  static int64_t decode_one_down();
  int32_t n_slots() const override;
  uint64_t slot_bytes() const override;
  DType kind() const override;
  const StreamerOptions& options() const override;
  const Residency& residency() const override;

  // Every routing decision the device made, called on the service thread (RoutingEvent::layer
  // is the model layer; first_position is -1: the streamer does not know positions).
  void set_routing_observer(RoutingObserver observer);

  struct Impl;  // streamer_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

// The CUDA streamer on `backend`, or null when it is not a CUDA backend (make_streamer in
// experts/streaming_provider.h picks the streamer for a backend).
std::shared_ptr<StreamingProvider> make_cuda_streamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k,
                                                      Backend& backend, const StreamerOptions& opt);

}  // namespace sluice
