// Device-side MoE dispatch (DESIGN.md, "The streamed decode step", steps 1, 5 and 7): the
// router's top-k on the device, the routed experts of a batch read through a table of
// expert weight references, and the combine in routing-rank order. The same kernels serve the
// fully resident path (a static table: expert e -> its resident weights) and the streaming
// path (a table the host service thread publishes per layer: expert -> device slot, entries
// of experts not yet landed marked unavailable; two calls, phase 1 then phase 2).
// Plain C++ declarations like kernels.h: pointers are device memory (or host-mapped memory
// where said), sizes in elements, everything enqueued on `s`. Defined in moe_router.cu (the
// top-k, the scaled inputs), moe_kernels.cu (the per-pair experts and the combines) and
// moe_grouped.cu (the grouped prefill experts).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"

namespace sluice {
struct ExpertMath;           // core/expert_weights.h
class RoutingReplayTable;    // backends/backend.h
enum class RouterScoring;    // core/router_scoring.h
}

namespace sluice::cuda {

// What an expert computes from its gate and up products (ExpertMath's activations the kernels
// take; activations.cuh): silu(g) * u, gpt-oss's clamped SwiGLU, or Gemma 4's gelu_tanh(g) * u.
enum class ExpertAct : int32_t { swiglu = 0, swiglu_clamped = 1, geglu_tanh = 2 };
// The kernels' code for math's activation (host code; defined in cuda_moe.cpp).
ExpertAct expert_act_of(const ExpertMath& math);

// One routed expert's three projections in device memory, with its biases and activation.
// Quantized rows are quant_row_bytes(cols) long with quant_scale_row_bytes(cols) of scales
// per row (core/quant.h), dense rows cols elements. A default entry (no biases, SwiGLU)
// computes what the kernels computed before biases existed, bit for bit.
struct ExpertRef {
  const void* data[3] = {nullptr, nullptr, nullptr};    // gate [n_ff, n_embd], up [n_ff, n_embd], down [n_embd, n_ff]
  const void* scales[3] = {nullptr, nullptr, nullptr};  // quantized kinds only
  const float* bias[3] = {nullptr, nullptr, nullptr};   // f32 gate [n_ff], up [n_ff], down [n_embd], or null: none
  WType wtype = WType::unavailable;                   // unavailable: not (yet) in device memory, the pairs are skipped
  ExpertAct act = ExpertAct::swiglu;
  float alpha = 0.0f, limit = 0.0f;                   // swiglu_clamped: the sigmoid's gain and the clamp
};
static_assert(sizeof(ExpertRef) == 88, "ExpertRef is a small POD");

struct MoeShape {
  int64_t n_rows = 0;    // rows of the batch (tokens)
  int64_t k = 0;         // experts per row (top-k)
  int64_t n_embd = 0;    // model width: h and out columns
  int64_t n_ff = 0;      // expert width
  int64_t n_expert = 0;  // table entries
  // The weight type every available expert has, or WType::unavailable when
  // they may differ: the per-pair kernels are then compiled for that type alone (fewer
  // registers, more warps resident) instead of switching on each expert's type.
  WType wtype = WType::unavailable;
};

// One copy: bytes (a multiple of 16) from src (host memory mapped into the device's address
// space, 16-byte aligned) to dst (device memory, 16-byte aligned).
struct CopyDesc {
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t bytes = 0;
};

// Copies that ride along with the gate/up launch of launch_moe_experts (the CUDA streamer's
// records landed by the plan, whose experts a later phase computes): descs[0 .. *count), both
// in device memory, written before the launch's stream position. Its first blocks copy while
// the others compute (the decode kernel), so the copies take no launch of their own and
// overlap the gate/up product; shapes the decode kernel does not take copy with the copy
// kernel (expert_copy.h) on the stream first.
struct CopyList {
  const CopyDesc* descs = nullptr;
  const uint32_t* count = nullptr;
};

// ids[n, k] (i32) and weights[n, k] (f32) = transformers' routing of logits[n, n_expert]:
// f32 softmax over all experts, the k largest probabilities strongest first (equal values:
// the lower expert id first), renormalized to sum 1 when norm_topk, then (expert_scale not
// null: [n_expert] f32, Gemma 4's per_expert_scale) each weight times its expert's scale, one
// rounding. Matches route_topk (models/blocks.h) and the model's scaling on the CPU.
// A second place for a router's ids and weights [n, k] (the CUDA streamer's host-mapped
// handshake memory, as device pointers): the top-k kernels store each row there too once it
// is final, so the host reads the routing without a copy on the stream. Null: none.
struct RoutingCopy {
  int32_t* ids = nullptr;
  float* weights = nullptr;
};

void launch_router_topk(const float* logits, int64_t n, int64_t n_expert, int64_t k, bool norm_topk, int32_t* ids,
                        float* weights, Stream s, const float* expert_scale = nullptr, RoutingCopy copy = {});

// route_topk's sigmoid scoring (Llama 4): ids[n, k] = the k largest logits of each row (equal
// logits: the lower expert id first), weights[n, k] = sigmoid of each, 1 / (1 + e^-l).
void launch_router_topk_sigmoid(const float* logits, int64_t n, int64_t n_expert, int64_t k, int32_t* ids,
                                float* weights, Stream s, RoutingCopy copy = {});

// The device top-k of `scoring` (route_topk's): launch_router_topk (softmax; norm_topk and
// expert_scale apply), launch_router_topk_sigmoid, or launch_router_group_topk
// (sigmoid_grouped, with `group`: router_group_topk.h). Host code; defined in cuda_moe.cpp.
struct RouterGroupParams;
void launch_router(RouterScoring scoring, const float* logits, int64_t n, int64_t n_expert, int64_t k, bool norm_topk,
                   int32_t* ids, float* weights, Stream s, const float* expert_scale = nullptr,
                   RoutingCopy copy = {}, const RouterGroupParams* group = nullptr);

// Whether launch_router routes `scoring` over n_expert experts, k a token (n_group groups for
// sigmoid_grouped) on the device: softmax always; sigmoid up to 512 experts and 32 a token;
// group-limited sigmoid as router_group_topk_supported says. The resident expert table and the
// streamer ask the same question, so a model routes its experts in one place whether they are
// resident or streamed (the same weights bit for bit). Defined in cuda_moe.cpp.
bool router_fits_device(RouterScoring scoring, int64_t n_expert, int64_t k, int64_t n_group);

// A replayed routing on the device (--replay-routing; experts/routing_replay.h): one MoE
// layer's slice of a replay table, rows of k in token order.
struct ReplaySource {
  const int32_t* ids = nullptr;      // [n_tokens, k]
  const float* weights = nullptr;    // [n_tokens, k], or null: k - rank (the order of a prediction)
  int64_t n_tokens = 0;
  int64_t k = 0;
};
// What launch_router stores, from a replay instead of logits: ids[r, j] = src.ids[(first + r)
// mod n_tokens, j] for the n rows, the weights renormalized to sum 1 a row when `normalize`,
// then times expert_scale[id] (not null: [n_expert] f32, Gemma 4's); copied to `copy` as the
// top-k kernels do. An id of -1 (a prediction the trace lacks) is stored as it is.
// Layer `layer`'s slice of a replay table of the CUDA backend (CudaBackend::
// make_routing_replay), or of its predictions (which it must have); host code, cuda_moe.cpp.
ReplaySource replay_source(const RoutingReplayTable& table, int64_t layer, bool of_predictions);
void launch_router_replay(const ReplaySource& src, int64_t first, int64_t n, bool normalize, int32_t* ids,
                          float* weights, Stream s, const float* expert_scale = nullptr, RoutingCopy copy = {});

// The experts' inputs when the routing weights scale them (Llama 4, ExpertMath::scale_input):
// x[p, :] = h[p / k, :] * weights[p] for the n_rows * k pairs, one rounding an element as
// expert_pairs_forward's mul. The expert kernels then take x's rows as rows of their own
// (pairs_as_rows) and the combine sums the pairs with weights of 1 (null weights).
void launch_scale_pair_inputs(const float* h, const float* weights, float* x, int64_t n_rows, int64_t k,
                              int64_t n_embd, Stream s);
// The shape of a call's n_rows * k pairs run as top-1 rows of their own.
inline MoeShape pairs_as_rows(MoeShape shape) {
  shape.n_rows *= shape.k;
  shape.k = 1;
  return shape;
}

// One dispatch phase. For every pair p = row * k + rank in [0, n_rows * k) with done[p] == 0
// whose expert's entry table[ids[p]] is available:
//   pair_out[p, :] = down(silu(gate(h[row])) * up(h[row]))   [n_embd] f32
//   done[p] = 1
// Pairs whose expert is unavailable are left alone for a later phase (or, when never
// computed, count as zero in the combine: a cut). table may be host-mapped memory the host
// wrote before the stream reached this launch. act: scratch [n_rows * k, n_ff] f32.
// A pair's result depends only on its row and its expert's weights (not on the batch, the
// phase or which other pairs ran), so resident and streamed runs agree bit for bit.
// mark false: done is left as it is (one launch fewer: the CUDA streamer's phase-2 handshake
// kernel marks the pairs phase 1 computed, and its combine counts the pairs by the table).
void launch_moe_experts(const float* h, const int32_t* ids, const ExpertRef* table, uint8_t* done, float* act,
                        float* pair_out, const MoeShape& shape, Stream s, bool mark = true,
                        const CopyList& copies = {});

// out[row, :] = sum over rank r = 0..k-1 of weights[p] * (done[p] ? pair_out[p, :] : 0),
// p = row * k + r, accumulated in rank order (Backend::moe_combine with cut pairs as zero);
// weights null: 1 (as launch_moe_combine). done null: a pair counts when its expert's entry
// table[ids[p]] is available (the last phase's table, which holds every computed pair's).
void launch_moe_combine_done(const float* pair_out, const float* weights, const uint8_t* done, float* out,
                             const MoeShape& shape, Stream s, const int32_t* ids = nullptr,
                             const ExpertRef* table = nullptr);

// launch_moe_experts in its two steps, for the CUDA streamer's decode phases: the gate/up
// step of every pair with done[p] == 0 whose expert's entry is available (act[p], done left as
// it is; copies ride with it as there), then, once for the call after its last phase, every
// pair's down product whose entry table[ids[p]] (the last phase's table, which holds every
// computed pair's) is available, combined in rank order with the others counted as zero (cut).
// out equals launch_moe_experts per phase followed by launch_moe_combine_done(ids, table) bit
// for bit (the fused decode kernel of launch_moe_experts_combine where it takes the shape;
// otherwise the per-pair down into pair_out, then the combine).
void launch_moe_gate_up(const float* h, const int32_t* ids, const ExpertRef* table, const uint8_t* done, float* act,
                        const MoeShape& shape, Stream s, const CopyList& copies = {});
void launch_moe_down_combine_table(const int32_t* ids, const float* weights, const ExpertRef* table, const float* act,
                                   float* pair_out, float* out, const MoeShape& shape, Stream s);

// The fully resident case in two launches (every table entry available, no done flags):
// act as launch_moe_experts' first step, then out[row, :] = sum over ranks r in order of
// weights[p] * down(act[p]) with p = row * k + r, each pair's down product computed exactly as
// launch_moe_experts computes pair_out, so out equals launch_moe_experts followed by
// launch_moe_combine_done with every pair done, bit for bit.
void launch_moe_experts_combine(const float* h, const int32_t* ids, const float* weights, const ExpertRef* table,
                                float* act, float* out, const MoeShape& shape, Stream s);

// Prefill (many pairs per expert): the same as launch_moe_experts_combine, with the pairs
// grouped by expert on the device and each expert's weights read once per tile of pairs
// instead of once per pair. Every table entry the pairs use must be available and of type
// shape.wtype (the others are not read). A pair's sums do not depend on the other pairs of
// its tile or on n_rows, but they are ordered differently from launch_moe_experts'.
//
// The grouped kernels pay off once experts average this many pairs (a tile reads the expert
// once; the per-pair kernels read it once per pair): the resident path and the streamer's
// grouped prefill both take them from n_rows * k >= kMoeGroupedPairsPerExpert * n_expert.
constexpr int64_t kMoeGroupedPairsPerExpert = 4;
int64_t moe_grouped_scratch_bytes(const MoeShape& shape);
struct MoeGroupedParams {
  const float* h = nullptr;          // [n_rows, n_embd]
  const int32_t* ids = nullptr;      // [n_rows * k]
  const float* weights = nullptr;    // [n_rows * k], or null: 1 (launch_moe_combine)
  const ExpertRef* table = nullptr;  // [n_expert]: the entries of ids available, of type shape.wtype
  void* group = nullptr;             // scratch: moe_grouped_scratch_bytes(shape) bytes
  float* act = nullptr;              // scratch: [n_rows * k, n_ff] f32
  float* pair_out = nullptr;         // scratch: [n_rows * k, n_embd] f32
  float* out = nullptr;              // [n_rows, n_embd]
  MoeShape shape;
};
void launch_moe_experts_grouped(const MoeGroupedParams& p, Stream s);
// launch_moe_experts_grouped in its three steps, for a streamed prefill that computes the
// experts of one group of rows in waves as their records land (experts/cuda/grouped.cpp):
//   prepare: the pairs grouped by expert and the tiles listed (from p.ids alone), and h's
//            split parts for the tensor cores; once;
//   experts: every tile whose expert's entry in p.table is available (the others are
//            skipped): pair_out (and act) of those pairs; any number of times, each pair's
//            expert available in exactly one of the calls' tables;
//   combine: out from every pair's pair_out, in rank order; once, after the last wave.
// A pair's sums depend only on its row, its expert and the tile layout of prepare (not on
// the wave), so the result equals launch_moe_experts_grouped's bit for bit.
void launch_moe_grouped_prepare(const MoeGroupedParams& p, Stream s);
void launch_moe_grouped_experts(const MoeGroupedParams& p, Stream s);
void launch_moe_grouped_combine(const MoeGroupedParams& p, Stream s);

}  // namespace sluice::cuda
