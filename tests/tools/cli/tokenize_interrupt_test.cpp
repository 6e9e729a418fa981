// `sluice tokenize --out` stopped by SIGINT or SIGTERM: the unfinished OUT.tmp (12 MB to 1 GB,
// and from /dev/zero growing ~50 MB/s) was left behind. Now the run stops at the next piece,
// removes it, leaves OUT untouched and exits 130.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "tests/models/fixture_util.h"
#include "tests/tools/cli/cli_child.h"

namespace fs = std::filesystem;
using namespace sluice::test;

TEST(TokenizeInterrupt, AnInterruptedOutLeavesNoTemporaryFile) {
  for (int sig : {SIGINT, SIGTERM}) {
    const fs::path dir = child_scratch("tokenize-interrupt-" + std::to_string(sig));
    const fs::path out = dir / "ids.txt", tmp = dir / "ids.txt.tmp";
    std::ofstream(out) << "old";
    ChildOptions co;
    bool grew = false;
    co.on_start = [&](pid_t pid, const fs::path&, const fs::path&) {
      std::error_code ec;
      grew = wait_for([&] { return fs::exists(tmp, ec) && fs::file_size(tmp, ec) > (1u << 20); }, 60);
      ::kill(pid, sig);
    };
    const ChildResult r = run_sluice_child(
        {"tokenize", "--model", fixture_dir("qwen3_moe").string(), "--file", "/dev/zero", "--out", out.string()}, co);
    EXPECT_TRUE(grew) << "the output never grew: " << r.err;
    EXPECT_EQ(r.status, 130) << r.err;
    EXPECT_NE(r.err.find("interrupted"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(tmp)) << "signal " << sig;
    std::ifstream f(out);
    std::string old;
    f >> old;
    EXPECT_EQ(old, "old");
  }
}
