// The command line under hostile input and output (issue 15, section 2 and section 3 items
// 1-8): padded vocabulary ids, huge slot counts, endless input files, output paths that are
// devices, FIFOs or symlinks, a full stdout, temperatures that overflow, NaN weights, Ctrl-C
// during a traced run, a manifest that disagrees with its records, and the context limit.
// Runs that could allocate without bound get a 4 GiB address-space limit, so a regression
// fails at once ("out of memory") instead of eating the machine.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_child.h"
#include "format/npy.h"
#include "format/pack.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

constexpr uint64_t kAddressLimit = uint64_t{4} << 30;  // the runs below need a few hundred MB at most

std::string ids_text(const std::vector<int32_t>& ids) {
  std::ostringstream os;
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? "," : "") << ids[i];
  return os.str();
}

// The comma-separated ids on the last line of `out` (--print-ids).
std::vector<int32_t> printed_ids(const std::string& out) {
  std::string text = out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  std::istringstream line(text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1));
  std::vector<int32_t> ids;
  for (std::string item; std::getline(line, item, ',');) ids.push_back(std::stoi(item));
  return ids;
}

void expect_error(const ChildResult& r, const std::string& want) {
  EXPECT_GT(r.status, 0) << "status " << r.status << " (signal " << r.signal << ")\n" << r.err;
  EXPECT_NE(r.err.find("sluice: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << "expected '" << want << "' in: " << r.err;
}

// Whether the process has a handler installed for SIGINT (bit SIGINT-1 of SigCgt).
bool catches_sigint(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (SIGINT - 1)) & 1;
  return false;
}

std::string fixture(const std::string& name) { return fixture_dir(name).string(); }

// A copy of the qwen3_moe fixture pack whose config allows a long context (the fixture's
// max_position_embeddings is 256), for runs that must last long enough to be interrupted.
fs::path long_context_pack() {
  const fs::path d = child_scratch("long-pack");
  fs::copy(fixture_pack("qwen3_moe"), d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  edit_json_file(d / kPackManifestName, [](json& j) { j["config"]["max_position_embeddings"] = 1 << 20; });
  return d;
}

// A text file of the demo model's held-out text (the fixtures' tokenizer encodes it too).
fs::path small_text() {
  const fs::path p = child_scratch("text") / "text.txt";
  std::ofstream(p) << read_text(source_dir() / "models/demo/heldout.txt").substr(0, 4000);
  return p;
}

}  // namespace

// Section 2: the fixture's output layer has 512 rows and its tokenizer 503 tokens. At
// temperature 1000 a draw is nearly uniform, so ~1.8% of draws would land on a padded id
// (before: "tokenizer: token id 5xx is outside [0, 503)" ended the run).
TEST(CliHostileIo, PaddedVocabularyIdsAreNeverSampled) {
  ChildResult r = run_sluice_child({"run", "--model", fixture("qwen3_moe"), "--tokens", "1,2,3", "-n", "200",
                                    "--temperature", "1000", "--seed", "1", "--ignore-eos", "--print-ids"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<int32_t> ids = printed_ids(r.out);
  ASSERT_EQ(ids.size(), 200u) << r.out;
  for (int32_t id : ids) EXPECT_LT(id, 503);
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

// Item 1: slot counts beyond what the trace can fill replay at the cap, with the same hit
// rates (before: 1e9 slots allocated ~24 GB).
TEST(CliHostileIo, SimulateCapsHugeSlotCounts) {
  const std::string trace = (source_dir() / "models/demo/routing.jsonl").string();  // 6 layers x 16 experts
  ChildOptions limited;
  limited.address_space_bytes = kAddressLimit;
  for (const auto& [option, fits, huge] : {std::tuple{"--expert-slots-per-layer", "16", "1000000000"},
                                           std::tuple{"--expert-slots", "96", "100000000"}}) {
    ChildResult want = run_sluice_child({"simulate", "--trace", trace, option, fits}, limited);
    ChildResult got = run_sluice_child({"simulate", "--trace", trace, option, huge}, limited);
    ASSERT_EQ(want.status, 0) << want.err;
    ASSERT_EQ(got.status, 0) << got.err;
    EXPECT_EQ(got.out, want.out);
    EXPECT_NE(got.err.find(std::string(huge) + " slots replayed as "), std::string::npos) << got.err;
    EXPECT_LT(got.max_rss_kb, 256 * 1024);
  }
}

// Item 2: /dev/zero never ends; it is read and scored a window at a time in bounded memory
// until Ctrl-C, which reports the windows scored (before: read whole, without bound).
TEST(CliHostileIo, PerplexityOfAnEndlessFileRunsInBoundedMemory) {
  ChildOptions o;
  o.address_space_bytes = kAddressLimit;
  o.on_start = [](pid_t pid, const fs::path&, const fs::path&) {
    wait_for([&] { return catches_sigint(pid); }, 120);  // generous: a loaded machine
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // reading and scoring
    ::kill(pid, SIGINT);
  };
  ChildResult r = run_sluice_child(
      {"perplexity", "--model", fixture("qwen3_moe"), "--file", "/dev/zero", "--ctx", "64"}, o);
  EXPECT_EQ(r.status, 130) << "signal " << r.signal << "\n" << r.err;
  EXPECT_NE(r.err.find("sluice: interrupted: perplexity of the "), std::string::npos) << r.err;
  EXPECT_LT(r.max_rss_kb, 512 * 1024);
}

// Item 3: output paths are followed through symlinks (the link stays), FIFOs and devices are
// written in place (before: X.tmp renamed over them, replacing the FIFO, the link, or
// /dev/null itself: so the device here is a node made in the scratch directory).
TEST(CliHostileIo, OutputFilesFollowLinksAndKeepSpecialFiles) {
  const fs::path d = child_scratch("outputs");
  const std::string model = fixture("qwen3_moe");
  // A dangling symlink names the file to create.
  fs::create_symlink(d / "logits.npy", d / "link.npy");
  ChildResult r = run_sluice_child({"logits", "--model", model, "--tokens", "1,2,3", "--out", (d / "link.npy").string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(d / "link.npy"));
  EXPECT_EQ(read_npy((d / "logits.npy").string()).shape, (std::vector<int64_t>{3, 512}));

  // A FIFO: the logits go to its reader (6 KB fit the pipe's buffer until read here).
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  r = run_sluice_child({"logits", "--model", model, "--tokens", "1,2,3", "--out", fifo.string()});
  EXPECT_EQ(r.status, 0) << r.err;
  std::string got(1 << 16, '\0');
  const ssize_t n = ::read(reader, got.data(), got.size());
  ::close(reader);
  EXPECT_TRUE(fs::is_fifo(fifo));
  ASSERT_GT(n, 6);
  EXPECT_EQ(got.substr(0, 6), "\x93NUMPY");

  // A trace through a symlink to a regular file: the link stays, the trace lands in its target.
  std::ofstream(d / "old-trace.jsonl") << "old\n";
  fs::create_symlink(d / "old-trace.jsonl", d / "trace-link");
  r = run_sluice_child({"run", "--model", model, "--tokens", "1,2,3", "-n", "2", "--temperature", "0", "--trace-routing",
                        (d / "trace-link").string()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(d / "trace-link"));
  EXPECT_NE(read_text(d / "old-trace.jsonl").find("\"experts\""), std::string::npos);

  // A device (a node like /dev/null, made here: never the real one) as every output file of a
  // streamed run and of logits.
  const fs::path null_dev = d / "null";
  if (!make_char_device(null_dev, 1, 3)) GTEST_SKIP() << "mknod not permitted: device outputs not checked";
  const std::string pack = fixture_pack("qwen3_moe").string();
  r = run_sluice_child({"run", "--model", pack, "--tokens", "1,2,3", "-n", "4", "--temperature", "0", "--expert-slots",
                        "4", "--trace-routing", null_dev.string(), "--stats", null_dev.string()});
  EXPECT_EQ(r.status, 0) << r.err;
  r = run_sluice_child({"logits", "--model", model, "--tokens", "1,2", "--out", null_dev.string()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_character_file(null_dev));
}

// Item 4: a full stdout is an error and a non-zero exit (before: exit 0, the text lost).
TEST(CliHostileIo, StdoutWriteErrorsFailTheCommand) {
  ChildOptions full;
  full.stdout_path = "/dev/full";
  const std::string model = fixture("qwen3_moe");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"run", "--model", model, "--tokens", "1,2,3", "-n", "4", "--temperature", "0"},
           {"run", "--model", model, "--tokens", "1,2,3", "-n", "0", "--print-ids", "--temperature", "0"},
           {"perplexity", "--model", model, "--file", small_text().string(), "--ctx", "64"},
           {"simulate", "--trace", (source_dir() / "models/demo/routing.jsonl").string(), "--expert-slots-per-layer", "4"},
           // bench's rows, markdown and JSON (they were lost with exit 0)
           {"bench", "--model", model, "-p", "4", "-n", "2", "-r", "1"},
           {"bench", "--model", model, "-p", "4", "-n", "2", "-r", "1", "-o", "json"}}) {
    ChildResult r = run_sluice_child(args, full);
    expect_error(r, "writing to stdout: No space left on device");
  }
}

// Item 5: a temperature below 1e-6 samples greedily; 1e-38 overflowed the scaled logits of
// the demo model to inf, and inf - inf = NaN made it "generate 0 tokens" with exit 0.
TEST(CliHostileIo, TinyTemperatureIsGreedy) {
  auto ids_at = [](const std::string& temperature) {
    ChildResult r = run_sluice_child({"run", "--model", (source_dir() / "models/demo").string(), "--prompt",
                                      "The old man", "-n", "8", "--ignore-eos", "--print-ids", "--temperature",
                                      temperature});
    EXPECT_EQ(r.status, 0) << r.err;
    return printed_ids(r.out);
  };
  const std::vector<int32_t> greedy = ids_at("0");
  ASSERT_EQ(greedy.size(), 8u);
  EXPECT_EQ(ids_at("1e-38"), greedy);
  EXPECT_EQ(ids_at("9e-7"), greedy);
}

// Item 5: NaN weights give NaN logits: an error naming the step, not a silent empty run.
TEST(CliHostileIo, NonFiniteLogitsAreAnErrorNamingTheStep) {
  const fs::path d = fixture_copy("qwen3_moe");
  {  // model.embed_tokens.weight (f32 [512, 64]) all NaN: 0xFF bytes
    const std::string file = read_text(d / "model.safetensors");
    uint64_t header_len = 0;
    std::memcpy(&header_len, file.data(), 8);  // safetensors: u64 header length, JSON header, data
    const json header = json::parse(file.substr(8, header_len));
    const json& at = header.at("model.embed_tokens.weight").at("data_offsets");
    std::fstream w(d / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    w.seekp(static_cast<std::streamoff>(8 + header_len + at[0].get<uint64_t>()));
    const std::string nan_bytes(at[1].get<uint64_t>() - at[0].get<uint64_t>(), '\xFF');
    w.write(nan_bytes.data(), static_cast<std::streamsize>(nan_bytes.size()));
    ASSERT_TRUE(w.good());
  }
  expect_error(run_sluice_child({"run", "--model", d.string(), "--tokens", "1,2,3", "-n", "4", "--temperature", "0"}),
               "the model's logits are not finite at generation step 1");
  expect_error(run_sluice_child({"perplexity", "--model", d.string(), "--file", small_text().string()}),
               "the model's logits are not finite in window 1");
}

// Item 6: Ctrl-C during a traced, streamed run stops at a token boundary: whole trace lines
// (simulate replays them), the summary, --stats, exit status 130 (before: killed mid-line).
TEST(CliHostileIo, InterruptedRunWritesWholeTraceSummaryAndStats) {
  const fs::path pack = long_context_pack(), d = child_scratch("interrupt");
  const fs::path trace = d / "trace.jsonl", stats = d / "stats.json";
  ChildOptions o;
  o.on_start = [](pid_t pid, const fs::path& out, const fs::path&) {
    wait_for([&] { return catches_sigint(pid); }, 120);  // generous: a loaded machine
    wait_for([&] {  // tokens are being printed
      std::error_code ec;
      return fs::file_size(out, ec) > 0 && !ec;
    }, 20);
    ::kill(pid, SIGINT);
  };
  ChildResult r = run_sluice_child({"run", "--model", pack.string(), "--tokens", "1,2,3", "-n", "200000",
                                    "--temperature", "0", "--ignore-eos", "--expert-slots", "4", "--trace-routing", trace.string(),
                                    "--stats", stats.string()},
                                   o);
  EXPECT_EQ(r.status, 130) << "signal " << r.signal << "\n" << r.err;
  EXPECT_NE(r.err.find("| generated "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sluice: streaming: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sluice: interrupted: "), std::string::npos) << r.err;
  EXPECT_TRUE(json::parse(read_text(stats), nullptr, false).is_object());
  const std::string lines = read_text(trace);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), '\n');
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) EXPECT_TRUE(json::accept(line)) << line;
  ChildResult replay = run_sluice_child({"simulate", "--trace", trace.string(), "--expert-slots-per-layer", "4"});
  EXPECT_EQ(replay.status, 0) << replay.err;
}

// Item 7: a manifest whose config disagrees with its tensors fails verify, and errors about
// a pack name its manifest.json (before: verify said ok; run blamed "config.json").
TEST(CliHostileIo, VerifyChecksTheManifestAgainstTheRecords) {
  const fs::path d = child_scratch("manifest");
  fs::copy(fixture_pack("qwen3_moe"), d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  edit_json_file(d / kPackManifestName, [](json& j) {
    j["config"]["hidden_size"] = 65;  // the tensors have 64
    j.erase("settings_checksum");     // as a pack written before it (verify_settings_test.cpp covers the checksum)
  });
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"verify", d.string()}, {"run", "--model", d.string(), "--tokens", "1,2", "-n", "1"}}) {
    ChildResult r = run_sluice_child(args);
    expect_error(r, "expected [512, 65] from " + (d / kPackManifestName).string());
    EXPECT_EQ(r.err.find("config.json"), std::string::npos) << r.err;
  }
}

// Item 8: the context limit (max_position_embeddings, 256 in the fixture) is checked before
// anything runs (before: a 1M-token --ctx allocated its cache and ran).
TEST(CliHostileIo, ContextLimitIsCheckedBeforeRunning) {
  const std::string model = fixture("qwen3_moe");
  const std::string long_prompt = ids_text(std::vector<int32_t>(300, 5));
  expect_error(run_sluice_child({"run", "--model", model, "--tokens", long_prompt, "-n", "2", "--temperature", "0"}),
               "prompt (300 tokens) + -n 2: 302 tokens exceed the model's context limit of 256 tokens");
  expect_error(run_sluice_child({"run", "--model", model, "--tokens", "1,2", "--ctx", "1048576", "--temperature", "0"}),
               "--ctx 1048576: 1048576 tokens exceed the model's context limit of 256 tokens");
  const fs::path out = child_scratch("context") / "logits.npy";  // never /dev/null: the old code renamed over it
  expect_error(run_sluice_child({"logits", "--model", model, "--tokens", long_prompt, "--out", out.string()}),
               "the prompt (300 tokens): 300 tokens exceed the model's context limit");
  ChildOptions limited;
  limited.address_space_bytes = kAddressLimit;
  expect_error(run_sluice_child({"perplexity", "--model", model, "--file", small_text().string(), "--ctx", "1048576"},
                                limited),
               "--ctx 1048576: 1048576 tokens exceed the model's context limit of 256 tokens");
}

// Item 8: a long prefill reports its progress on stderr (a line a quarter when not a terminal),
// after each --ubatch chunk (256 here: four chunks).
TEST(CliHostileIo, LongPrefillShowsProgress) {
  const fs::path d = fixture_copy("qwen3_moe", [](json& j) { j["max_position_embeddings"] = 4096; });
  std::vector<int32_t> prompt(1000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + i % 400);
  ChildResult r = run_sluice_child({"run", "--model", d.string(), "--tokens", ids_text(prompt), "-n", "1",
                                    "--temperature", "0", "--ubatch", "256"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("sluice: prefill 256/1000 tokens (26%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sluice: prefill 1000/1000 tokens (100%)"), std::string::npos) << r.err;
}
