// The planning shared by the CPU and CUDA streamers (experts/plan.h): the union of a step
// strongest first with its pairs, row groups whose union fits the cache, the order of
// lookahead's predictions, acquire counting, and the cache layout (the minimum, the cap at
// the records, the speculative share, the host tier) on a real pack.
#include <gtest/gtest.h>

#include "tests/models/pack_util.h"
#include "experts/plan.h"

using namespace sluice;
using namespace sluice::test;

TEST(Plan, StepUnionStrongestFirstWithPairs) {
  // 3 rows, k = 2: expert 5 twice (best 0.6), 1 (0.7), 2 (0.3), 0 (0.4).
  const std::vector<int32_t> ids = {5, 2, 1, 5, 0, 2};
  const std::vector<float> w = {0.6f, 0.3f, 0.7f, 0.2f, 0.4f, 0.1f};
  const auto u = step_union(ids, w, 2, 0, 3, 4, 8);
  ASSERT_EQ(u.size(), 4u);
  EXPECT_EQ(u[0].expert, 1);
  EXPECT_EQ(u[1].expert, 5);
  EXPECT_EQ(u[2].expert, 0);
  EXPECT_EQ(u[3].expert, 2);
  EXPECT_EQ(u[1].record, 4 * 8 + 5);
  EXPECT_FLOAT_EQ(u[1].best, 0.6f);
  EXPECT_EQ(u[1].pairs, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(u[3].pairs, (std::vector<int32_t>{1, 5}));
  // best_share: the weight x k over the row's top-k weight, the largest over the rows:
  // rows sum 0.9, 0.9, 0.5; expert 5 is 0.6 of 0.9 (1.333) and 0.2 of 0.9; 2 is 0.3 of 0.9
  // and 0.1 of 0.5 (0.667, 0.4).
  EXPECT_FLOAT_EQ(u[0].best_share, 0.7f * 2 / 0.9f);
  EXPECT_FLOAT_EQ(u[1].best_share, 0.6f * 2 / 0.9f);
  EXPECT_FLOAT_EQ(u[2].best_share, 0.4f * 2 / 0.5f);
  EXPECT_FLOAT_EQ(u[3].best_share, 0.3f * 2 / 0.9f);
  // Top-1: the token's only expert is always the uniform share, whatever its weight.
  const auto one = step_union(std::vector<int32_t>{6, 3}, std::vector<float>{0.05f, 0.9f}, 1, 0, 2, 0, 8);
  EXPECT_FLOAT_EQ(one[0].best_share, 1.0f);
  EXPECT_FLOAT_EQ(one[1].best_share, 1.0f);
  // A sub-range of rows only sees its own pairs.
  const auto r1 = step_union(ids, w, 2, 1, 2, 0, 8);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].expert, 1);
  EXPECT_EQ(r1[1].pairs, (std::vector<int32_t>{3}));
  // Equal weights keep first-seen order; an id outside the layer is an internal error.
  const auto tie = step_union(std::vector<int32_t>{3, 1}, std::vector<float>{0.5f, 0.5f}, 2, 0, 1, 0, 8);
  EXPECT_EQ(tie[0].expert, 3);
  EXPECT_THROW(step_union(std::vector<int32_t>{9, 1}, std::vector<float>{0.5f, 0.5f}, 2, 0, 1, 0, 8), Error);
}

TEST(Plan, RowGroupsFitTheCache) {
  // k = 2; rows: {0,1} {1,2} {3,4} {0,4}
  const std::vector<int32_t> ids = {0, 1, 1, 2, 3, 4, 0, 4};
  EXPECT_EQ(row_group_end(ids, 2, 0, 4, 3, 8), 2);  // {0,1,2} fits 3, adding {3,4} does not
  EXPECT_EQ(row_group_end(ids, 2, 2, 4, 3, 8), 4);  // {3,4} then {0}: 3 distinct
  EXPECT_EQ(row_group_end(ids, 2, 0, 4, 5, 8), 4);  // everything fits 5
  EXPECT_EQ(row_group_end(ids, 2, 0, 4, 2, 8), 1);  // a row alone always forms a group
}

TEST(Plan, PredictedUnionBestWeightFirst) {
  const std::vector<int32_t> ids = {2, 7, 7, 1};
  const std::vector<float> w = {0.2f, 0.5f, 0.9f, 0.1f};
  const auto u = predicted_union(ids, w, 8);
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(u[0].second, 7);
  EXPECT_FLOAT_EQ(u[0].first, 0.9f);
  EXPECT_EQ(u[1].second, 2);
  EXPECT_EQ(u[2].second, 1);
}

TEST(Plan, CountDemandAcquire) {
  LayerStats ls;
  AcquireResult a;
  a.status = AcquireStatus::hit;
  count_demand_acquire(ls, a, 100);
  a.status = AcquireStatus::pending;
  a.confirmed_prefetch = true;
  count_demand_acquire(ls, a, 100);
  a.status = AcquireStatus::miss;
  a.confirmed_prefetch = false;
  count_demand_acquire(ls, a, 100);
  EXPECT_EQ(ls.hits, 2u);
  EXPECT_EQ(ls.pending_hits, 1u);
  EXPECT_EQ(ls.prefetch_hits, 1u);
  EXPECT_EQ(ls.misses, 1u);
  EXPECT_EQ(ls.bytes_demand, 100u);
}

TEST(Plan, CacheLayoutOfAPack) {
  std::shared_ptr<Pack> p = Pack::open(fixture_pack("qwen3_moe_yarn"), false);  // top-3
  const uint64_t slot = streaming_slot_bytes(*p, DType::q4, DType::q2);
  EXPECT_EQ(slot, std::max(p->kind(DType::q4).record_stride, p->kind(DType::q2).record_stride));
  StreamerOptions so;
  so.slots = 2;
  try {
    plan_cache_layout(*p, 3, slot, so);
    FAIL() << "2 slots for top-3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the minimum is 3 slots"), std::string::npos) << e.what();
  }
  so.slots = 1 << 20;  // capped at the records
  EXPECT_EQ(plan_cache_layout(*p, 3, slot, so).n_slots, p->manifest().n_records());
  so.slots = 0;
  so.cache_bytes = 8 * slot + slot / 2;  // whole slots only
  so.lookahead = true;
  const CacheLayout c = plan_cache_layout(*p, 3, slot, so);
  EXPECT_EQ(c.n_slots, 8);
  EXPECT_EQ(c.speculative_slots, 2);  // 2 top-k = 6, capped at a quarter of 8
  EXPECT_EQ(c.host_slots, 0);
  EXPECT_EQ(speculative_share(100, 3), 6);  // two steps' predictions, under a quarter of 100
  EXPECT_EQ(speculative_share(5, 3), 1);    // at least one slot
  EXPECT_EQ(speculative_share(3, 3), 0);    // no room beside a token's experts
  so.cache_bytes = 3 * slot;  // exactly top-k: no room for a speculative share
  EXPECT_EQ(plan_cache_layout(*p, 3, slot, so).speculative_slots, 0);
  so.host_cache_bytes = 5 * slot;
  EXPECT_EQ(plan_cache_layout(*p, 3, slot, so).host_slots, 5);
  so.host_cache_bytes = slot / 2;
  EXPECT_THROW(plan_cache_layout(*p, 3, slot, so), Error);
  // Options that do not depend on memory.
  StreamerOptions bad;
  bad.slots = 4;
  bad.cut = 2;
  EXPECT_THROW(check_streaming_options(*p, DType::q4, 3, bad), Error);
  bad.cut = 0;
  bad.miss_kind = DType::q4;
  EXPECT_THROW(check_streaming_options(*p, DType::q4, 3, bad), Error);
  bad.miss_kind = DType::q2;
  EXPECT_NO_THROW(check_streaming_options(*p, DType::q4, 3, bad));
}
