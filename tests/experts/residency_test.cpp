// Residency and eviction policies: exact hit counts of each policy on handcrafted access
// sequences (worked out by hand in the comments), pins, loading slots, kinds, the
// speculative share, acquire_step, and a randomized run that checks every invariant.
#include <gtest/gtest.h>

#include <random>

#include "experts/residency.h"

using namespace sluice;

namespace {

ResidencyOptions options(int32_t n_slots, PolicyKind policy, int32_t speculative = 0, int64_t n_records = 16) {
  ResidencyOptions o;
  o.n_slots = n_slots;
  o.n_records = n_records;
  o.policy = policy;
  o.speculative_slots = speculative;
  return o;
}

// Replays records one access at a time (acquire, load, release) and counts hits.
int hits_of(Residency& r, std::initializer_list<int64_t> seq) {
  int hits = 0;
  for (int64_t rec : seq) {
    AcquireResult a = r.acquire(rec, DType::bf16);
    EXPECT_NE(a.status, AcquireStatus::no_slot);
    if (a.status == AcquireStatus::hit) ++hits;
    if (a.status == AcquireStatus::miss) r.complete_load(a.slot);
    r.release(a.slot);
    r.check_invariants();
  }
  return hits;
}

int hits_of(PolicyKind p, int32_t n_slots, std::initializer_list<int64_t> seq, double lrfu_half_life_slots = 8) {
  ResidencyOptions o = options(n_slots, p);
  o.policy_options.lrfu_half_life_slots = lrfu_half_life_slots;
  Residency r(o);
  return hits_of(r, seq);
}

}  // namespace

TEST(Policy, NamesRoundTrip) {
  for (PolicyKind p : {PolicyKind::lru, PolicyKind::lfu, PolicyKind::lrfu, PolicyKind::fifo, PolicyKind::markov,
                       PolicyKind::belady})
    EXPECT_EQ(policy_from_name(policy_name(p)), p);
  EXPECT_FALSE(policy_from_name("arc").has_value());
  EXPECT_EQ(online_policies().size(), 5u);
}

// 3 slots, 1 2 3 1 4 1 2 5 3.
// lru:  1m 2m 3m 1h [2,3,1]; 4m evicts 2 [3,1,4]; 1h [3,4,1]; 2m evicts 3; 5m evicts 4;
//       3m evicts 1: 2 hits.
// fifo: 1h does not refresh 1: 4m evicts 1 [2,3,4]; 1m evicts 2 [3,4,1]; 2m evicts 3;
//       5m evicts 4; 3m evicts 1: 1 hit.
TEST(Policy, LruAndFifoExact) {
  EXPECT_EQ(hits_of(PolicyKind::lru, 3, {1, 2, 3, 1, 4, 1, 2, 5, 3}), 2);
  EXPECT_EQ(hits_of(PolicyKind::fifo, 3, {1, 2, 3, 1, 4, 1, 2, 5, 3}), 1);
  // 2 slots, 1 2 1 3 1: lru keeps the refreshed 1 (2 hits); fifo evicts it (1 hit).
  EXPECT_EQ(hits_of(PolicyKind::lru, 2, {1, 2, 1, 3, 1}), 2);
  EXPECT_EQ(hits_of(PolicyKind::fifo, 2, {1, 2, 1, 3, 1}), 1);
}

// 3 slots, 1 1 1 2 3 4 1: lru evicts 1 (least recent) for 4, then misses 1: 2 hits. lfu
// evicts the least frequent, 2 and 3 tie at one access and the older (2) goes: 1 hits: 3.
// lrfu (half-life 24 accesses) weighs 1's three accesses above 2's and 3's single ones: 3.
TEST(Policy, LfuAndLrfuKeepFrequentRecords) {
  EXPECT_EQ(hits_of(PolicyKind::lru, 3, {1, 1, 1, 2, 3, 4, 1}), 2);
  EXPECT_EQ(hits_of(PolicyKind::lfu, 3, {1, 1, 1, 2, 3, 4, 1}), 3);
  EXPECT_EQ(hits_of(PolicyKind::lrfu, 3, {1, 1, 1, 2, 3, 4, 1}), 3);
}

// 2 slots, 1 1 1 1 2 3 2 3 2 3: a record hot long ago, then a loop over two others.
// lfu keeps 1 forever (count 4) and thrashes 2/3: only 1's 3 re-uses hit.
// lru lets 1 go at the first miss and then hits the loop: 3 + 4 = 7.
// lrfu with a half-life of 1 access forgets 1 as fast as lru: 7; with a half-life of 200
// accesses it remembers 1 like lfu: 3.
TEST(Policy, LrfuSpansLruToLfu) {
  const std::initializer_list<int64_t> seq = {1, 1, 1, 1, 2, 3, 2, 3, 2, 3};
  EXPECT_EQ(hits_of(PolicyKind::lfu, 2, seq), 3);
  EXPECT_EQ(hits_of(PolicyKind::lru, 2, seq), 7);
  EXPECT_EQ(hits_of(PolicyKind::lrfu, 2, seq, 0.5), 7);
  EXPECT_EQ(hits_of(PolicyKind::lrfu, 2, seq, 100), 3);
}

// LFU counts survive eviction. 3 slots, A=1 .. F=6:
//   A x5 (4 hits), B x2 (1), C x2 (1) [A,B,C]; D evicts B (B and C tie at 2, B older);
//   D D (2 hits, count 3); E evicts C (count 2) [A,D,E]; E E (2 hits, count 3);
//   B returns with its history (count 3) and evicts D (3, older than E); F evicts E (3, older
//   than B's 3); B hits. 4+1+1+2+2+1 = 11. Counting only since insertion, B would re-enter
//   with count 1, F would evict it, and the last B would miss (10).
TEST(Policy, LfuHistorySurvivesEviction) {
  EXPECT_EQ(hits_of(PolicyKind::lfu, 3, {1, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 5, 2, 6, 2}), 11);
}

TEST(Residency, BeladyNeedsAnOracle) {
  EXPECT_THROW(Residency(options(2, PolicyKind::belady)), Error);
}

TEST(Residency, RejectsBadShapes) {
  EXPECT_THROW(Residency(options(0, PolicyKind::lru)), Error);
  EXPECT_THROW(Residency(options(4, PolicyKind::lru, 4)), Error);  // speculative share = whole cache
  Residency r(options(2, PolicyKind::lru, 0, 4));
  EXPECT_THROW(r.acquire(4, DType::bf16), Error);  // record outside [0, n_records)
}

TEST(Residency, PinnedSlotsAreNeverEvicted) {
  Residency r(options(2, PolicyKind::lru));
  AcquireResult a = r.acquire(1, DType::bf16);  // stays pinned
  ASSERT_EQ(a.status, AcquireStatus::miss);
  r.complete_load(a.slot);
  AcquireResult b = r.acquire(2, DType::bf16);
  r.complete_load(b.slot);
  r.release(b.slot);
  // 1 is least recently used, but pinned: 3 must take 2's slot.
  AcquireResult c = r.acquire(3, DType::bf16);
  ASSERT_EQ(c.status, AcquireStatus::miss);
  EXPECT_EQ(c.slot, b.slot);
  EXPECT_EQ(c.evicted_record, 2);
  r.complete_load(c.slot);
  // Both pinned now: no slot, and nothing changes.
  AcquireResult d = r.acquire(4, DType::bf16);
  EXPECT_EQ(d.status, AcquireStatus::no_slot);
  EXPECT_EQ(r.find(1, DType::bf16), a.slot);
  EXPECT_EQ(r.find(3, DType::bf16), c.slot);
  EXPECT_EQ(r.counters().no_slot, 1u);
  r.check_invariants();
  r.release(a.slot);
  EXPECT_EQ(r.acquire(4, DType::bf16).evicted_record, 1);
}

TEST(Residency, LoadingSlotsArePendingAndNotEvictable) {
  Residency r(options(1, PolicyKind::lru));
  AcquireResult a = r.acquire(7, DType::bf16);
  ASSERT_EQ(a.status, AcquireStatus::miss);
  EXPECT_EQ(r.state(a.slot), SlotState::loading);
  r.release(a.slot);  // the requester gave up (a cut), the read is still in flight
  AcquireResult b = r.acquire(8, DType::bf16);
  EXPECT_EQ(b.status, AcquireStatus::no_slot);
  AcquireResult c = r.acquire(7, DType::bf16);
  EXPECT_EQ(c.status, AcquireStatus::pending);
  EXPECT_EQ(r.pins(a.slot), 1);
  r.complete_load(a.slot);
  EXPECT_EQ(r.state(a.slot), SlotState::resident);
  r.release(c.slot);
  EXPECT_EQ(r.acquire(8, DType::bf16).evicted_record, 7);
  r.check_invariants();
}

TEST(Residency, FailedLoadFreesTheSlot) {
  Residency r(options(2, PolicyKind::lru));
  AcquireResult a = r.acquire(3, DType::bf16);
  r.release(a.slot);
  r.fail_load(a.slot);
  EXPECT_EQ(r.state(a.slot), SlotState::free);
  EXPECT_EQ(r.find(3, DType::bf16), -1);
  EXPECT_EQ(r.n_free(), 2);
  EXPECT_EQ(r.acquire(3, DType::bf16).status, AcquireStatus::miss);
  r.check_invariants();
}

TEST(Residency, KindsAreSeparateKeys) {
  Residency r(options(2, PolicyKind::lru));
  AcquireResult a = r.acquire(5, DType::q2);
  r.complete_load(a.slot);
  r.release(a.slot);
  EXPECT_EQ(r.kind(a.slot), DType::q2);
  EXPECT_EQ(r.record(a.slot), 5);
  EXPECT_EQ(r.find(5, DType::bf16), -1);
  AcquireResult b = r.acquire(5, DType::bf16);
  EXPECT_EQ(b.status, AcquireStatus::miss);
  EXPECT_NE(b.slot, a.slot);
  EXPECT_EQ(r.kind(b.slot), DType::bf16);
  r.check_invariants();
}

// A step acquires its resident records before its misses, so a miss never evicts a record
// the same step is about to hit.
TEST(Residency, AcquireStepNeverEvictsItsOwnRecords) {
  Residency r(options(2, PolicyKind::lru));
  for (int64_t rec : {1, 2}) {
    AcquireResult a = r.acquire(rec, DType::bf16);
    r.complete_load(a.slot);
    r.release(a.slot);
  }
  // Step {3, 1}: 1 is the least recently used; record-by-record, 3 would evict it first.
  std::vector<int64_t> recs{3, 1};
  std::vector<AcquireResult> res(2);
  r.acquire_step(recs, DType::bf16, res);
  EXPECT_EQ(res[0].status, AcquireStatus::miss);
  EXPECT_EQ(res[0].evicted_record, 2);
  EXPECT_EQ(res[1].status, AcquireStatus::hit);
  r.check_invariants();
}

// The speculative share: 4 slots, 1 of them speculative.
TEST(Residency, SpeculativeShareNeverEvictsDemandRecords) {
  Residency r(options(4, PolicyKind::lru, 1));
  auto demand = [&](int64_t rec) {
    AcquireResult a = r.acquire(rec, DType::bf16);
    if (a.status == AcquireStatus::miss) r.complete_load(a.slot);
    if (a.slot >= 0) r.release(a.slot);
    return a;
  };
  AcquireResult p = r.acquire(10, DType::bf16, AccessKind::prefetch);
  ASSERT_EQ(p.status, AcquireStatus::miss);
  EXPECT_TRUE(r.speculative(p.slot));
  EXPECT_EQ(r.pins(p.slot), 0);
  // A second prefetch while the first is loading: the share is full and its only record
  // cannot be evicted yet.
  EXPECT_EQ(r.acquire(11, DType::bf16, AccessKind::prefetch).status, AcquireStatus::no_slot);
  r.complete_load(p.slot);
  for (int64_t rec : {1, 2, 3}) EXPECT_EQ(demand(rec).status, AcquireStatus::miss);
  EXPECT_EQ(r.n_free(), 0);
  // A newer prediction replaces the unconfirmed one, not a demand record.
  AcquireResult q = r.acquire(11, DType::bf16, AccessKind::prefetch);
  ASSERT_EQ(q.status, AcquireStatus::miss);
  EXPECT_EQ(q.evicted_record, 10);
  EXPECT_TRUE(q.evicted_speculative);
  EXPECT_EQ(r.counters().prefetch_wasted, 1u);
  // A prefetch of something resident changes nothing.
  EXPECT_EQ(r.acquire(2, DType::bf16, AccessKind::prefetch).status, AcquireStatus::hit);
  EXPECT_EQ(r.counters().prefetch_already, 1u);
  r.complete_load(q.slot);
  // The prediction is confirmed: 11 joins the demand partition.
  AcquireResult c = demand(11);
  EXPECT_EQ(c.status, AcquireStatus::hit);
  EXPECT_TRUE(c.confirmed_prefetch);
  EXPECT_FALSE(r.speculative(c.slot));
  EXPECT_EQ(r.n_speculative(), 0);
  EXPECT_EQ(r.counters().prefetch_confirmed, 1u);
  // The confirmation grew the demand partition to all 4 slots: the least recently used
  // demand record (1) left, as the miss the prediction saved would have evicted it, so the
  // share has its slot back and the next prediction is not refused.
  EXPECT_EQ(r.find(1, DType::bf16), -1);
  EXPECT_EQ(r.n_free(), 1);
  AcquireResult n = r.acquire(12, DType::bf16, AccessKind::prefetch);
  EXPECT_EQ(n.status, AcquireStatus::miss);
  EXPECT_EQ(n.evicted_record, -1);
  EXPECT_EQ(r.counters().prefetch_refused, 1u);
  r.complete_load(n.slot);
  // A prefetch never evicts a demand record: with the share full of a loading prediction...
  AcquireResult m = r.acquire(13, DType::bf16, AccessKind::prefetch);
  EXPECT_EQ(m.status, AcquireStatus::miss);
  EXPECT_EQ(m.evicted_record, 12);  // ...it replaces the older unconfirmed one
  // A demand miss evicts by policy among demand records: 2 is the least recently used.
  EXPECT_EQ(demand(4).evicted_record, 2);
  r.check_invariants();
}

// Demand keeps its hands off the speculative share while it can evict, and borrows it only
// when every demand record is pinned.
TEST(Residency, DemandBorrowsTheSpeculativeShareOnlyWhenPinned) {
  Residency r(options(3, PolicyKind::lru, 1));
  std::vector<int32_t> slots;
  for (int64_t rec : {1, 2}) {
    AcquireResult a = r.acquire(rec, DType::bf16);
    r.complete_load(a.slot);
    slots.push_back(a.slot);
  }
  r.release(slots[0]);
  // Demand holds 2 = 3 - 1 slots: record 3 evicts 1 rather than take the free slot.
  AcquireResult a = r.acquire(3, DType::bf16);
  EXPECT_EQ(a.evicted_record, 1);
  EXPECT_EQ(r.n_free(), 1);
  r.complete_load(a.slot);
  // 2 and 3 pinned: record 4 borrows the free slot.
  AcquireResult b = r.acquire(4, DType::bf16);
  EXPECT_EQ(b.status, AcquireStatus::miss);
  EXPECT_EQ(b.evicted_record, -1);
  EXPECT_EQ(r.n_free(), 0);
  r.check_invariants();
}

// Random demand and prefetch traffic with random load completions, failures and releases:
// every invariant holds after every call, and pinned or loading slots are never taken.
TEST(Residency, RandomTrafficKeepsInvariants) {
  for (PolicyKind p : online_policies()) {
    std::mt19937 rng(42);
    Residency r(options(6, p, 2, 40));
    std::vector<int32_t> pinned;
    for (int i = 0; i < 5000; ++i) {
      const int op = static_cast<int>(rng() % 10);
      const int64_t rec = static_cast<int64_t>(rng() % 40);
      const DType kind = rng() % 4 == 0 ? DType::q2 : DType::bf16;
      if (op < 4) {
        const int32_t before = r.find(rec, kind);
        AcquireResult a = r.acquire(rec, kind);
        if (a.status == AcquireStatus::no_slot) continue;
        if (before >= 0) {
          EXPECT_EQ(a.slot, before);
        }
        pinned.push_back(a.slot);
      } else if (op < 6) {
        AcquireResult a = r.acquire(rec, kind, AccessKind::prefetch);
        if (a.status == AcquireStatus::miss) {
          EXPECT_TRUE(r.speculative(a.slot));
        }
      } else if (op < 8 && !pinned.empty()) {
        const size_t j = rng() % pinned.size();
        r.release(pinned[j]);
        pinned.erase(pinned.begin() + static_cast<std::ptrdiff_t>(j));
      } else {
        for (int32_t s = 0; s < r.n_slots(); ++s)
          if (r.state(s) == SlotState::loading) {
            if (rng() % 8 == 0 && r.pins(s) == 0)
              r.fail_load(s);
            else
              r.complete_load(s);
            break;
          }
      }
      r.check_invariants();
      for (int32_t s : pinned) EXPECT_NE(r.state(s), SlotState::free);
    }
  }
}

namespace {

// Replays steps (one layer's records each) through acquire_step, loads and releases them;
// counts hits.
int step_hits(PolicyKind p, int32_t n_slots, const std::vector<std::vector<int64_t>>& steps) {
  Residency r(options(n_slots, p));
  int hits = 0;
  for (const std::vector<int64_t>& s : steps) {
    std::vector<AcquireResult> res(s.size());
    r.acquire_step(s, DType::bf16, res);
    for (const AcquireResult& a : res) {
      hits += a.status == AcquireStatus::hit;
      if (a.status == AcquireStatus::miss) r.complete_load(a.slot);
      r.release(a.slot);
    }
    r.check_invariants();
  }
  return hits;
}

}  // namespace

// Steps 1 2 3 repeated 4 times, top-1, 2 slots. lru always evicts the record the next step
// needs: 0 hits. markov learns which expert follows which: from the 4th step on, when a
// step's record misses, the table says which resident comes next (after 1 comes 2, after
// 3 comes 1) and the other one goes. Steps 5, 7, 9 and 11 (1-based) hit: 4 hits.
TEST(Policy, MarkovLearnsWhatFollows) {
  std::vector<std::vector<int64_t>> steps;
  for (int i = 0; i < 4; ++i)
    for (int64_t e : {1, 2, 3}) steps.push_back({e});
  EXPECT_EQ(step_hits(PolicyKind::lru, 2, steps), 0);
  EXPECT_EQ(step_hits(PolicyKind::markov, 2, steps), 4);
}

// Without step notices (acquires one at a time, nothing calls note_step) markov knows no
// chances and orders by recency alone: exactly lru.
TEST(Policy, MarkovWithoutStepsIsLru) {
  for (auto seq : {std::initializer_list<int64_t>{1, 2, 3, 1, 4, 1, 2, 5, 3}, {1, 1, 1, 2, 3, 4, 1}, {1, 2, 1, 3, 1}})
    EXPECT_EQ(hits_of(PolicyKind::markov, 3, seq), hits_of(PolicyKind::lru, 3, seq));
}

// A markov pool shared by 2 layers of 4 experts (records layer * 4 + e); step(rec) acquires
// a one-record step, loads a miss and releases it.
struct MarkovPool {
  explicit MarkovPool(int32_t slots) : r([&] {
      ResidencyOptions o = options(slots, PolicyKind::markov, 0, 8);
      o.n_expert = 4;
      // The scenarios below are worked out for a frequency half-life of 16 layer steps
      // (the default was 16 when they were written; at 8, record 4's one recent use already
      // outweighs record 0 without a prediction).
      o.policy_options.markov_half_life_steps = 16;
      return o;
    }()) {}
  AcquireStatus step(int64_t rec) {
    AcquireResult a;
    r.acquire_step(std::span<const int64_t>(&rec, 1), DType::bf16, std::span<AcquireResult>(&a, 1));
    if (a.status == AcquireStatus::miss) r.complete_load(a.slot);
    r.release(a.slot);
    return a.status;
  }
  Residency r;
};

// A pool shared by 2 layers of 4 experts (records layer * 4 + e), 4 slots (room for two
// one-expert steps of each layer). Steps L1{5} x3, L1{4}, L0{0}, L0{2} leave 5, 4, 0, 2
// resident; the L0{1} step must evict one. Record 4 was used once in layer 1's 4 steps, so
// without a prediction it is the least likely (5 is layer 1's favourite; 0 and 2 each served
// one of layer 0's three steps, but a token away) and goes, and L1{4} misses. With lookahead's
// prediction of L1{4} it is worth the predictions' precision (1/2 before any track record)
// one step ahead, more than record 0 a whole token ahead: 0 goes and L1{4} hits.
TEST(Policy, MarkovKeepsPredictedRecords) {
  for (bool predict : {false, true}) {
    MarkovPool pool(4);
    Residency& r = pool.r;
    auto step = [&](int64_t rec) { return pool.step(rec); };
    for (int64_t rec : {5, 5, 5, 4, 0, 2}) step(rec);
    const int64_t predicted = 4;
    if (predict) r.note_prediction(std::span<const int64_t>(&predicted, 1));
    EXPECT_EQ(step(1), AcquireStatus::miss);
    EXPECT_EQ(r.find(4, DType::bf16) >= 0, predict);
    EXPECT_EQ(r.find(0, DType::bf16) >= 0, !predict);
    EXPECT_EQ(step(4), predict ? AcquireStatus::hit : AcquireStatus::miss);
  }
}

// The same layers with 3 slots, less than two steps of each layer: the acquiring layer's own
// record outside its step (0, for the L0{1} step) goes first whatever is predicted, since a
// slot taken from layer 1 would only move the miss there; L1{4} then hits either way.
TEST(Policy, MarkovTightPoolEvictsTheLayersOwnFirst) {
  for (bool predict : {false, true}) {
    MarkovPool pool(3);
    Residency& r = pool.r;
    auto step = [&](int64_t rec) { return pool.step(rec); };
    for (int64_t rec : {5, 5, 5, 4, 0}) step(rec);
    const int64_t predicted = 4;
    if (predict) r.note_prediction(std::span<const int64_t>(&predicted, 1));
    EXPECT_EQ(step(1), AcquireStatus::miss);
    EXPECT_LT(r.find(0, DType::bf16), 0) << predict;
    EXPECT_EQ(step(4), AcquireStatus::hit) << predict;
  }
}
