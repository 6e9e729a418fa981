// Replayed routing (experts/routing_replay.h, routing_fit.h): the mapping rule on handcrafted
// traces (layers cycled with their token shift, top-k cut, predictions within a cycle, the
// permutation onto more experts, problems concatenated, wrapping); the fitted generator's
// statistics against the trace's; the model's layers taking the replay's rows; and a replayed
// streamed run reading exactly what `sluice simulate` predicts for the same routing, policy and
// cache (step pins, one pool; predictions never without lookahead, prefetches with it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "backends/backend.h"
#include "convert/synth.h"
#include "experts/routing_fit.h"
#include "experts/routing_replay.h"
#include "experts/simulate.h"
#include "experts/streaming_provider.h"
#include "models/load.h"

namespace fs = std::filesystem;
using namespace sluice;

namespace {

fs::path repo() { return sluice::test::source_dir(); }

// A trace of `problems` problems of `tokens` tokens over `layers` layers: row (p, l, t) routes
// to experts e0 = (7 p + 3 l + t) mod n_expert and the next k - 1 ids, weights k, k - 1, ...
// (not normalized), predicted_next the next layer's row shifted by one id.
Trace handmade(int problems, int layers, int tokens, int n_expert, int k) {
  Trace tr;
  auto ids = [&](int p, int l, int t) {
    std::vector<int32_t> v;
    for (int j = 0; j < k; ++j) v.push_back((7 * p + 3 * l + t + j) % n_expert);
    return v;
  };
  for (int p = 0; p < problems; ++p)
    for (int t = 0; t < tokens; ++t)
      for (int l = 0; l < layers; ++l) {
        TraceRow r;
        r.problem = 10 + p;
        r.layer = 2 * l;  // the trace's own layer numbers need not be dense
        r.token = t;
        r.experts = ids(p, l, t);
        for (int j = 0; j < k; ++j) r.weights.push_back(static_cast<float>(k - j));
        if (l + 1 < layers) {
          r.next_layer = 2 * (l + 1);
          r.predicted_next = ids(p, l + 1, t + 1);
        }
        tr.rows.push_back(r);
      }
  tr.n_layer = 2 * layers - 1;
  tr.n_expert = n_expert;
  tr.top_k = k;
  tr.n_problems = problems;
  tr.has_predictions = layers > 1;
  return tr;
}

// A tiny qwen3_moe pack (3 layers, the middle one dense) of n_expert experts, top-k.
fs::path tiny_pack(const std::string& name, int64_t n_expert, int64_t k) {
  const fs::path dir = test::pack_test_dir("replay-" + name) / "pack";
  if (fs::exists(dir / "manifest.json")) return dir;
  nlohmann::json config = synth_preset_config("tiny-qwen3-moe");
  config["num_experts"] = n_expert;
  config["num_experts_per_tok"] = k;
  SynthOptions o;
  o.kinds = {DType::q4};
  synth_pack(config, dir, o);
  return dir;
}

}  // namespace

TEST(RoutingReplay, IdsMappingCyclesLayersAndCutsTopK) {
  // 2 problems of 5 tokens, 3 trace layers, 16 experts top-4 onto 7 pack layers, top-2.
  const Trace tr = handmade(2, 3, 5, 16, 4);
  const ReplayTable t = map_routing_trace(tr, "hand.jsonl", {7, 16, 2}, ReplayMapping::automatic);
  EXPECT_EQ(t.mapping, "ids");
  ASSERT_EQ(t.n_tokens, 10);
  ASSERT_EQ(t.n_layers, 7);
  const int64_t cycles = 3, shift = 10 / cycles;  // 7 layers over 3 trace layers
  for (int64_t L = 0; L < 7; ++L)
    for (int64_t t0 = 0; t0 < 10; ++t0) {
      const int64_t src = (t0 + (L / 3) * shift) % 10, p = src / 5, tok = src % 5, l = L % 3;
      for (int64_t j = 0; j < 2; ++j) {
        EXPECT_EQ(t.ids[static_cast<size_t>((L * 10 + t0) * 2 + j)], (7 * p + 3 * l + tok + j) % 16)
            << "layer " << L << " token " << t0;
        EXPECT_EQ(t.weights[static_cast<size_t>((L * 10 + t0) * 2 + j)], static_cast<float>(4 - j));
      }
    }
  // Predictions: within a cycle only (pack layers 0, 1, 3, 4 predict; 2, 5 end a cycle; 6 is last).
  EXPECT_EQ(t.predicts, (std::vector<uint8_t>{1, 1, 0, 1, 1, 0, 0}));
  RoutingReplay replay(t);
  const std::optional<Routing> pred = replay.predicted(3, 4, 1);  // layer 3 = trace layer 0, cycle 1
  ASSERT_TRUE(pred.has_value());
  const int64_t src = (4 + shift) % 10;
  EXPECT_EQ(pred->ids, (std::vector<int32_t>{static_cast<int32_t>((7 * (src / 5) + 3 + src % 5 + 1) % 16),
                                             static_cast<int32_t>((7 * (src / 5) + 3 + src % 5 + 2) % 16)}));
  EXPECT_FALSE(replay.predicted(2, 0, 1).has_value());
  // Rows renormalized as the family does, wrapping at the stream's end.
  const Routing r = replay.rows(0, 9, 2, /*normalize=*/true);
  EXPECT_EQ(r.ids[2], t.ids[0]);  // row 1 is token 10 = token 0
  EXPECT_FLOAT_EQ(r.weights[0], 4.0f / 7.0f);
  EXPECT_FLOAT_EQ(r.weights[1], 3.0f / 7.0f);
  EXPECT_FLOAT_EQ(replay.rows(0, 0, 1, false).weights[0], 4.0f);
  // Taking rows advances each layer on its own and wraps.
  EXPECT_EQ(replay.take(0, 7), 0);
  EXPECT_EQ(replay.take(0, 7), 7);
  EXPECT_EQ(replay.take(0, 1), 4);
  EXPECT_EQ(replay.take(1, 1), 0);
  const std::vector<int64_t> at = replay.position();
  replay.take(0, 3);
  replay.set_position(at);
  EXPECT_EQ(replay.take(0, 1), 5);
}

TEST(RoutingReplay, IdsOntoMoreExpertsThroughAPermutation) {
  const Trace tr = handmade(1, 2, 40, 8, 2);
  const ReplayTable t = map_routing_trace(tr, "hand.jsonl", {2, 32, 2}, ReplayMapping::ids);
  for (int64_t L = 0; L < 2; ++L) {
    std::set<int32_t> used;
    for (int64_t i = 0; i < t.n_tokens * 2; ++i) used.insert(t.ids[static_cast<size_t>(L * t.n_tokens * 2 + i)]);
    EXPECT_EQ(used.size(), 8u) << "layer " << L;  // the trace's 8 ids, one to one
    EXPECT_TRUE(*used.rbegin() < 32);
  }
  // The same trace id maps to the same pack id within a layer (a fixed permutation).
  for (int64_t i = 0; i < t.n_tokens * 2; ++i)
    for (int64_t j = 0; j < t.n_tokens * 2; ++j)
      if (tr.rows[static_cast<size_t>((i / 2) * 2)].experts[static_cast<size_t>(i % 2)] ==
          tr.rows[static_cast<size_t>((j / 2) * 2)].experts[static_cast<size_t>(j % 2)])
        EXPECT_EQ(t.ids[static_cast<size_t>(i)], t.ids[static_cast<size_t>(j)]);
  // auto: other expert counts take the generator.
  EXPECT_EQ(map_routing_trace(tr, "hand.jsonl", {2, 32, 2}, ReplayMapping::automatic).mapping, "fit");
  EXPECT_EQ(map_routing_trace(tr, "hand.jsonl", {2, 8, 4}, ReplayMapping::automatic).mapping, "fit");
}

TEST(RoutingReplay, IdsRefusesWhatItCannotMap) {
  const Trace tr = handmade(1, 2, 10, 16, 4);
  try {
    map_routing_trace(tr, "hand.jsonl", {2, 8, 2}, ReplayMapping::ids);
    FAIL() << "ids onto fewer experts";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("--replay-map fit"), std::string::npos) << e.what();
  }
  EXPECT_THROW(map_routing_trace(tr, "hand.jsonl", {2, 16, 8}, ReplayMapping::ids), Error);
  EXPECT_THROW(map_routing_trace(tr, "hand.jsonl", {2, 16, 17}, ReplayMapping::automatic), Error);
}

TEST(RoutingReplay, StreamTakesTheShortestLayerOfEachProblem) {
  // The Mixtral recorder dropped rows: each problem is as long as its shortest layer.
  Trace tr = handmade(2, 2, 6, 8, 2);
  tr.rows.erase(tr.rows.begin() + 3);  // problem 0, token 1, layer 1
  const TraceStream s = trace_stream(tr);
  EXPECT_EQ(s.n_layers, 2);
  EXPECT_EQ(s.n_tokens, 5 + 6);
  EXPECT_EQ(s.problem_starts, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(s.layer_ids, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(s.at(1, 1).token, 2);  // layer 1 lost its token 1: the rows after it move up
  EXPECT_EQ(s.at(0, 5).problem, 11);
}

// The generator keeps the trace's statistics, at the trace's own shape and at 4x its experts
// (calibrated again there): the popularity at equal rank fractions, the reuse, the transition,
// the sequel and the lookahead's recall within the bounds below, and at the trace's shape the hit rates
// the fit chose it by. Both sides are measured on 2,048 tokens (the favourite-successor
// table of the transition is estimated from the stream itself, so the lengths must agree); the
// bounds are about a tenth of each statistic's spread over the trace's layers.
TEST(RoutingReplay, GeneratorKeepsTheTracesStatistics) {
  const Trace trace = read_trace(repo() / "traces" / "routing-model-gpu-code.jsonl.xz");
  const RoutingFit fit = fit_routing(trace);
  ASSERT_EQ(fit.n_layers, 12);
  ASSERT_EQ(fit.n_tokens, 2048);
  auto top_share = [](const RoutingFit& f, double fraction) {  // mean over layers of the top ranks' share
    double s = 0;
    for (const auto& p : f.popularity) {
      const auto n = static_cast<size_t>(std::llround(fraction * static_cast<double>(p.size())));
      for (size_t r = 0; r < n; ++r) s += p[r];
    }
    return s / static_cast<double>(f.popularity.size());
  };
  for (const int64_t experts : {64, 256}) {
    SCOPED_TRACE(str(experts, " experts"));
    const RoutingFit again = routing_statistics(generate_routing(fit, experts, 8, 2048, 7));
    // The popularity over 4x the expert count's tokens: a top share of sorted counts grows with
    // their noise, and 256 experts see a quarter of 64's picks each in as many tokens.
    const RoutingFit longer = experts == 64 ? again : routing_statistics(generate_routing(fit, experts, 8, 8192, 7));
    EXPECT_NEAR(top_share(longer, 0.125), top_share(fit, 0.125), 0.03);
    EXPECT_NEAR(top_share(longer, 0.25), top_share(fit, 0.25), 0.03);
    // Means over the layers: the reuse and the recall within 0.03, the transition and the
    // sequel (favourite-follower tables, argmaxes estimated from the stream itself) within 0.05;
    // each layer's reuse within 0.05. (A layer's transition can stray further: the 64-expert
    // fit's layers 6 and 10 measure 0.06-0.19 against the trace's 0.28-0.29, at every seed.)
    auto mean = [](const std::vector<double>& v, size_t from, size_t to) {
      double s = 0;
      for (size_t i = from; i < to; ++i) s += v[i];
      return s / static_cast<double>(to - from);
    };
    EXPECT_NEAR(mean(again.reuse, 0, 12), mean(fit.reuse, 0, 12), 0.03);
    EXPECT_NEAR(mean(again.recall, 0, 11), mean(fit.recall, 0, 11), 0.03);
    EXPECT_NEAR(mean(again.transition, 1, 12), mean(fit.transition, 1, 12), 0.05);
    EXPECT_NEAR(mean(again.sequel, 0, 12), mean(fit.sequel, 0, 12), 0.05);
    for (size_t l = 0; l < 12; ++l) EXPECT_NEAR(again.reuse[l], fit.reuse[l], 0.05) << "layer " << l;
    if (experts == 64)  // LRU a layer at 1/8, 1/4, 1/2; markov in one pool at 1/4, 1/2
      for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(again.hit_rate[i], fit.hit_rate[i], 0.05) << "hit rate " << i;
  }
  // Deterministic for a seed.
  EXPECT_EQ(generate_routing(fit, 32, 4, 64, 3).rows[100].experts, generate_routing(fit, 32, 4, 64, 3).rows[100].experts);
}

// The model's MoE layers take the replay's rows (the CPU backend routes on the host): resident,
// one forward of several rows, then single rows; the routing observer sees the same rows.
TEST(RoutingReplay, ModelLayersTakeTheReplaysRows) {
  const fs::path pack = tiny_pack("e16k4", 16, 4);
  auto cpu = make_backend("cpu");
  LoadedModel m = load_model(pack, *cpu);
  const Trace trace = read_trace(repo() / "tests" / "fixtures" / "traces" / "routing-model-p0-t0-127.jsonl");
  auto replay = std::make_shared<RoutingReplay>(map_routing_trace(trace, "snippet", {2, 16, 4}, ReplayMapping::fit));
  m.model->set_routing_replay(replay);
  std::vector<Routing> seen[2];
  m.model->set_routing_observer([&](const RoutingEvent& e) {
    const int64_t L = e.layer == 0 ? 0 : 1;  // MoE layers are model layers 0 and 2
    seen[L].push_back(*e.routing);
  });
  auto state = m.model->new_state(16);
  std::vector<float> logits(static_cast<size_t>(m.model->info().n_vocab * 5));
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  m.model->forward(prompt, *state, logits, true);
  m.model->forward(std::vector<int32_t>{6}, *state, logits, false);
  for (int64_t L = 0; L < 2; ++L) {
    ASSERT_EQ(seen[L].size(), 2u);
    EXPECT_EQ(seen[L][0].ids, replay->rows(L, 0, 5, true).ids);
    EXPECT_EQ(seen[L][0].weights, replay->rows(L, 0, 5, true).weights);  // norm_topk_prob: renormalized
    EXPECT_EQ(seen[L][1].ids, replay->rows(L, 5, 1, true).ids);
  }
  // A shape the model does not have is refused.
  EXPECT_THROW(m.model->set_routing_replay(
                   std::make_shared<RoutingReplay>(map_routing_trace(trace, "snippet", {2, 16, 2}, ReplayMapping::fit))),
               Error);
}

namespace {

struct StreamedCounts {
  uint64_t hits = 0, misses = 0, prefetches = 0;
};

// A streamed CPU run of n single-token forwards of `pack` replaying `table`, and its counts.
StreamedCounts streamed_run(const fs::path& pack, const ReplayTable& table, const StreamerOptions& so, int64_t n) {
  auto cpu = make_backend("cpu");
  LoadOptions lo;
  lo.streaming = so;
  LoadedModel m = load_model(pack, *cpu, lo);
  m.model->set_routing_replay(std::make_shared<RoutingReplay>(table));
  auto state = m.model->new_state(n + 1);
  std::vector<float> logits(static_cast<size_t>(m.model->info().n_vocab));
  for (int64_t i = 0; i < n; ++i) m.model->forward(std::vector<int32_t>{static_cast<int32_t>(i % 7)}, *state, logits, false);
  EXPECT_TRUE(m.streamer->drain(std::chrono::seconds(30)));
  const LayerStats t = m.streamer->stats().totals();
  return {t.hits, t.misses, t.prefetch_requests};
}

}  // namespace

// The correspondence: a replayed streamed run of single-token forwards (each MoE layer one
// step of one row) against `sluice simulate` of the same routing (replay_as_trace) with step
// pins and one pool of the run's slots. Without lookahead the counts agree exactly with real
// reads (predictions never handed to the policy: the engine only has them with lookahead);
// with lookahead they agree exactly when every read lands at once (--fake-experts; with real
// reads a prefetch still loading cannot be evicted, which simulate does not model).
TEST(RoutingReplay, StreamedRunReadsWhatSimulatePredicts) {
  const fs::path pack = tiny_pack("e64k8", 64, 8);  // 2 MoE layers of 64 experts, top-8
  const Trace trace = read_trace(repo() / "traces" / "routing-model-gpu-code.jsonl.xz");
  const ReplayTable table = map_routing_trace(trace, "gpu", {2, 64, 8}, ReplayMapping::ids);
  constexpr int64_t kTokens = 160;
  const Trace replayed = replay_as_trace(table, kTokens);
  struct Case {
    int32_t slots;
    PolicyKind policy;
    bool lookahead;
  };
  for (const Case c : {Case{8, PolicyKind::markov, false}, Case{20, PolicyKind::markov, false},
                       Case{40, PolicyKind::lru, false}, Case{64, PolicyKind::markov, false},
                       Case{40, PolicyKind::lfu, false}, Case{24, PolicyKind::markov, true},
                       Case{48, PolicyKind::markov, true}, Case{48, PolicyKind::lru, true}}) {
    StreamerOptions so;
    so.slots = c.slots;
    so.policy = c.policy;
    so.lookahead = c.lookahead;
    so.fake_experts = c.lookahead;
    const StreamedCounts run = streamed_run(pack, table, so, kTokens);
    SimulateOptions o;
    o.slots = c.slots;
    o.policy = c.policy;
    o.pin = PinScope::step;
    o.predictions = c.lookahead ? PredictionTime::after_step : PredictionTime::never;
    o.prefetch = c.lookahead;
    const SimulateResult sim = simulate_trace(replayed, o);
    const std::string what = std::string(policy_name(c.policy)) + " " + std::to_string(c.slots) + " slots" +
                             (c.lookahead ? ", lookahead" : "");
    EXPECT_EQ(run.hits, sim.hits) << what;
    EXPECT_EQ(run.misses, sim.misses) << what;
    EXPECT_EQ(run.hits + run.misses, static_cast<uint64_t>(kTokens * 2 * 8)) << what;
    if (c.lookahead) {
      EXPECT_EQ(run.prefetches, sim.prefetch_reads) << what;
      EXPECT_GT(run.prefetches, 0u) << what;
    }
  }
}
