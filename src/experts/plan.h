// Planning shared by the providers that stream experts (DESIGN.md, "The streamed decode
// step", steps 1-3): the CPU streamer (experts/streamer.h) and the CUDA streamer
// (backends/cuda/cuda_streamer.h) both size the cache, form a step's union strongest first,
// split a batch into row groups whose union fits the cache, order lookahead's predictions and
// count what acquire answered, through these functions. They know nothing about memory, IO
// or compute.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "experts/residency.h"
#include "experts/stats.h"
#include "experts/streamer_options.h"
#include "format/pack.h"

namespace sluice {

// Checks the options that do not depend on memory (top-k range, --miss-kind against the
// pack, --cut range); throws invalid_argument naming the option.
void check_streaming_options(const Pack& pack, ExpertKind kind, int64_t top_k, const StreamerOptions& opt);

// The slot size for these kinds of this pack: the largest record stride.
uint64_t streaming_slot_bytes(const Pack& pack, ExpertKind kind, std::optional<ExpertKind> miss_kind);

struct CacheLayout {
  int32_t n_slots = 0;
  int32_t speculative_slots = 0;  // lookahead's share (0 without lookahead)
  int32_t host_slots = 0;         // records the host-RAM tier holds (0: no tier)
};
// Slots from --expert-slots, else as many whole slots as --expert-cache holds; capped at the
// records of the kinds in use; fewer than top_k is an invalid_argument error that states the
// minimum (as slots and as bytes). The speculative share is a quarter of the cache (at least
// one slot) and always leaves top_k slots beside it.
CacheLayout plan_cache_layout(const Pack& pack, int64_t top_k, uint64_t slot_bytes, const StreamerOptions& opt);

// One distinct expert of a step (the rows [row0, row1) of a MoE layer call).
struct StepExpert {
  int32_t expert = 0;
  int64_t record = 0;           // moe_layer * n_expert + expert
  float best = 0;               // its largest routing weight in the group
  std::vector<int32_t> pairs;   // pair indices (row * k + rank), ascending
};
// The union of the experts of rows [row0, row1), strongest routing weight first (ties: first
// seen). ids/weights [rows * k], as Routing.
std::vector<StepExpert> step_union(std::span<const int32_t> ids, std::span<const float> weights, int64_t k,
                                   int64_t row0, int64_t row1, int64_t moe_layer, int64_t n_expert);

// The end of the row group starting at row0: consecutive rows whose union of experts fits
// n_slots (at least one row).
int64_t row_group_end(std::span<const int32_t> ids, int64_t k, int64_t row0, int64_t n_rows, int64_t n_slots,
                      int64_t n_expert);

// Lookahead: the predicted experts of the next layer (ids/weights of the prediction's top-k
// over its rows), each once with its best weight, strongest first.
std::vector<std::pair<float, int32_t>> predicted_union(std::span<const int32_t> ids, std::span<const float> weights,
                                                       int64_t n_expert);

// Counts a demand acquire of a step's expert into the layer's statistics: hit (resident or
// pending), or miss with its bytes (stride of the kind read).
void count_demand_acquire(LayerStats& ls, const AcquireResult& a, uint64_t stride);

}  // namespace sluice
