// Replayed routing on the GPU (--replay-routing; experts/routing_replay.h): the device stores
// the replay's rows where its top-k would store the router's (launch_router_replay), so
//  - streamed (the CUDA streamer: decode steps through the handshake, a prompt through the
//    grouped path when its union passes the cache, lookahead from the replay's predictions),
//    every routing decision the device made is the replay's row of its turn, and the logits
//    are the CPU streamer's of the same replay within 1e-3;
//  - resident (device expert tables, Backend::moe_routed), the logits are the CPU's of the
//    same replay within 1e-3 (the step runs eagerly: a replay never runs as a captured graph).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "experts/cuda/cuda_streamer.h"
#include "experts/routing_replay.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

fs::path snippet(const std::string& name) { return sluice::test::source_dir() / "tests" / "fixtures" / "traces" / name; }

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = a.size() == b.size() ? 0.0f : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

LoadedModel load_replayed(const fs::path& pack, Backend& be, std::optional<StreamerOptions> so, const ReplayTable& t) {
  LoadOptions lo;
  lo.expert_kind = DType::q4;
  lo.streaming = std::move(so);
  LoadedModel m = load_model(pack, be, lo);
  m.model->set_routing_replay(std::make_shared<RoutingReplay>(t));
  return m;
}

// n decode steps one token at a time, then one forward of n tokens: the logits of both.
std::vector<float> run_logits(Model& m, int64_t n) {
  const int64_t V = m.info().n_vocab;
  std::vector<float> out;
  auto state = m.new_state(n);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> l(static_cast<size_t>(V));
    const int32_t id = static_cast<int32_t>(3 + i);
    m.forward(std::span<const int32_t>(&id, 1), *state, l, false);
    out.insert(out.end(), l.begin(), l.end());
  }
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(5 + i);
  std::vector<float> prefill(static_cast<size_t>(n * V));
  auto fresh = m.new_state(n);
  m.forward(ids, *fresh, prefill, true);
  out.insert(out.end(), prefill.begin(), prefill.end());
  return out;
}

}  // namespace

TEST(CudaReplay, StreamedDecisionsAreTheReplaysRows) {
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const fs::path& pack = fixture_pack("qwen3_moe");  // 2 MoE layers (model layers 0, 2) of 8 experts, top-2
  constexpr int64_t kTokens = 24;
  for (const char* trace : {"mixtral-humaneval-p0-l0-3.jsonl", "routing-model-p0-t0-127.jsonl"}) {
    const ReplayTable t = map_routing_trace(read_trace(snippet(trace)), trace, {2, 8, 2}, ReplayMapping::automatic);
    for (int32_t slots : {2, 3, 8}) {
      for (bool lookahead : {false, true}) {
        SCOPED_TRACE(str(trace, " slots ", slots, " lookahead ", lookahead));
        StreamerOptions so;
        so.slots = slots;
        so.lookahead = lookahead;
        so.wait_timeout = std::chrono::seconds(10);
        LoadedModel mg = load_replayed(pack, *gpu, so, t);
        LoadedModel mc = load_replayed(pack, *cpu, so, t);
        auto* cs = dynamic_cast<CudaStreamer*>(mg.streamer.get());
        ASSERT_NE(cs, nullptr);
        std::vector<RoutingEvent> seen;
        std::vector<Routing> routings;
        cs->set_routing_observer([&](const RoutingEvent& ev) {
          routings.push_back(*ev.routing);
          seen.push_back({ev.layer, ev.first_position, nullptr, nullptr, -1});
        });
        const std::vector<float> g = run_logits(*mg.model, kTokens);
        const std::vector<float> c = run_logits(*mc.model, kTokens);
        EXPECT_LE(max_diff(g, c), 1e-3f) << "logits";
        // The decode steps took rows 0..kTokens-1 of each layer, then the prompt kTokens..2 kTokens-1.
        const RoutingReplay replay(t);
        ASSERT_EQ(routings.size(), static_cast<size_t>(2 * (kTokens + 1)));
        int64_t call[2] = {0, 0};
        for (size_t i = 0; i < routings.size(); ++i) {
          const int64_t L = seen[i].layer == 0 ? 0 : 1;
          const int64_t n = routings[i].n_rows, first = call[L] < kTokens ? call[L] : kTokens;
          const Routing want = replay.rows(L, first, n, /*normalize=*/true);
          EXPECT_EQ(routings[i].ids, want.ids) << "decision " << i;
          EXPECT_LE(max_diff(routings[i].weights, want.weights), 1e-7f) << "decision " << i;
          ++call[L];
        }
        ASSERT_TRUE(mg.streamer->drain(std::chrono::seconds(10)));
        const RunStats r = mg.streamer->stats();
        for (const std::string& e : r.consistency_errors()) ADD_FAILURE() << e;
        if (lookahead && slots > 3 && t.mapping == "fit")  // the generator's predictions are the lookahead's
          EXPECT_GT(r.totals().prefetch_requests + r.totals().prefetch_already, 0u);
      }
    }
  }
}

TEST(CudaReplay, ResidentLogitsAreTheCpusOfTheSameReplay) {
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const fs::path& pack = fixture_pack("qwen3_moe");
  const char* trace = "mixtral-humaneval-p0-l0-3.jsonl";
  const ReplayTable t = map_routing_trace(read_trace(snippet(trace)), trace, {2, 8, 2}, ReplayMapping::automatic);
  LoadedModel mg = load_replayed(pack, *gpu, std::nullopt, t);
  LoadedModel mc = load_replayed(pack, *cpu, std::nullopt, t);
  const std::vector<float> g = run_logits(*mg.model, 24);
  const std::vector<float> c = run_logits(*mc.model, 24);
  EXPECT_LE(max_diff(g, c), 1e-3f);
  // And not the model's own routing: without the replay the logits differ.
  LoadedModel own = load_replayed(pack, *cpu, std::nullopt, t);
  own.model->set_routing_replay(nullptr);
  EXPECT_GT(max_diff(run_logits(*own.model, 24), c), 1e-3f);
}
