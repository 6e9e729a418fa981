// The planning shared by the streaming providers: options, cache layout, step unions, row
// groups, predictions, acquire counting.
#include "experts/plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"

namespace sluice {

void check_streaming_options(const Pack& pack, ExpertKind kind, int64_t top_k, const StreamerOptions& opt) {
  const PackManifest& m = pack.manifest();
  pack.kind(kind);  // an error naming the kinds the pack has
  SLUICE_CHECK(opt.enabled(), Status::invalid_argument, "expert streaming needs --expert-cache SIZE or --expert-slots N");
  SLUICE_CHECK(top_k >= 1 && top_k <= m.n_expert, Status::invalid_argument, "expert streaming: top-k ", top_k,
               " is outside [1, ", m.n_expert, "] experts per layer");
  if (opt.miss_kind) {
    pack.kind(*opt.miss_kind);
    SLUICE_CHECK(*opt.miss_kind != kind, Status::invalid_argument, "--miss-kind ", expert_kind_name(*opt.miss_kind),
                 " is the kind the run already uses (pick a lower-bit kind the pack holds, such as q2)");
  }
  SLUICE_CHECK(opt.cut >= 0 && opt.cut <= 1, Status::invalid_argument, "--cut ", opt.cut,
               " is outside [0, 1] (a routing weight; 0 turns the deadline off)");
}

uint64_t streaming_slot_bytes(const Pack& pack, ExpertKind kind, std::optional<ExpertKind> miss_kind) {
  uint64_t b = pack.kind(kind).record_stride;
  if (miss_kind) b = std::max(b, pack.kind(*miss_kind).record_stride);
  return b;
}

CacheLayout plan_cache_layout(const Pack& pack, int64_t top_k, uint64_t slot_bytes, const StreamerOptions& opt) {
  const PackManifest& m = pack.manifest();
  const int64_t min = top_k;
  int64_t n_slots = opt.slots > 0 ? opt.slots : static_cast<int64_t>(opt.cache_bytes / slot_bytes);
  if (n_slots < min) {
    const std::string asked = opt.slots > 0 ? str(opt.slots, opt.slots == 1 ? " slot" : " slots")
                                            : str(byte_size_text(opt.cache_bytes), " (", n_slots, " slots of ",
                                                  byte_size_text(slot_bytes), ")");
    fail(Status::invalid_argument, "expert cache too small: ", asked, "; the model routes each token to ", top_k,
         " experts, so the minimum is ", min, " slots (--expert-slots ", min, " or --expert-cache ",
         byte_size_text(static_cast<uint64_t>(min) * slot_bytes), ")");
  }
  // More slots than records of the kinds in use cannot be filled.
  const int64_t n_useful = m.n_records() * (opt.miss_kind ? 2 : 1);
  if (n_slots > n_useful) {
    LOG_INFO("expert cache: ", n_slots, " slots asked for, the pack has ", n_useful, " records to cache; using ", n_useful);
    n_slots = n_useful;
  }
  SLUICE_CHECK(n_slots <= (int64_t{1} << 30), Status::invalid_argument, "expert cache: ", n_slots, " slots is too many");
  CacheLayout c;
  c.n_slots = static_cast<int32_t>(n_slots);
  c.speculative_slots =
      opt.lookahead ? static_cast<int32_t>(std::clamp<int64_t>(n_slots / 4, 1, std::max<int64_t>(n_slots - top_k, 0)))
                    : 0;
  if (c.speculative_slots < 0 || n_slots - top_k <= 0) c.speculative_slots = 0;
  if (opt.host_cache_bytes > 0) {
    const uint64_t n_host = std::min<uint64_t>(opt.host_cache_bytes / slot_bytes, static_cast<uint64_t>(n_useful));
    SLUICE_CHECK(n_host >= 1, Status::invalid_argument, "--host-cache ", byte_size_text(opt.host_cache_bytes),
                 " holds no record (one takes ", byte_size_text(slot_bytes), ")");
    c.host_slots = static_cast<int32_t>(n_host);
  }
  return c;
}

std::vector<StepExpert> step_union(std::span<const int32_t> ids, std::span<const float> weights, int64_t k,
                                   int64_t row0, int64_t row1, int64_t moe_layer, int64_t n_expert) {
  std::vector<StepExpert> out;
  std::vector<int32_t> index(static_cast<size_t>(n_expert), -1);
  for (int64_t p = row0 * k; p < row1 * k; ++p) {
    const int32_t e = ids[static_cast<size_t>(p)];
    const float w = weights[static_cast<size_t>(p)];
    SLUICE_CHECK(e >= 0 && e < n_expert, Status::internal, "expert streaming: routed expert ", e, " outside [0, ",
                 n_expert, ")");
    int32_t& i = index[static_cast<size_t>(e)];
    if (i < 0) {
      i = static_cast<int32_t>(out.size());
      StepExpert s;
      s.expert = e;
      s.record = moe_layer * n_expert + e;
      s.best = w;
      out.push_back(std::move(s));
    }
    StepExpert& se = out[static_cast<size_t>(i)];
    se.pairs.push_back(static_cast<int32_t>(p));
    se.best = std::max(se.best, w);
  }
  std::stable_sort(out.begin(), out.end(), [](const StepExpert& a, const StepExpert& b) { return a.best > b.best; });
  return out;
}

int64_t row_group_end(std::span<const int32_t> ids, int64_t k, int64_t row0, int64_t n_rows, int64_t n_slots,
                      int64_t n_expert) {
  std::vector<uint8_t> seen(static_cast<size_t>(n_expert), 0);
  int64_t distinct = 0, row1 = row0;
  while (row1 < n_rows) {
    int64_t added = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[static_cast<size_t>(row1 * k + j)];
      if (!seen[static_cast<size_t>(e)]) {
        bool dup = false;
        for (int64_t i = 0; i < j; ++i) dup |= ids[static_cast<size_t>(row1 * k + i)] == e;
        added += dup ? 0 : 1;
      }
    }
    if (row1 > row0 && distinct + added > n_slots) break;
    for (int64_t j = 0; j < k; ++j) seen[static_cast<size_t>(ids[static_cast<size_t>(row1 * k + j)])] = 1;
    distinct += added;
    ++row1;
  }
  return row1;
}

std::vector<std::pair<float, int32_t>> predicted_union(std::span<const int32_t> ids, std::span<const float> weights,
                                                       int64_t n_expert) {
  std::vector<std::pair<float, int32_t>> order;
  std::vector<int32_t> index(static_cast<size_t>(n_expert), -1);
  for (size_t p = 0; p < ids.size(); ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= n_expert) continue;
    int32_t& i = index[static_cast<size_t>(e)];
    if (i < 0) {
      i = static_cast<int32_t>(order.size());
      order.emplace_back(weights[p], e);
    }
    order[static_cast<size_t>(i)].first = std::max(order[static_cast<size_t>(i)].first, weights[p]);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return order;
}

void count_demand_acquire(LayerStats& ls, const AcquireResult& a, uint64_t stride) {
  if (a.confirmed_prefetch) ++ls.prefetch_hits;
  if (a.status == AcquireStatus::hit || a.status == AcquireStatus::pending) {
    ++ls.hits;
    if (a.status == AcquireStatus::pending) ++ls.pending_hits;
  } else {
    ++ls.misses;
    ls.bytes_demand += stride;
  }
}

}  // namespace sluice
