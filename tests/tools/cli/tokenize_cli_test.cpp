// sluice tokenize: the ids equal the library's encode of the whole text in every output format
// (also for a file read in several pieces), and bad input is one line.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/models/fixture_util.h"
#include "tests/tools/cli/cli_util.h"
#include "format/tokenizer.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sluice-tokenize-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

fs::path demo() { return source_dir() / "models" / "demo"; }

void expect_one_line_error(const CliRun& r, const std::string& must_contain) {
  EXPECT_GT(r.status, 0) << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << "expected '" << must_contain << "' in: " << r.err;
}

TEST(TokenizeCli, PromptIdsArePiecesAreTheLibrarysEncode) {
  const fs::path io = temp_dir("prompt");
  const Tokenizer tok = Tokenizer::load(demo());
  const std::string text = "def f(x):\n    return x  # naïve \"quote\"\tend";
  const std::vector<int32_t> want = tok.encode(text);
  ASSERT_GT(want.size(), 10u);

  CliRun r = run_cli({"tokenize", "--model", demo().string(), "--prompt", text}, io);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, join_ids(want) + "\n");

  r = run_cli({"tokenize", "--model", demo().string(), "--prompt", text, "--format", "pieces"}, io);
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  size_t i = 0;
  for (; std::getline(lines, line); ++i) {
    ASSERT_LT(i, want.size()) << line;
    EXPECT_EQ(line.substr(0, line.find('\t')), std::to_string(want[i])) << line;
  }
  EXPECT_EQ(i, want.size());
  EXPECT_NE(r.out.find("\t:\\n\n"), std::string::npos) << "a newline inside a piece is escaped: " << r.out;
}

TEST(TokenizeCli, FileInPiecesIsTheWholeTextsEncode) {
  const fs::path io = temp_dir("file");
  const Tokenizer tok = Tokenizer::load(demo());
  // About 2.9 MB: the held-out text three times over, so the 1 MB pieces cut it twice or more.
  const std::string held = slurp(demo() / "heldout.txt");
  ASSERT_GT(held.size(), 200000u);
  std::string text;
  while (text.size() < 2'900'000) text += held;
  const fs::path file = io / "text.txt";
  std::ofstream(file, std::ios::binary) << text;
  const std::vector<int32_t> want = tok.encode(text);

  const fs::path out = io / "ids.u32";
  CliRun r = run_cli({"tokenize", "--model", demo().string(), "--file", file.string(), "--format", "u32", "--out",
                      out.string()},
                     io);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find(std::to_string(want.size()) + " tokens"), std::string::npos) << r.err;
  const std::string bytes = slurp(out);
  ASSERT_EQ(bytes.size(), want.size() * 4);
  for (size_t i = 0; i < want.size(); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + 4 * i);
    const int32_t got = static_cast<int32_t>(p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24);
    ASSERT_EQ(got, want[i]) << "token " << i;
  }

  r = run_cli({"tokenize", "--model", demo().string(), "--file", file.string(), "--add-bos"}, io);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, join_ids(tok.encode(text, true)) + "\n") << "the demo tokenizer has no bos: the same ids";
}

TEST(TokenizeCli, BadInputIsOneLine) {
  const fs::path io = temp_dir("bad");
  const std::string model = demo().string();
  expect_one_line_error(run_cli({"tokenize", "--model", model}, io), "--prompt or --file");
  expect_one_line_error(run_cli({"tokenize", "--model", model, "--prompt", "x", "--format", "hex"}, io),
                        "--format: 'hex'");
  expect_one_line_error(run_cli({"tokenize", "--model", io.string(), "--prompt", "x"}, io), "tokenizer.json");
  expect_one_line_error(run_cli({"tokenize", "--model", model, "--file", (io / "none.txt").string()}, io), "none.txt");
  expect_one_line_error(run_cli({"tokenize", "--model", model, "--prompt", "x", "--out", io.string()}, io), "--out");
  CliRun r = run_cli({"tokenize", "--model", model, "--prompt", "x", "--file", "y"}, io);
  EXPECT_GT(r.status, 0);
  EXPECT_FALSE(r.err.empty());
}

}  // namespace
