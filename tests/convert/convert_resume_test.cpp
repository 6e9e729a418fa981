// An interrupted convert resumes: the partial pack it keeps (with its journal) is checked and
// finished by the next convert of the same checkpoint and options, giving the pack an
// uninterrupted convert gives, byte for byte; records or a dense.bin that no longer check are
// written again; other options, a changed checkpoint or --no-resume start over. The command
// line: a convert killed with SIGKILL part way, then the same command.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "tests/format/format_test_util.h"
#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_util.h"
#include "convert/convert.h"
#include "core/log.h"
#include "format/pack.h"
#include "testkit/synthetic_model.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;

namespace {

// Every file of pack a equals pack b's, and they hold the same files.
void expect_same_pack(const fs::path& a, const fs::path& b) {
  std::set<std::string> names_a, names_b;
  for (const auto& e : fs::directory_iterator(a)) names_a.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(b)) names_b.insert(e.path().filename().string());
  EXPECT_EQ(names_a, names_b);
  for (const std::string& n : names_a)
    EXPECT_TRUE(read_bytes(a / n) == read_bytes(b / n)) << n << " differs between " << a << " and " << b;
}

// The hidden staging directories beside `out`.
std::vector<fs::path> partials(const fs::path& out) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(out.parent_path()))
    if (e.path().filename().string().starts_with("." + out.filename().string() + ".partial-")) found.push_back(e.path());
  return found;
}

// A convert of `src` to `out` cancelled once `records` records are done (the cancel flag, as
// SIGINT sets it); returns the error message.
std::string interrupted_convert(const fs::path& src, const fs::path& out, ConvertOptions o, int64_t records) {
  std::atomic<bool> cancel{false};
  o.cancel = &cancel;
  o.progress = [&](const ConvertProgress& p) {
    if (p.records_done >= records) cancel = true;
  };
  try {
    convert_checkpoint(src, out, o);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::io);
    return e.what();
  }
  ADD_FAILURE() << "the convert was not interrupted";
  return {};
}

ConvertOptions small_batches(std::vector<DType> kinds) {
  ConvertOptions o;
  o.kinds = std::move(kinds);
  o.batch_bytes = 1;  // one record a batch: a journal line each
  return o;
}

// Log lines of a run, to check what resuming says.
struct CapturedLog {
  CapturedLog() : saved(log_level()) {
    log_set_level(LogLevel::info);
    log_set_sink([this](LogLevel, const std::string& line) { text += line + "\n"; });
  }
  ~CapturedLog() {
    log_set_sink({});
    log_set_level(saved);
  }
  LogLevel saved;
  std::string text;
};

TEST(ConvertResume, InterruptedThenResumedEqualsUninterrupted) {
  const fs::path parent = pack_test_dir("resume");
  const fs::path src = fixture_dir("olmoe");  // 2 MoE layers of 8 experts: 16 records
  const ConvertOptions o = small_batches({DType::bf16, DType::q4, DType::q2});
  convert_checkpoint(src, parent / "whole", o);

  const std::string msg = interrupted_convert(src, parent / "pack", o, 5);
  EXPECT_NE(msg.find("convert interrupted"), std::string::npos) << msg;
  EXPECT_NE(msg.find("of 16 records are written in"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the same command resumes"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(parent / "pack"));
  ASSERT_EQ(partials(parent / "pack").size(), 1u);
  {
    CapturedLog log;
    const ConvertSummary s = convert_checkpoint(src, parent / "pack", o);
    EXPECT_GE(s.resumed_records, 5);
    EXPECT_LT(s.resumed_records, 16);
    EXPECT_NE(log.text.find("dense.bin checks"), std::string::npos) << log.text;
  }
  expect_same_pack(parent / "whole", parent / "pack");
  EXPECT_TRUE(partials(parent / "pack").empty());
  EXPECT_TRUE(verify_pack(parent / "pack").ok);
}

// What no longer checks is written again: a flipped byte in the 4th record (the first 3 are
// kept, the rest redone) and in dense.bin (redone).
TEST(ConvertResume, RecordsAndDenseThatNoLongerCheckAreWrittenAgain) {
  const fs::path parent = pack_test_dir("resume-tamper");
  const fs::path src = fixture_dir("olmoe");
  const ConvertOptions o = small_batches({DType::q4});
  convert_checkpoint(src, parent / "whole", o);
  interrupted_convert(src, parent / "pack", o, 8);
  ASSERT_EQ(partials(parent / "pack").size(), 1u);
  const fs::path partial = partials(parent / "pack")[0];
  const PackKindInfo layout = Pack::open(parent / "whole")->kind(DType::q4);
  flip_byte(partial / "experts.q4.bin", kPackHeaderBytes + 3 * layout.record_stride + 17, 0x10);
  flip_byte(partial / "dense.bin", kPackHeaderBytes + 100, 0x10);
  {
    CapturedLog log;
    const ConvertSummary s = convert_checkpoint(src, parent / "pack", o);
    EXPECT_EQ(s.resumed_records, 3);
    EXPECT_NE(log.text.find("dense.bin does not check"), std::string::npos) << log.text;
    EXPECT_NE(log.text.find("3 of 16 records check"), std::string::npos) << log.text;
  }
  expect_same_pack(parent / "whole", parent / "pack");
}

// Other options, a changed checkpoint file, or --no-resume: the partial pack is removed and
// the convert starts over (and still gives the uninterrupted pack).
TEST(ConvertResume, OtherOptionsOrSourceStartOver) {
  const fs::path parent = pack_test_dir("resume-other");
  const fs::path src = parent / "ck";
  fs::copy(fixture_dir("olmoe"), src, fs::copy_options::recursive);
  const ConvertOptions o = small_batches({DType::q4});
  convert_checkpoint(src, parent / "whole", o);
  auto expect_fresh_start = [&](const ConvertOptions& again, const std::string& said) {
    CapturedLog log;
    const ConvertSummary s = convert_checkpoint(src, parent / "pack", again);
    EXPECT_EQ(s.resumed_records, 0);
    EXPECT_NE(log.text.find(said), std::string::npos) << log.text;
    EXPECT_TRUE(partials(parent / "pack").empty());
  };
  interrupted_convert(src, parent / "pack", o, 4);
  ConvertOptions q2 = o;
  q2.kinds = {DType::q2};
  expect_fresh_start(q2, "other options: starting over");
  fs::remove_all(parent / "pack");

  interrupted_convert(src, parent / "pack", o, 4);
  fs::last_write_time(src / "model.safetensors", fs::last_write_time(src / "model.safetensors") + std::chrono::seconds(5));
  expect_fresh_start(o, "other files or other options: starting over");
  expect_same_pack(parent / "whole", parent / "pack");
  fs::remove_all(parent / "pack");

  interrupted_convert(src, parent / "pack", o, 4);
  ConvertOptions no = o;
  no.resume = false;
  expect_fresh_start(no, "(--no-resume): starting over");
  expect_same_pack(parent / "whole", parent / "pack");
}

// The command line: a convert of a ~120 MB checkpoint killed with SIGKILL once its journal
// holds some records, then the same command: it resumes (-v says so) and the pack equals an
// uninterrupted convert's.
TEST(ConvertResume, KilledCommandResumes) {
  const fs::path parent = pack_test_dir("resume-cli");
  const fs::path io = parent / "io";
  fs::create_directories(io);
  write_synthetic_checkpoint(parent / "ck", synthetic_spec_for_bytes(120'000'000), 11);
  const std::vector<std::string> args = {"convert", (parent / "ck").string(), (parent / "pack").string(), "--kinds",
                                         "bf16,q4,q2", "--threads", "1", "-q"};
  CliRun killed = run_cli(args, io, [&](pid_t pid) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto journaled_records = [&] {
      for (const fs::path& p : partials(parent / "pack"))
        if (read_bytes(p / "convert.journal").find("\"records\"") != std::string::npos) return true;
      return false;
    };
    while (!journaled_records() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ::kill(pid, SIGKILL);
  });
  if (killed.status == 0) {
    GTEST_LOG_(INFO) << "convert finished before SIGKILL; the resume path was not exercised";
    return;
  }
  EXPECT_EQ(killed.signal, SIGKILL);
  ASSERT_EQ(partials(parent / "pack").size(), 1u);
  std::vector<std::string> verbose = args;
  verbose.insert(verbose.begin(), "-v");
  CliRun resumed = run_cli(verbose, io);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("convert: resuming"), std::string::npos) << resumed.err;
  EXPECT_NE(resumed.err.find("resumed after"), std::string::npos) << resumed.err;
  CliRun whole = run_cli({"convert", (parent / "ck").string(), (parent / "whole").string(), "--kinds", "bf16,q4,q2", "-q"}, io);
  ASSERT_EQ(whole.status, 0) << whole.err;
  expect_same_pack(parent / "whole", parent / "pack");
}

}  // namespace
