// The eviction policies. Each keeps a small per-slot or per-key table; ranks are computed on
// demand, so a victim search is one scan over the evictable slots (residency.cpp).
#include "experts/policy.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace sluice {
namespace {

constexpr PolicyKind kOnline[] = {PolicyKind::lru, PolicyKind::lfu, PolicyKind::lrfu, PolicyKind::fifo};

// Per-slot time of the last access (lru) or of the fill (fifo).
class TimePolicy : public EvictionPolicy {
 public:
  TimePolicy(PolicyKind kind, int32_t n_slots) : kind_(kind), time_(n_slots, 0) {}
  PolicyKind kind() const override { return kind_; }
  void on_fill(int32_t slot, int64_t, uint64_t now) override { time_[slot] = now; }
  void on_hit(int32_t slot, int64_t, uint64_t now) override {
    if (kind_ == PolicyKind::lru) time_[slot] = now;
  }
  EvictionRank rank(int32_t slot, int64_t, uint64_t) const override { return {0.0, time_[slot]}; }

 private:
  PolicyKind kind_;
  std::vector<uint64_t> time_;
};

// Access counts over each key's whole history; ties go to the least recently used.
class LfuPolicy : public EvictionPolicy {
 public:
  LfuPolicy(int32_t n_slots, int64_t n_keys) : count_(n_keys, 0), last_(n_slots, 0) {}
  PolicyKind kind() const override { return PolicyKind::lfu; }
  void on_fill(int32_t slot, int64_t key, uint64_t now) override { on_hit(slot, key, now); }
  void on_hit(int32_t slot, int64_t key, uint64_t now) override {
    ++count_[key];
    last_[slot] = now;
  }
  EvictionRank rank(int32_t slot, int64_t key, uint64_t) const override {
    return {static_cast<double>(count_[key]), last_[slot]};
  }

 private:
  std::vector<uint64_t> count_;  // [n_keys]
  std::vector<uint64_t> last_;   // [n_slots]
};

// LRFU: crf(key, t) = sum over past accesses t_i of 2^(-(t - t_i) / half_life). Ranks are
// compared at a common time, so log2(crf(t_last)) + t_last / half_life orders the keys the
// same way without ever underflowing or overflowing.
class LrfuPolicy : public EvictionPolicy {
 public:
  LrfuPolicy(int32_t n_slots, int64_t n_keys, double half_life)
      : inv_half_life_(1.0 / half_life), crf_(n_keys, 0.0), last_key_(n_keys, 0), last_(n_slots, 0) {}
  PolicyKind kind() const override { return PolicyKind::lrfu; }
  void on_fill(int32_t slot, int64_t key, uint64_t now) override { on_hit(slot, key, now); }
  void on_hit(int32_t slot, int64_t key, uint64_t now) override {
    const double age = static_cast<double>(now - last_key_[key]);
    crf_[key] = 1.0 + crf_[key] * std::exp2(-age * inv_half_life_);
    last_key_[key] = now;
    last_[slot] = now;
  }
  EvictionRank rank(int32_t slot, int64_t key, uint64_t) const override {
    return {std::log2(crf_[key]) + static_cast<double>(last_key_[key]) * inv_half_life_, last_[slot]};
  }

 private:
  double inv_half_life_;          // 1 / accesses
  std::vector<double> crf_;       // [n_keys] at the key's last access
  std::vector<uint64_t> last_key_;  // [n_keys] time of the key's last access
  std::vector<uint64_t> last_;    // [n_slots]
};

// Belady's MIN: the key used furthest in the future goes first (never-again keys before all).
class BeladyPolicy : public EvictionPolicy {
 public:
  explicit BeladyPolicy(NextUseOracle next_use) : next_use_(std::move(next_use)) {}
  PolicyKind kind() const override { return PolicyKind::belady; }
  void on_fill(int32_t, int64_t, uint64_t) override {}
  void on_hit(int32_t, int64_t, uint64_t) override {}
  EvictionRank rank(int32_t slot, int64_t key, uint64_t) const override {
    const uint64_t next = next_use_(key);
    const double primary = next == std::numeric_limits<uint64_t>::max() ? -std::numeric_limits<double>::infinity()
                                                                         : -static_cast<double>(next);
    return {primary, static_cast<uint64_t>(slot)};
  }

 private:
  NextUseOracle next_use_;
};

}  // namespace

std::string_view policy_name(PolicyKind k) {
  switch (k) {
    case PolicyKind::lru: return "lru";
    case PolicyKind::lfu: return "lfu";
    case PolicyKind::lrfu: return "lrfu";
    case PolicyKind::fifo: return "fifo";
    case PolicyKind::belady: return "belady";
  }
  return "?";
}

std::optional<PolicyKind> policy_from_name(std::string_view s) {
  for (PolicyKind k : kOnline)
    if (policy_name(k) == s) return k;
  if (s == "belady") return PolicyKind::belady;
  return std::nullopt;
}

std::span<const PolicyKind> online_policies() { return kOnline; }

std::string_view policy_names_text() { return "lru, lfu, lrfu, fifo, belady"; }

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, const PolicyOptions& opt) {
  SLUICE_CHECK(opt.n_slots > 0, Status::invalid_argument, "expert cache: the policy needs at least one slot");
  SLUICE_CHECK(opt.n_keys > 0, Status::invalid_argument, "expert cache: the policy needs at least one key");
  switch (kind) {
    case PolicyKind::lru:
    case PolicyKind::fifo: return std::make_unique<TimePolicy>(kind, opt.n_slots);
    case PolicyKind::lfu: return std::make_unique<LfuPolicy>(opt.n_slots, opt.n_keys);
    case PolicyKind::lrfu: {
      SLUICE_CHECK(opt.lrfu_half_life_slots > 0, Status::invalid_argument, "lrfu: half-life must be positive");
      return std::make_unique<LrfuPolicy>(opt.n_slots, opt.n_keys, opt.lrfu_half_life_slots * opt.n_slots);
    }
    case PolicyKind::belady:
      SLUICE_CHECK(static_cast<bool>(opt.next_use), Status::invalid_argument,
                   "the belady policy is offline: it needs the future of a trace (sluice simulate)");
      return std::make_unique<BeladyPolicy>(opt.next_use);
  }
  fail(Status::internal, "unknown policy");
}

}  // namespace sluice
