// sluice bench (llama-bench's flags and table): one markdown row per test in the order asked
// (pp, then tg at each depth, then pp+tg), mean ± standard deviation of positive rates; the
// JSON form with the samples of every repetition; the streaming columns; bad flags one line.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_child.h"

using namespace sluice::test;
using nlohmann::json;

namespace {

std::vector<std::string> table_rows(const std::string& out) {
  std::vector<std::string> rows;
  std::stringstream ss(out);
  std::string line;
  while (std::getline(ss, line))
    if (line.rfind("| ", 0) == 0 && line.find(" ----- ") == std::string::npos && line.find("| model |") == std::string::npos)
      rows.push_back(line);
  return rows;
}

}  // namespace

TEST(BenchCli, TableRowsLikeLlamaBench) {
  const std::string model = fixture_dir("qwen3_moe").string();
  ChildResult r = run_sluice_child({"bench", "--model", model, "-p", "16,8", "-n", "4", "-d", "0,8", "-gp", "8,4", "-r",
                                    "2", "--backend", "cpu"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("| model | size | params | backend | threads | test | t/s |"), std::string::npos) << r.out;
  const auto rows = table_rows(r.out);
  ASSERT_EQ(rows.size(), 5u) << r.out;
  const char* tests[] = {"pp16", "pp8", "tg4", "tg4 @ d8", "pp8+tg4"};
  const std::regex rate(R"(\| ([0-9]+\.[0-9]{2}) ± ([0-9]+\.[0-9]{2}) \|$)");
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_NE(rows[i].find(std::string("| ") + tests[i] + " |"), std::string::npos) << rows[i];
    std::smatch m;
    ASSERT_TRUE(std::regex_search(rows[i], m, rate)) << rows[i];
    EXPECT_GT(std::stod(m[1]), 0.0) << rows[i];
    EXPECT_NE(rows[i].find("| qwen3_moe |"), std::string::npos) << rows[i];
  }
}

TEST(BenchCli, JsonWithSamplesAndStreamingColumns) {
  const std::string pack = fixture_pack("mixtral").string();
  ChildResult r = run_sluice_child({"bench", "--model", pack, "-p", "8", "-n", "3", "-r", "3", "-o", "json", "--backend",
                                    "cpu", "--expert-slots", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["test"], "pp8");
  EXPECT_EQ(j[1]["test"], "tg3");
  for (const json& row : j) {
    EXPECT_EQ(row["repetitions"], 3);
    ASSERT_EQ(row["samples_ts"].size(), 3u);
    double sum = 0;
    for (const json& v : row["samples_ts"]) sum += v.get<double>();
    EXPECT_NEAR(row["avg_ts"].get<double>(), sum / 3, 1e-6 * sum);
    EXPECT_EQ(row["expert_cache_slots"], 2);
    EXPECT_GE(row["hit_rate"].get<double>(), 0.0);
    EXPECT_LE(row["hit_rate"].get<double>(), 1.0);
  }
  // The markdown form adds the streaming columns.
  ChildResult md = run_sluice_child({"bench", "--model", pack, "-p", "8", "-n", "0", "-r", "1", "--backend", "cpu",
                                     "--expert-slots", "2"});
  ASSERT_EQ(md.status, 0) << md.err;
  EXPECT_NE(md.out.find("| expert cache | routing | hit rate | read GB/s | MB/token | IO bound t/s | compute bound t/s | "
                        "of bound |"),
            std::string::npos)
      << md.out;
  EXPECT_NE(md.out.find("slots) | model |"), std::string::npos) << md.out;  // the routing: the model's own
}

// A prompt of the whole context is a test like any other (-p 1024 asked for 1025 positions on a
// 1024-token model, where `run` takes 1 + 1023); so is a decode to the context's end.
TEST(BenchCli, TestsUpToTheWholeContext) {
  const std::string model = fixture_dir("qwen3_moe").string();
  ChildResult r = run_sluice_child({"bench", "--model", model, "--backend", "cpu", "-p", "256", "-n", "0", "-r", "1"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("pp256"), std::string::npos) << r.out;
  r = run_sluice_child({"bench", "--model", model, "--backend", "cpu", "-p", "0", "-n", "200", "-d", "56", "-r", "1"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("tg200 @ d56"), std::string::npos) << r.out;
}

TEST(BenchCli, BadFlagsAreOneLine) {
  const std::string model = fixture_dir("qwen3_moe").string();
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"-p", "x"}, "-p x: expected comma-separated token counts"},
      {{"-p", "0", "-n", "0"}, "no test"},
      {{"-gp", "8"}, "-gp 8: expected PROMPT,GEN"},
      {{"-o", "csv"}, "-o csv: expected md or json"},
      {{"-r", "0"}, "-r"},
      {{"-p", "100000"}, "context limit"},
      // An empty count anywhere, trailing too ("4," was taken where "4,,8" was not).
      {{"-p", "4,"}, "-p 4,: expected comma-separated token counts"},
      {{"-p", "4,,8"}, "-p 4,,8: expected comma-separated token counts"},
      {{"-p", ",4"}, "-p ,4: expected comma-separated token counts"},
      // bench writes no statistics file: --stats was accepted and ignored.
      {{"--expert-slots", "8", "--stats", "s.json"}, "--stats: sluice bench writes no statistics file"},
      // A test one position past the context (the fixture's 256).
      {{"-p", "257", "-n", "0"}, "context limit"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"bench", "--model", model, "--backend", "cpu"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    ChildResult r = run_sluice_child(args);
    EXPECT_EQ(r.status, 1) << c.args[0];
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}
