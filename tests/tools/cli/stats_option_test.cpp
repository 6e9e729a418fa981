// --stats where it does nothing and where it cannot be written: `bench` and `serve` accepted it
// and ignored it; `--stats /sys/kernel/x.json` passed the check before the run (root may write
// anywhere, says access()) and failed only after it. Now the two refuse it in one line and the
// path is proven by creating a file beside it before the model loads.
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_child.h"

using namespace sluice::test;

TEST(StatsOption, RefusedWhereNothingWritesIt) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const std::string stats = (child_scratch("stats-refused") / "s.json").string();
  for (const char* cmd : {"bench", "serve"}) {
    const ChildResult r = run_sluice_child({cmd, "--model", pack, "--expert-slots", "8", "--stats", stats});
    EXPECT_EQ(r.status, 1) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find(std::string("--stats: sluice ") + cmd + " writes no statistics file"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST(StatsOption, AnUnwritableDirectoryFailsBeforeTheRun) {
  const std::string pack = fixture_pack("qwen3_moe").string();
  const ChildResult r = run_sluice_child({"run", "--model", pack, "--expert-slots", "8", "--tokens", "1,2", "-n", "2",
                                          "--stats", "/sys/kernel/sluice-stats.json"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("/sys/kernel/sluice-stats.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cannot be created"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << "the run went ahead: " << r.out;
}
