// The streaming options of the command line: a streamed `sluice run` generates what the
// resident run generates and ends with the summary line, --stats writes consistent JSON,
// `sluice logits` through the streamed prefill matches, and bad options give one clear line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "backends/backend.h"
#include "experts/simulate.h"
#include "format/npy.h"
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using namespace sluice::test;

namespace {

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result run_sluice(const std::string& args) {
  const fs::path d = pack_test_dir("cli-io");
  const std::string cmd =
      std::string(SLUICE_BINARY) + " " + args + " >" + (d / "out").string() + " 2>" + (d / "err").string();
  const int raw = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(d / "out");
  r.err = slurp(d / "err");
  return r;
}

std::string ids_text(const std::string& fixture) {
  FixtureReference ref = read_reference(fixture);
  std::string s;
  for (size_t i = 0; i < ref.prompt_ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ref.prompt_ids[i]);
  }
  return s;
}

}  // namespace

TEST(StreamerCli, RunMatchesResidentAndReports) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const std::string base = "run --model " + pack + " --tokens " + ids_text("qwen3_moe") +
                           " -n 12 --temperature 0 --print-ids --backend cpu";
  Result resident = run_sluice(base);
  ASSERT_EQ(resident.status, 0) << resident.err;
  const fs::path stats = pack_test_dir("cli-stats") / "stats.json";
  Result streamed = run_sluice(base + " --expert-cache 16K --lookahead on --io-depth 4 --policy lru --stats " + stats.string());
  ASSERT_EQ(streamed.status, 0) << streamed.err;
  EXPECT_EQ(streamed.out, resident.out);
  // The last stderr line is the streaming summary.
  std::string err = streamed.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  const std::string last = err.substr(err.rfind('\n') + 1);
  EXPECT_EQ(last.rfind("sluice: streaming: decode ", 0), 0u) << last;
  for (const char* part : {"tok/s", "expert cache 16.0 KiB", "(4 slots, lru)", "hit rate", "GB at", "GB/s"})
    EXPECT_NE(last.find(part), std::string::npos) << part << " in: " << last;
  const nlohmann::json j = nlohmann::json::parse(slurp(stats));
  EXPECT_EQ(j["run"]["cache"]["slots"], 4);
  EXPECT_EQ(j["run"]["cache"]["policy"], "lru");
  EXPECT_EQ(j["run"]["options"]["lookahead"], true);
  EXPECT_EQ(j["run"]["io"]["depth"], 4);
  EXPECT_EQ(j["run"]["decode_tokens"], 11);
  EXPECT_GT(j["run"]["prefill_tokens"].get<int>(), 0);
  uint64_t misses = 0, prefetches = 0;
  for (const auto& l : j["layers"]) {
    EXPECT_EQ(l["hits"].get<uint64_t>() + l["misses"].get<uint64_t>(), l["unique"].get<uint64_t>());
    EXPECT_EQ(l["bytes_read_demand"].get<uint64_t>(), l["misses"].get<uint64_t>() * j["run"]["cache"]["slot_bytes"].get<uint64_t>());
    misses += l["misses"].get<uint64_t>();
    prefetches += l["prefetch_requests"].get<uint64_t>();
  }
  EXPECT_EQ(j["run"]["io"]["reads"].get<uint64_t>(), misses + prefetches);
}

TEST(StreamerCli, LogitsThroughTheStreamedPrefill) {
  const std::string pack = fixture_pack("mixtral").string();
  const fs::path dir = pack_test_dir("cli-logits");
  const std::string base = "logits --model " + pack + " --backend cpu --tokens " + ids_text("mixtral") + " --out ";
  ASSERT_EQ(run_sluice(base + (dir / "resident.npy").string()).status, 0);
  Result r = run_sluice(base + (dir / "streamed.npy").string() + " --expert-slots 2 --stats " + (dir / "s.json").string());
  ASSERT_EQ(r.status, 0) << r.err;
  const sluice::NpyArray a = sluice::read_npy(dir / "resident.npy"), b = sluice::read_npy(dir / "streamed.npy");
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_LE(max_abs_diff(a.data, b.data), 1e-5f);
  const nlohmann::json j = nlohmann::json::parse(slurp(dir / "s.json"));
  EXPECT_GT(j["run"]["prefill_tokens"].get<int>(), 0);
  EXPECT_EQ(j["run"]["decode_tokens"], 0);
}

// --ubatch N prefills in chunks of N tokens: the logits do not change by a bit, whatever N, and
// a streamed prefill split into sub-batches reports its phase counters in --stats and in the
// summary line.
TEST(StreamerCli, UbatchChunksAndPrefillPhaseCounters) {
  const std::string pack = fixture_pack("mixtral").string();
  const fs::path dir = pack_test_dir("cli-ubatch");
  const std::string base = "logits --model " + pack + " --backend cpu --tokens " + ids_text("mixtral") + " --out ";
  ASSERT_EQ(run_sluice(base + (dir / "whole.npy").string()).status, 0);
  const sluice::NpyArray whole = sluice::read_npy(dir / "whole.npy");
  for (const char* ub : {"1", "3", "7"}) {
    SCOPED_TRACE(std::string("--ubatch ") + ub);
    const fs::path out = dir / (std::string("ub") + ub + ".npy");
    Result r = run_sluice(base + out.string() + " --ubatch " + ub + " --expert-slots 2 --stats " + (dir / "s.json").string());
    ASSERT_EQ(r.status, 0) << r.err;
    const sluice::NpyArray got = sluice::read_npy(out);
    ASSERT_EQ(got.shape, whole.shape);
    EXPECT_EQ(got.data, whole.data) << "chunked prefill changed the logits";
    const nlohmann::json j = nlohmann::json::parse(slurp(dir / "s.json"));
    const auto& pre = j["run"]["phases"]["prefill"];
    EXPECT_EQ(pre["rows"].get<uint64_t>(), whole.shape[0] * j["layers"].size());
    EXPECT_GE(pre["steps"].get<uint64_t>(), j["layers"].size());
    EXPECT_EQ(j["run"]["phases"]["decode"]["steps"], 0);
    EXPECT_GT(j["run"]["tokens_per_sub_batch"].get<double>(), 0.0);
  }
  // Two slots of top-2 experts: every sub-batch is a token or two, so the summary has its
  // prefill part.
  Result r = run_sluice(base + (dir / "s.npy").string() + " --expert-slots 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("| prefill "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sub-batches a layer of"), std::string::npos) << r.err;
  // A generation: the prompt in chunks of 5 is prefill, each generated token after the first a
  // decode step of every layer.
  const fs::path rs = dir / "run.json";
  Result run = run_sluice("run --model " + pack + " --backend cpu --tokens " + ids_text("mixtral") +
                          " -n 6 --temperature 0 --ignore-eos --ubatch 5 --expert-slots 3 --stats " + rs.string());
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json jr = nlohmann::json::parse(slurp(rs));
  const uint64_t n_layers = jr["layers"].size();
  EXPECT_EQ(jr["run"]["phases"]["decode"]["rows"].get<uint64_t>(), 5 * n_layers);
  EXPECT_EQ(jr["run"]["phases"]["decode"]["steps"].get<uint64_t>(), 5 * n_layers);
  EXPECT_EQ(jr["run"]["phases"]["prefill"]["rows"].get<uint64_t>(), whole.shape[0] * n_layers);
  for (const char* bad : {"0", "-3", "70000", "x"}) {
    Result b = run_sluice(base + (dir / "bad.npy").string() + " --ubatch " + bad);
    EXPECT_EQ(b.status, 1) << bad;
    EXPECT_NE(b.err.find("--ubatch"), std::string::npos) << b.err;
  }
}

TEST(StreamerCli, BadOptionsGiveOneClearLine) {
  const std::string pack = fixture_pack("qwen3_moe_yarn").string();
  const std::string base = "run --model " + pack + " --backend cpu --tokens 1,2,3 -n 2 ";
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"--expert-slots 2", "the minimum is 3 slots"},
      {"--expert-cache 4K", "the minimum is 3 slots"},
      {"--policy lru", "--policy is an expert streaming option"},
      {"--stats x.json", "--stats is an expert streaming option"},
      {"--expert-cache 12Q", "--expert-cache: '12Q' is not a size"},
      {"--expert-slots 8 --lookahead maybe", "--lookahead: 'maybe' (on or off)"},
      {"--expert-slots 8 --io fast", "--io: 'fast' (direct or buffered)"},
      {"--expert-slots 8 --policy belady", "belady is for sluice simulate only"},
      {"--expert-slots 8 --miss-kind q4", "is the kind the run already uses"},
      {"--expert-slots 8 --miss-kind q3", "--miss-kind: unknown kind 'q3'"},
      {"--fake-experts", "--fake-experts is an expert streaming option"},
      {"--wait block", "--wait is an expert streaming option"},
      {"--expert-slots 8 --wait hot", "--wait: 'hot' (spin or block)"},
      {"--expert-slots 8 --profile turbo", "--profile: 'turbo' (exact or fast)"},
      {"--profile fast", "--profile fast is an expert streaming option"},
      {"--deadline-worst-case", "--deadline-worst-case is an expert streaming option"},
      {"--kl-check 0", "--kl-check 0: expected an integer, 1 or more"},
      {"--kl-check x", "--kl-check x: expected an integer, 1 or more"},
      {"--expert-slots 8 --cut 0.5 --fake-experts --kl-check 2", "--kl-check cannot measure --fake-experts"},
  };
  for (const Case& c : cases) {
    Result r = run_sluice(base + c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_NE(r.err.find("sluice: error: "), std::string::npos) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
  }
  // A CUDA streaming run in a build without CUDA (or without a GPU) says so.
  if (!sluice::cuda_built()) {
    Result c = run_sluice("run --model " + pack + " --backend cuda --tokens 1,2,3 -n 2 --expert-slots 8");
    EXPECT_EQ(c.status, 1);
    EXPECT_NE(c.err.find("without CUDA"), std::string::npos) << c.err;
  }
  // Streaming needs a pack.
  Result r = run_sluice("run --model " + fixture_dir("qwen3_moe_yarn").string() + " --tokens 1,2 --expert-slots 8");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("needs a pack"), std::string::npos) << r.err;
}

// --trace-routing with --lookahead on: every record also carries the next MoE layer's
// predicted experts (as many as the router picks), which `sluice simulate` reads back and
// replays; the streamed run with the markov policy still generates what the resident run
// does. Without lookahead the records have no prediction.
TEST(StreamerCli, RoutingTraceCarriesPredictions) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const std::string base = "run --model " + pack + " --tokens " + ids_text("qwen3_moe") +
                           " -n 6 --temperature 0 --print-ids --backend cpu";
  Result resident = run_sluice(base);
  ASSERT_EQ(resident.status, 0) << resident.err;
  const fs::path dir = pack_test_dir("cli-trace-pred");
  const fs::path with = dir / "with.jsonl", without = dir / "without.jsonl";
  Result streamed = run_sluice(base + " --expert-cache 16K --lookahead on --policy markov --trace-routing " + with.string());
  ASSERT_EQ(streamed.status, 0) << streamed.err;
  EXPECT_EQ(streamed.out, resident.out);
  EXPECT_NE(streamed.err.find("markov"), std::string::npos) << streamed.err;
  const sluice::Trace t = sluice::read_trace(with);
  EXPECT_TRUE(t.has_predictions);
  size_t predicted = 0;
  for (const sluice::TraceRow& r : t.rows) {
    if (r.layer + 1 >= t.n_layer) {
      EXPECT_TRUE(r.predicted_next.empty()) << "the last MoE layer has no next layer";
      continue;
    }
    ++predicted;
    EXPECT_GT(r.next_layer, r.layer);
    EXPECT_EQ(r.predicted_next.size(), r.experts.size());
  }
  EXPECT_GT(predicted, 0u);
  sluice::SimulateOptions so;
  so.slots = 2 * t.top_k;
  so.pin = sluice::PinScope::step;
  so.policy = sluice::PolicyKind::markov;
  const sluice::SimulateResult sr = sluice::simulate_trace(t, so);
  size_t routed = 0;
  for (const sluice::TraceRow& r : t.rows) routed += r.experts.size();
  EXPECT_EQ(sr.hits + sr.misses, routed);

  ASSERT_EQ(run_sluice(base + " --trace-routing " + without.string()).status, 0);
  EXPECT_FALSE(sluice::read_trace(without).has_predictions);
  EXPECT_EQ(slurp(without).find("predicted_next"), std::string::npos);
}

// --kl-check: an exact run says 0 by construction; a run whose deadline cuts (every miss late,
// so it does not depend on the disk) measures a divergence above 0; both go into --stats. A
// family with recurrent state is refused in one line.
TEST(StreamerCli, KlCheckReportsAndWritesStats) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const std::string base = "run --model " + pack + " --tokens " + ids_text("qwen3_moe") +
                           " -n 12 --temperature 0 --backend cpu --expert-kind q4 --expert-slots 2 --kl-check 4 ";
  const fs::path stats = pack_test_dir("cli-kl") / "stats.json";
  Result exact = run_sluice(base + "--stats " + stats.string());
  ASSERT_EQ(exact.status, 0) << exact.err;
  EXPECT_NE(exact.err.find("sluice: kl-check: 0 nats/token by construction"), std::string::npos) << exact.err;
  nlohmann::json j = nlohmann::json::parse(slurp(stats))["run"]["kl_check"];
  EXPECT_EQ(j["by_construction"], true);
  EXPECT_EQ(j["steps"], 0);
  EXPECT_EQ(j["mean_nats"], 0.0);

  Result cut = run_sluice(base + "--cut 1 --deadline-worst-case --stats " + stats.string());
  ASSERT_EQ(cut.status, 0) << cut.err;
  EXPECT_NE(cut.err.find("nats/token KL(exact || lossy) over 4 of 11 decode steps"), std::string::npos) << cut.err;
  j = nlohmann::json::parse(slurp(stats))["run"]["kl_check"];
  EXPECT_EQ(j["by_construction"], false);
  EXPECT_EQ(j["steps"], 4);
  EXPECT_EQ(j["decode_steps"], 11);
  EXPECT_GT(j["mean_nats"].get<double>(), 0.0);
  EXPECT_GE(j["max_nats"].get<double>(), j["mean_nats"].get<double>());

  // Without --kl-check the field is null.
  Result off = run_sluice("run --model " + pack + " --tokens 1,2,3 -n 2 --backend cpu --expert-slots 2 --stats " +
                          stats.string());
  ASSERT_EQ(off.status, 0) << off.err;
  EXPECT_TRUE(nlohmann::json::parse(slurp(stats))["run"]["kl_check"].is_null());
  EXPECT_EQ(off.err.find("kl-check"), std::string::npos) << off.err;

  // Without streaming the resident run is the exact one.
  Result resident = run_sluice("run --model " + pack + " --tokens 1,2,3 -n 2 --backend cpu --kl-check 2");
  ASSERT_EQ(resident.status, 0) << resident.err;
  EXPECT_NE(resident.err.find("by construction"), std::string::npos) << resident.err;

  // A hybrid family (its recurrent state copied and put back around the exact step:
  // KlCheck.HybridFamiliesRerunTheirRecurrentState) is checked like the others.
  Result hybrid = run_sluice("run --model " + fixture_pack("qwen3_next").string() +
                             " --tokens 1,2,3 -n 3 --ignore-eos --backend cpu --expert-slots 8 --cut 0.5 --kl-check 2");
  ASSERT_EQ(hybrid.status, 0) << hybrid.err;
  EXPECT_NE(hybrid.err.find("sluice: kl-check: mean "), std::string::npos) << hybrid.err;
  EXPECT_NE(hybrid.err.find("over 2 of 2 decode steps"), std::string::npos) << hybrid.err;
}

// --profile fast sets --cut (docs/profile.md) and nothing else; an explicit --cut overrides
// it (--cut 0 turns the deadline off again); the other lossy options combine with it.
TEST(StreamerCli, ProfileFastSetsTheDocumentedOptions) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const fs::path stats = pack_test_dir("cli-profile") / "stats.json";
  const std::string base = "run --model " + pack + " --tokens 1,2,3 -n 3 --temperature 0 --backend cpu --expert-kind q4 "
                           "--expert-slots 4 --stats " + stats.string() + " ";
  auto options = [&](const std::string& args) {
    Result r = run_sluice(base + args);
    EXPECT_EQ(r.status, 0) << args << ": " << r.err;
    return nlohmann::json::parse(slurp(stats))["run"]["options"];
  };
  nlohmann::json o = options("--profile fast");
  EXPECT_TRUE(o["cut"].is_null());
  EXPECT_DOUBLE_EQ(o["cut_share"].get<double>(), 0.4);  // of the uniform weight: 0.2 at this fixture's top-2
  EXPECT_TRUE(o["miss_kind"].is_null());
  EXPECT_EQ(o["lookahead"], false);
  o = options("--profile fast --cut 0.05 --miss-kind q2 --lookahead on");
  EXPECT_DOUBLE_EQ(o["cut"].get<double>(), 0.05);
  EXPECT_TRUE(o["cut_share"].is_null());
  EXPECT_EQ(o["miss_kind"], "q2");
  EXPECT_EQ(o["lookahead"], true);
  o = options("--profile fast --cut 0");
  EXPECT_TRUE(o["cut"].is_null());
  EXPECT_TRUE(o["cut_share"].is_null());
  for (const char* exact : {"--profile exact", ""}) {
    o = options(exact);
    EXPECT_TRUE(o["cut"].is_null()) << exact;
    EXPECT_TRUE(o["cut_share"].is_null()) << exact;
    EXPECT_TRUE(o["miss_kind"].is_null()) << exact;
  }
}
