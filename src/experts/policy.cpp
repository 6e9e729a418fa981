// The eviction policies. Each keeps a small per-slot or per-key table; ranks are computed on
// demand, so a victim search is one scan over the evictable slots (residency.cpp).
#include "experts/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace sluice {
namespace {

constexpr PolicyKind kOnline[] = {PolicyKind::lru, PolicyKind::lfu, PolicyKind::lrfu, PolicyKind::fifo,
                                  PolicyKind::markov};

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

// markov: per layer, the chance that expert e is used at the layer's next step,
//   p(e) = w * mean over a in S of (C[a][e] + f(e)) / (N[a] + 1) + (1 - w) * f(e)
// where S is the layer's latest step (the current one while it acquires), C[a][e] counts the
// steps that used e right after a step that used a, N[a] the steps after one that used a,
// and f(e) the share of the layer's recent steps that used e (each step's weight halves every
// `half_life` steps). The one pseudo-count in the table backs off to f where a has few
// successors yet. A predicted key of the next layer is worth at least the predictions'
// precision so far (confirmed / predicted, with one prior hit and one miss).
// In a pool shared by the layers, the chance becomes an expected time to the next use, so
// that a key whose layer comes next is worth more than an equally likely one a token away.
//
// Memory: n_layers x n_expert^2 counts (128 experts x 48 layers: 3 MiB), per-record
// doubles, per-slot times.
class MarkovPolicy : public EvictionPolicy {
 public:
  MarkovPolicy(const PolicyOptions& opt)
      : n_kinds_(opt.n_kinds),
        n_expert_(opt.n_expert > 0 ? opt.n_expert : opt.n_keys / opt.n_kinds),
        n_layers_((opt.n_keys / opt.n_kinds + n_expert_ - 1) / n_expert_),
        decay_(std::exp2(-1.0 / (opt.markov_half_life_steps > 0
                                     ? opt.markov_half_life_steps
                                     : markov_half_life_for(static_cast<double>(opt.n_slots) / static_cast<double>(n_layers_),
                                                            opt.step_experts, n_expert_)))),
        weight_(opt.markov_weight),
        layers_(static_cast<size_t>(n_layers_)),
        freq_(static_cast<size_t>(n_layers_ * n_expert_), 0.0),
        freq_step_(freq_.size(), 0),
        last_(opt.n_slots, 0) {
    for (Layer& l : layers_) {
      l.follow.assign(static_cast<size_t>(n_expert_ * n_expert_), 0);
      l.seen.assign(static_cast<size_t>(n_expert_), 0);
    }
  }
  PolicyKind kind() const override { return PolicyKind::markov; }
  void on_fill(int32_t slot, int64_t, uint64_t now) override { last_[slot] = now; }
  void on_hit(int32_t slot, int64_t, uint64_t now) override { last_[slot] = now; }

  void on_step(std::span<const int64_t> records) override {
    if (records.empty()) return;
    const int64_t layer = records[0] / n_expert_;
    if (layer < 0 || layer >= n_layers_) return;
    current_ = layer;
    Layer& l = layers_[static_cast<size_t>(layer)];
    l.chance_valid = false;
    if (!l.predicted.empty()) {
      // The predictions' track record: how many of the predicted experts this step used.
      for (int32_t e : l.predicted)
        for (int64_t r : records) l.confirmed += r % n_expert_ == e;
      l.predictions += l.predicted.size();
      l.predicted.clear();
    }
    for (int32_t a : l.latest) {
      ++l.seen[a];
      for (int64_t r : records)
        if (r / n_expert_ == layer) ++l.follow[a * n_expert_ + r % n_expert_];
    }
    ++l.steps;
    l.step_weight = l.step_weight * decay_ + 1;
    l.latest.clear();
    for (int64_t r : records) {
      if (r / n_expert_ != layer) continue;  // a step is one layer's; ignore strays
      const auto e = static_cast<int32_t>(r % n_expert_);
      const size_t i = static_cast<size_t>(layer * n_expert_ + e);
      freq_[i] = decayed(i, l) + 1;
      freq_step_[i] = l.steps;
      l.latest.push_back(e);
    }
  }

  void on_predict(std::span<const int64_t> records) override {
    for (int64_t r : records) {
      const int64_t layer = r / n_expert_;
      if (layer < 0 || layer >= n_layers_) continue;
      Layer& l = layers_[static_cast<size_t>(layer)];
      l.predicted.push_back(static_cast<int32_t>(r % n_expert_));
      l.chance_valid = false;
    }
  }

  EvictionRank rank(int32_t slot, int64_t key, uint64_t) const override {
    const auto record = static_cast<uint32_t>(key) / static_cast<uint32_t>(n_kinds_);
    const auto layer = static_cast<int64_t>(record / static_cast<uint32_t>(n_expert_));
    const auto e = static_cast<int32_t>(record % static_cast<uint32_t>(n_expert_));
    const Layer& l = layers_[static_cast<size_t>(layer)];
    if (!l.chance_valid) refresh_chance(layer, l);
    const double p = l.chance[static_cast<size_t>(e)];
    if (p <= 0) return {-std::numeric_limits<double>::infinity(), last_[slot]};
    // A pool with room for fewer than two steps of every layer: a slot taken from another
    // layer only moves a miss there (that layer has no slack either), so the acquiring
    // layer's own keys outside its step go first, least likely first (what lru does in such
    // a pool; the step's own keys, evictable only without step pins, rank as below). Measured
    // on the Mixtral trace: 64 shared slots .385 -> .397 (lru .397), 96 .524 -> .530; from 128
    // (two steps a layer) the rule below is ahead (.643 against .639).
    if (layer == current_) {
      const auto step = static_cast<int64_t>(std::max<size_t>(1, l.latest.size()));
      // Below every other key's -(expected time), which exceeds -1e15 for any p above 1e-12.
      if (static_cast<int64_t>(last_.size()) < 2 * step * n_layers_ &&
          std::find(l.latest.begin(), l.latest.end(), e) == l.latest.end())
        return {-1e15 * (2.0 - p), last_[slot]};
    }
    // The expected time to the next use, in layer steps: the key's layer comes round in
    // `ahead` steps, then each pass uses it with chance p (a geometric number of passes of
    // n_layers steps, l.passes[e]). The furthest goes first; with one layer this orders by p alone.
    const int64_t ahead = current_ < 0 ? n_layers_ : layer > current_ ? layer - current_ : layer - current_ + n_layers_;
    const double next_use = static_cast<double>(ahead) + l.passes[static_cast<size_t>(e)];
    return {-next_use, last_[slot]};
  }

 private:
  struct Layer {
    std::vector<uint32_t> follow;   // [n_expert, n_expert] steps using e right after one using a
    std::vector<uint32_t> seen;     // [n_expert] steps that followed a step using a
    std::vector<int32_t> latest;    // experts of the layer's latest step
    std::vector<int32_t> predicted; // lookahead's experts for the layer's coming step
    uint64_t steps = 0, predictions = 0, confirmed = 0;
    double step_weight = 0;         // sum of the decayed weights of the layer's steps
    // p(e) of every expert, computed at the first rank after the layer's state changed
    // (on_step, on_predict): a victim search ranks every slot, so without it each rank
    // cost O(top-k) and a pow (14 us an eviction at 614 slots, against lru's 1.5).
    mutable std::vector<double> chance;
    // n_layers (1 - p) / p of every expert, computed with chance: the steps of the passes
    // before the expected use, which a victim search adds to each slot's `ahead` (a division
    // a slot, 153 slots a miss, was most of the search).
    mutable std::vector<double> passes;
    mutable std::vector<double> share, sum;  // chance's scratch: f(e), and the sums over S
    mutable bool chance_valid = false;
  };
  // The layer's p(e), e in [0, n_expert) (the formula above the class), into l.chance, and
  // l.passes. Out of line: rank, called for every slot of a victim search, stays small.
  [[gnu::noinline]] void refresh_chance(int64_t layer, const Layer& l) const {
    const auto n = static_cast<size_t>(n_expert_);
    l.chance.resize(n);
    l.share.resize(n);
    l.sum.assign(n, 0.0);
    const double precision = (l.confirmed + 1.0) / (static_cast<double>(l.predictions) + 2.0);
    for (size_t e = 0; e < n; ++e)
      l.share[e] = l.step_weight > 0 ? decayed(static_cast<size_t>(layer) * n + e, l) / l.step_weight : 0.0;
    // Row by row of the follow table (contiguous, so the divisions vectorize); each expert's
    // sum still adds the latest experts' terms in their order: the same bits as a loop per e.
    for (int32_t a : l.latest) {
      const uint32_t* follow = l.follow.data() + static_cast<size_t>(a) * n;
      const double seen = static_cast<double>(l.seen[a]) + 1;
      for (size_t e = 0; e < n; ++e) l.sum[e] += (static_cast<double>(follow[e]) + l.share[e]) / seen;
    }
    const auto latest = static_cast<double>(l.latest.size());
    for (size_t e = 0; e < n; ++e) {
      const double f = l.share[e];
      const double next = l.latest.empty() ? f : l.sum[e] / latest;
      l.chance[e] = weight_ * next + (1 - weight_) * f;
    }
    for (int32_t pe : l.predicted)
      l.chance[static_cast<size_t>(pe)] = std::max(l.chance[static_cast<size_t>(pe)], precision);
    l.passes.resize(n);
    for (size_t e = 0; e < n; ++e) {
      const double p = l.chance[e];
      l.passes[e] = p > 0 ? static_cast<double>(n_layers_) * (1 - p) / p : 0.0;
    }
    l.chance_valid = true;
  }
  // The record's frequency brought to the layer's current step: decay^(steps since), from
  // the table below when it holds that power (the same pow, computed once: the same bits).
  double decayed(size_t i, const Layer& l) const {
    const uint64_t since = l.steps - freq_step_[i];
    const double factor = since < decay_powers_.size() ? decay_powers_[since]
                                                       : std::pow(decay_, static_cast<double>(since));
    return freq_[i] * factor;
  }
  // decay^n for n < kDecayPowers: refresh_chance brings every expert of a layer to its current step
  // at each victim search after the layer's step, and a pow each took ~7% of `sluice simulate`.
  static constexpr size_t kDecayPowers = 1024;
  static std::vector<double> powers_of(double decay) {
    std::vector<double> p(kDecayPowers);
    for (size_t n = 0; n < p.size(); ++n) p[n] = std::pow(decay, static_cast<double>(n));
    return p;
  }

  int32_t n_kinds_;
  int64_t n_expert_, n_layers_;
  int64_t current_ = -1;              // the layer of the latest step
  double decay_, weight_;
  std::vector<double> decay_powers_ = powers_of(decay_);  // [kDecayPowers] decay_^n
  std::vector<Layer> layers_;         // [n_layers]
  std::vector<double> freq_;          // [n_records] decayed use count at freq_step_
  std::vector<uint64_t> freq_step_;   // [n_records] the layer's step count at the last update
  std::vector<uint64_t> last_;        // [n_slots] time of the last access (ties: lru)
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
    case PolicyKind::markov: return "markov";
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

std::string_view policy_names_text() { return "lru, lfu, lrfu, fifo, markov, belady"; }

double markov_half_life_for(double slots_per_layer, int64_t step_experts, int64_t n_expert) {
  if (step_experts <= 0 || n_expert <= 0) return 8;
  const double steps_held = slots_per_layer / static_cast<double>(step_experts);
  if (steps_held >= 3) return 24;
  return slots_per_layer <= 0.25 * static_cast<double>(n_expert) ? 4 : 8;
}

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
    case PolicyKind::markov: {
      SLUICE_CHECK(opt.markov_half_life_steps >= 0, Status::invalid_argument,
                   "markov: the half-life must be positive (or 0: by the cache's shape)");
      SLUICE_CHECK(opt.markov_weight >= 0 && opt.markov_weight <= 1, Status::invalid_argument,
                   "markov: the transition weight must be in [0, 1]");
      SLUICE_CHECK(opt.n_kinds > 0 && opt.n_keys % opt.n_kinds == 0, Status::internal,
                   "markov: keys are not records x kinds");
      SLUICE_CHECK(opt.n_keys <= std::numeric_limits<uint32_t>::max(), Status::invalid_argument,
                   "markov: more than 2^32 cache keys");  // rank divides them as u32
      return std::make_unique<MarkovPolicy>(opt);
    }
    case PolicyKind::belady:
      SLUICE_CHECK(static_cast<bool>(opt.next_use), Status::invalid_argument,
                   "the belady policy is offline: it needs the future of a trace (sluice simulate)");
      return std::make_unique<BeladyPolicy>(opt.next_use);
  }
  fail(Status::internal, "unknown policy");
}

}  // namespace sluice
