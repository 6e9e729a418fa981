// An invalid value of an environment switch (core/switches.h) is the command's first error:
// one line naming the variable and what it takes, exit status 1, before any work (sluice
// reads the switches at start, so even `--help` says it); a valid value runs as usual.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>

#include "tests/format/format_test_util.h"
#include "tests/tools/cli/cli_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

// `sluice args...` with the variable `name` set to `value` in its environment (the test
// process's own is put back after: the child inherits it).
CliRun run_with(const ScratchDir& d, const char* name, const char* value, const std::vector<std::string>& args) {
  static int counter = 0;
  const fs::path io = d / ("io" + std::to_string(counter++));
  fs::create_directories(io);
  const char* was = std::getenv(name);
  const std::optional<std::string> old = was ? std::optional<std::string>(was) : std::nullopt;
  setenv(name, value, 1);
  CliRun r = run_cli(args, io);
  if (old) setenv(name, old->c_str(), 1);
  else unsetenv(name);
  return r;
}

TEST(SwitchesCli, AnInvalidValueIsAOneLineErrorAtStart) {
  ScratchDir d;
  for (const auto& [name, value, says] :
       {std::tuple<const char*, const char*, const char*>{"SLUICE_CUDA_GRAPHS", "yes", "1 (on) or 0 (off)"},
        {"SLUICE_THREADS", "many", "an integer from 0 to 1024"},
        {"SLUICE_CUDA_GQA_SHAPE", "4,1", "4 integers"}}) {
    const CliRun r = run_with(d, name, value, {"tokenize", "--help"});
    EXPECT_EQ(r.status, 1) << name << "=" << value << ": " << r.err;
    const std::string want = std::string("sluice: error: environment: ") + name + "=" + value + ": the switch takes " + says;
    EXPECT_EQ(r.err.rfind(want, 0), 0u) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
    EXPECT_EQ(r.out, "") << "no work before the error";
  }
  const CliRun ok = run_with(d, "SLUICE_THREADS", "2", {"tokenize", "--help"});
  EXPECT_EQ(ok.status, 0) << ok.err;
}

}  // namespace
