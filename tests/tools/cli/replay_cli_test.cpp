// --replay-routing on the command line: a replayed `sluice run` routes exactly the mapped
// trace's rows (recorded with --trace-routing, lookahead's predictions and --kl-check's exact
// steps included) and says so in its summary and --stats; `sluice bench` labels its rows and
// gives each streamed row its IO bound; `sluice simulate --map` replays what a run would; and
// logits, perplexity and serve refuse it, as do bad mappings, each in one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_child.h"
#include "experts/routing_replay.h"
#include "experts/simulate.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

fs::path snippet(const std::string& name) { return source_dir() / "tests" / "fixtures" / "traces" / name; }
const char* kMixtral = "mixtral-humaneval-p0-l0-3.jsonl";       // 8 experts, top-2, 4 layers
const char* kRoutingModel = "routing-model-p0-t0-127.jsonl";    // 64 experts, top-8, 6 layers, predictions

// Every recorded row (model layers 0 and 2: the fixture's MoE layers) against the replay's row
// of its position; with predictions, those too.
void expect_rows_replayed(const fs::path& recorded, const RoutingReplay& replay, bool predictions) {
  const Trace got = read_trace(recorded);
  ASSERT_FALSE(got.rows.empty());
  for (const TraceRow& r : got.rows) {
    ASSERT_TRUE(r.layer == 0 || r.layer == 2) << r.layer;
    const int64_t L = r.layer == 0 ? 0 : 1;
    const Routing want = replay.rows(L, r.token, 1, /*normalize=*/true);  // qwen3_moe: norm_topk_prob
    EXPECT_EQ(r.experts, want.ids) << "layer " << r.layer << " token " << r.token;
    EXPECT_EQ(r.weights, want.weights) << "layer " << r.layer << " token " << r.token;
    if (!predictions) continue;
    std::vector<int32_t> pred;
    if (const std::optional<Routing> p = replay.predicted(L, r.token, 1))
      for (int32_t e : p->ids)
        if (e >= 0) pred.push_back(e);
    EXPECT_EQ(r.predicted_next, pred) << "layer " << r.layer << " token " << r.token;
  }
}

std::string last_line(std::string err) {
  while (!err.empty() && err.back() == '\n') err.pop_back();
  return err.substr(err.rfind('\n') + 1);
}

}  // namespace

TEST(ReplayCli, RunRoutesTheMappedTraceAndSaysSo) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const fs::path dir = child_scratch("replay-run");
  const fs::path trace = snippet(kMixtral), recorded = dir / "routing.jsonl", stats = dir / "stats.json";
  // A streamed run with a prompt of 4 tokens (one forward of 4 rows) and 30 decode steps: the
  // stream's tokens 0..33 (the Mixtral snippet has 83).
  ChildResult r = run_sluice_child({"run", "--model", pack, "--tokens", "1,2,3,4", "-n", "31", "--temperature", "0",
                                    "--backend", "cpu", "--expert-slots", "3", "--replay-routing", trace.string(),
                                    "--trace-routing", recorded.string(), "--stats", stats.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  const ReplayTable table = map_routing_trace(read_trace(trace), kMixtral, {2, 8, 2}, ReplayMapping::automatic);
  EXPECT_EQ(table.mapping, "ids");
  expect_rows_replayed(recorded, RoutingReplay(table), false);
  EXPECT_EQ(read_trace(recorded).rows.size(), 2u * 34u);
  EXPECT_NE(r.err.find(std::string("sluice: replayed routing from ") + kMixtral + " (ids: tokens: 1 problem in a stream of "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(std::string("| replayed routing: ") + kMixtral + ", ids\n"), std::string::npos) << r.err;
  const std::string summary = last_line(r.err);
  EXPECT_EQ(summary.rfind(std::string("sluice: streaming: decode "), 0), 0u) << summary;
  EXPECT_NE(summary.find(std::string("tok/s (replayed routing: ") + kMixtral + ", ids) | expert cache"), std::string::npos)
      << summary;
  const json j = json::parse(read_text(stats));
  EXPECT_EQ(j["run"]["routing"]["replayed"], true);
  EXPECT_EQ(j["run"]["routing"]["trace"], kMixtral);
  EXPECT_EQ(j["run"]["routing"]["mapping"], "ids");
  EXPECT_NE(j["run"]["routing"]["rule"].get<std::string>().find("MoE layer L reads trace layer L mod 4"), std::string::npos);

  // Without a replay the statistics say the model routed.
  ChildResult own = run_sluice_child({"run", "--model", pack, "--tokens", "1,2", "-n", "3", "--backend", "cpu",
                                      "--expert-slots", "3", "--stats", stats.string()});
  ASSERT_EQ(own.status, 0) << own.err;
  EXPECT_EQ(json::parse(read_text(stats))["run"]["routing"], json({{"replayed", false}}));
  EXPECT_EQ(own.err.find("replayed"), std::string::npos) << own.err;
}

// A fitted generator (64 experts top-8 onto the fixture's 8 top-2) with lookahead: the recorded
// predictions are the replay's; with --kl-check the exact step of a checked position takes the
// same rows as the lossy one (both recorded at the position).
TEST(ReplayCli, FitWithLookaheadAndKlCheckReplayTheSameRows) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const fs::path dir = child_scratch("replay-fit");
  const fs::path trace = snippet(kRoutingModel), recorded = dir / "routing.jsonl";
  ChildResult r = run_sluice_child({"run", "--model", pack, "--tokens", "5", "-n", "24", "--temperature", "0",
                                    "--backend", "cpu", "--expert-slots", "4", "--lookahead", "on", "--cut", "0.45",
                                    "--kl-check", "6", "--replay-routing", trace.string(), "--trace-routing",
                                    recorded.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("sluice: routing fit: reuse "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sluice: kl-check: mean "), std::string::npos) << r.err;
  const ReplayTable table = map_routing_trace(read_trace(trace), kRoutingModel, {2, 8, 2}, ReplayMapping::automatic);
  EXPECT_EQ(table.mapping, "fit");
  expect_rows_replayed(recorded, RoutingReplay(table), true);
  // 1 prompt token and 23 decode steps, 6 of them checked (recorded twice), 2 MoE layers.
  EXPECT_EQ(read_trace(recorded).rows.size(), 2u * (24u + 6u));
}

TEST(ReplayCli, BenchLabelsItsRowsWithTheRoutingAndTheBound) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const std::string trace = snippet(kMixtral).string();
  ChildResult md = run_sluice_child({"bench", "--model", pack, "-p", "4", "-n", "4", "-r", "2", "--backend", "cpu",
                                     "--expert-slots", "3", "--replay-routing", trace});
  ASSERT_EQ(md.status, 0) << md.err;
  EXPECT_NE(md.out.find(std::string("routing: replayed from ") + kMixtral + " (ids: "), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("\ndisk: "), std::string::npos) << md.out;
  EXPECT_NE(md.out.find(" records at depth 8, "), std::string::npos) << md.out;
  EXPECT_EQ(std::count(md.out.begin(), md.out.end(), '\n'), 3 + 2 + 2) << md.out;  // 2 lines, a blank, head, 2 rows
  EXPECT_NE(md.out.find("slots) | replay:mixtral-humaneval-p0-l0-3/ids | "), std::string::npos) << md.out;

  ChildResult js = run_sluice_child({"bench", "--model", pack, "-p", "0", "-n", "6", "-r", "1", "--backend", "cpu",
                                     "--expert-slots", "3", "--replay-routing", trace, "-o", "json"});
  ASSERT_EQ(js.status, 0) << js.err;
  const json rows = json::parse(js.out);
  ASSERT_EQ(rows.size(), 1u);
  const json& row = rows[0];
  EXPECT_EQ(row["routing"]["replayed"], true);
  EXPECT_EQ(row["routing"]["trace"], kMixtral);
  EXPECT_GT(row["disk_read_bytes_per_second"].get<double>(), 0.0);
  EXPECT_GT(row["compute_bound_ts"].get<double>(), 0.0);
  EXPECT_GT(row["bytes_read_per_token"].get<double>(), 0.0);  // 3 of 16 records cached: it reads
  EXPECT_GT(row["io_bound_ts"].get<double>(), 0.0);
  EXPECT_NEAR(row["bound_ts"].get<double>(),
              std::min(row["io_bound_ts"].get<double>(), row["compute_bound_ts"].get<double>()), 1e-9);
  EXPECT_NEAR(row["of_bound"].get<double>(), row["bound_ts"].get<double>() / row["avg_ts"].get<double>(), 1e-9);

  // A resident bench replays too, and says so in a column of its own.
  ChildResult resident = run_sluice_child({"bench", "--model", pack, "-p", "0", "-n", "3", "-r", "1", "--backend",
                                           "cpu", "--replay-routing", trace});
  ASSERT_EQ(resident.status, 0) << resident.err;
  EXPECT_NE(resident.out.find("| t/s | routing |"), std::string::npos) << resident.out;
  EXPECT_NE(resident.out.find(" | replay:mixtral-humaneval-p0-l0-3/ids |"), std::string::npos) << resident.out;
}

TEST(ReplayCli, SimulateMapsAsTheRunWould) {
  const fs::path dir = child_scratch("replay-simulate");
  ChildResult r = run_sluice_child({"simulate", "--trace", snippet(kRoutingModel).string(), "--map", "3,64,4",
                                    "--tokens", "100", "--expert-slots", "40", "--pin", "step", "--policy", "lru",
                                    "--write-trace", (dir / "mapped.jsonl").string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("lru 0.", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("sluice: mapped (ids): "), std::string::npos) << r.err;
  const Trace mapped = read_trace(dir / "mapped.jsonl");
  EXPECT_EQ(mapped.rows.size(), 300u);
  EXPECT_EQ(mapped.n_layer, 3);
  EXPECT_EQ(mapped.top_k, 4);
  // The mapped trace replays as the mapping gives it.
  const ReplayTable t = map_routing_trace(read_trace(snippet(kRoutingModel)), "x", {3, 64, 4}, ReplayMapping::automatic);
  EXPECT_EQ(mapped.rows[5].experts, replay_as_trace(t, 100).rows[5].experts);
}

TEST(ReplayCli, RefusalsAreOneLine) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const std::string trace = snippet(kMixtral).string();
  const fs::path dir = child_scratch("replay-refusals");
  std::ofstream(dir / "text.txt") << "some text to score\n";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"logits", "--tokens", "1,2", "--out", (dir / "l.npy").string(), "--replay-routing", trace},
       "--replay-routing: sluice logits computes with the model's own routing"},
      {{"perplexity", "--file", (dir / "text.txt").string(), "--replay-routing", trace},
       "--replay-routing: sluice perplexity computes with the model's own routing"},
      {{"serve", "--replay-routing", trace}, "--replay-routing: sluice serve computes with the model's own routing"},
      {{"run", "--tokens", "1", "--replay-map", "ids"}, "--replay-map needs --replay-routing TRACE"},
      {{"run", "--tokens", "1", "--replay-routing", trace, "--replay-map", "best"}, "--replay-map: 'best' (auto, ids or fit)"},
      {{"run", "--tokens", "1", "--replay-routing", (dir / "none.jsonl").string()}, "--replay-routing"},
      {{"run", "--tokens", "1", "--replay-routing", snippet(kRoutingModel).string(), "--replay-map", "ids"},
       "--replay-map ids: the trace routing-model-p0-t0-127.jsonl routes among 64 experts a layer and the pack has 8"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.begin() + 1, {"--model", pack, "--backend", "cpu"});
    ChildResult r = run_sluice_child(args);
    EXPECT_EQ(r.status, 1) << c.message << ": " << r.err;
    EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}
