// The command-line contract: exact spellings of run/logits, greedy output equal to the
// reference continuation, and bad input giving one clear line on stderr and a non-zero exit
// status, never a crash.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/models/fixture_util.h"
#include "format/npy.h"

namespace fs = std::filesystem;
using namespace sluice::test;

namespace {

struct Result {
  int status = -1;       // exit status; -1 when killed by a signal
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sluice-cli-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Result sluice(const std::string& args) {
  fs::path d = temp_dir("io");
  std::string cmd = std::string(SLUICE_BINARY) + " " + args + " >" + (d / "out").string() + " 2>" + (d / "err").string();
  int raw = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(d / "out");
  r.err = slurp(d / "err");
  return r;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';  // not "," + to_string(...): GCC 12 warns (-Wrestrict, a false positive) on that
    s += std::to_string(ids[i]);
  }
  return s;
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
}

// One line on stderr, starting with "sluice: error:", and a clean non-zero exit.
void expect_clean_error(const Result& r, const std::string& must_contain) {
  EXPECT_GT(r.status, 0) << "status " << r.status << " (-1: killed by a signal)\n" << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << "expected '" << must_contain << "' in: " << r.err;
}

TEST(Cli, RunGreedyPrintsReferenceContinuation) {
  for (const auto& name : model_fixtures()) {
    FixtureReference ref = read_reference(name);
    Result r = sluice("run --model " + fixture_dir(name).string() + " --tokens " + join(ref.prompt_ids) +
                      " -n " + std::to_string(ref.continuation_ids.size()) +
                      " --temperature 0 --ignore-eos --print-ids");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(last_line(r.out), join(ref.continuation_ids)) << name;
    EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;  // the summary line
  }
}

TEST(Cli, LogitsWritesNpyMatchingReference) {
  FixtureReference ref = read_reference("olmoe");
  fs::path out = temp_dir("logits") / "l.npy";
  Result r = sluice("logits --model " + fixture_dir("olmoe").string() + " --tokens " + join(ref.prompt_ids) +
                    " --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  sluice::NpyArray got = sluice::read_npy(out), want = sluice::read_npy(fixture_dir("olmoe") / "logits_prompt.npy");
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_LE(max_abs_diff(got.data, want.data), 1e-4f);
}

TEST(Cli, SeededSamplingIsReproducible) {
  std::string args = "run --model " + fixture_dir("mixtral").string() +
                     " --tokens 5,6,7 -n 12 --temperature 1.0 --top-k 50 --top-p 0.9 --seed 7 --ignore-eos --print-ids";
  Result a = sluice(args), b = sluice(args);
  ASSERT_EQ(a.status, 0) << a.err;
  const std::string ids = last_line(a.out);
  EXPECT_EQ(ids, last_line(b.out));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ','), 11);
}

TEST(Cli, BadInputGivesOneClearLine) {
  const std::string model = " --model " + fixture_dir("qwen3_moe").string();
  expect_clean_error(sluice("run --model /nonexistent/model --tokens 1"), "/nonexistent/model");
  expect_clean_error(sluice("run" + model + " --tokens 1,x"), "'x' is not a token id");
  expect_clean_error(sluice("run" + model + " --tokens 1,-3"), "is not a token id");
  expect_clean_error(sluice("run" + model + " --tokens 99999"), "outside the vocabulary");
  expect_clean_error(sluice("run" + model), "--prompt or --tokens");

  // A copy of a fixture with a broken file at a time.
  auto broken = [&](const std::string& what, auto&& mutate) {
    fs::path d = temp_dir(what);
    for (const auto& e : fs::directory_iterator(fixture_dir("qwen3_moe"))) fs::copy(e.path(), d / e.path().filename());
    mutate(d);
    return sluice("run --model " + d.string() + " --tokens 1,2");
  };
  expect_clean_error(broken("config-syntax", [](const fs::path& d) { std::ofstream(d / "config.json") << "{\"model_type\": "; }),
                     "config.json");
  expect_clean_error(broken("config-family", [](const fs::path& d) {
                       std::ofstream(d / "config.json") << R"({"model_type": "llama_moe_9000"})";
                     }),
                     "supported: qwen3_moe");
  expect_clean_error(broken("config-field", [](const fs::path& d) {
                       std::string c = slurp(d / "config.json");
                       const std::string key = "\"num_experts_per_tok\": 2";
                       const size_t at = c.find(key);
                       ASSERT_NE(at, std::string::npos);
                       std::ofstream(d / "config.json") << c.substr(0, at) << "\"num_experts_per_tok\": 12"
                                                        << c.substr(at + key.size());
                     }),
                     "num_experts_per_tok (12) exceeds num_experts (8)");
  expect_clean_error(broken("truncated", [](const fs::path& d) {
                       fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") / 2);
                     }),
                     "model.safetensors");
  expect_clean_error(broken("missing-weights", [](const fs::path& d) { fs::remove(d / "model.safetensors"); }),
                     "safetensors");
}

TEST(Cli, UsageErrorsExitNonZeroWithoutCrash) {
  for (const char* args : {"", "bogus", "run --tokens 1", "run --model x --tokens 1 --top-p 2", "logits --model x"}) {
    Result r = sluice(args);
    EXPECT_GT(r.status, 0) << args;
    EXPECT_FALSE(r.err.empty()) << args;
  }
}

}  // namespace
