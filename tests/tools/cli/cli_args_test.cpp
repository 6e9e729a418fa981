// Hostile command lines (issue 15, section 3, items 9-18): every bad argument gets exactly one
// line on stderr, "sluice: error: " and a message in sluice's words that names the option,
// echoes the value and states what was expected, and exit status 1; the edge values that are
// valid (an empty prompt with a bos token, a temperature beyond float's range) run.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_util.h"

namespace fs = std::filesystem;
using namespace sluice::test;

namespace {

fs::path scratch_root() { return fs::temp_directory_path() / ("sluice-cli-args-" + std::to_string(::getpid())); }

struct Cleanup {
  ~Cleanup() {
    std::error_code ec;
    fs::remove_all(scratch_root(), ec);
  }
} cleanup;

fs::path scratch(const std::string& name) {
  const fs::path d = scratch_root() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

CliRun cli(const std::vector<std::string>& args) {
  static int counter = 0;
  return run_cli(args, scratch("io-" + std::to_string(counter++)));
}

// A copy of fixture `name` whose files are links to the fixture's, less those in `leave_out`
// (which the test then writes, or not): a broken config or tokenizer without copying weights.
fs::path fixture_copy(const std::string& name, const std::string& copy,
                      const std::vector<std::string>& leave_out = {}) {
  const fs::path d = scratch(copy);
  for (const auto& e : fs::directory_iterator(fixture_dir(name))) {
    const std::string file = e.path().filename().string();
    if (std::find(leave_out.begin(), leave_out.end(), file) == leave_out.end())
      fs::create_symlink(fs::absolute(e.path()), d / file);
  }
  return d;
}

void write_file(const fs::path& p, const std::string& text) {
  fs::remove(p);
  std::ofstream(p) << text;
}

// The fixture's config.json with `key` set to `value` in the text model's config (text_config
// of the multimodal families).
fs::path config_with(const std::string& name, const std::string& key, const nlohmann::json& value) {
  nlohmann::json config = nlohmann::json::parse(std::ifstream(fixture_dir(name) / "config.json"));
  nlohmann::json& text = config.contains("text_config") ? config["text_config"] : config;
  text[key] = value;
  const fs::path d = fixture_copy(name, name + "-" + key + "-" + value.dump(), {"config.json"});
  write_file(d / "config.json", config.dump(2));
  return d;
}

struct BadLine {
  std::vector<std::string> args;
  std::string message;  // the whole of stderr, after "sluice: error: "
};

void expect_error_lines(const std::vector<BadLine>& cases) {
  for (const BadLine& c : cases) {
    std::string line;
    for (const std::string& a : c.args) line += (line.empty() ? "" : " ") + a;
    const CliRun r = cli(c.args);
    EXPECT_EQ(r.status, 1) << line << "\n" << r.err;
    EXPECT_EQ(r.err, "sluice: error: " + c.message + "\n") << line;
    EXPECT_EQ(r.out, "") << line;
  }
}

const std::string kQwen = fixture_dir("qwen3_moe").string();
const std::string kSubcommands = "run, logits, perplexity, simulate, convert, verify, synth, serve, bench, tokenize";

}  // namespace

// Items 9, 11 and 13: each numeric option of each subcommand states its own range; values
// out of range, beyond the type, or not numbers at all get the same line.
TEST(CliArgs, NumbersOutOfRangeStateTheRange) {
  const std::vector<std::string> run = {"run", "--model", kQwen, "--tokens", "1,2"};
  auto with = [](std::vector<std::string> base, std::vector<std::string> extra) {
    base.insert(base.end(), extra.begin(), extra.end());
    return base;
  };
  const std::vector<std::string> logits = {"logits", "--model", kQwen, "--tokens", "1", "--out", "x.npy"};
  const std::vector<std::string> ppl = {"perplexity", "--model", kQwen, "--file", "x.txt"};
  const std::vector<std::string> sim = {"simulate", "--trace", "x.jsonl"};
  const std::vector<std::string> synth = {"synth", "--like", "tiny-qwen3-moe", "--dry-run"};
  const std::vector<std::string> convert = {"convert", kQwen, "out"};
  expect_error_lines({
      {with(run, {"-n", "-1"}), "-n -1: expected an integer, 0 or more"},
      {with(run, {"--n-predict", "x"}), "-n x: expected an integer, 0 or more"},
      {with(run, {"-n", "99999999999999999999"}), "-n 99999999999999999999: too large (at most 9223372036854775807)"},
      {with(run, {"--temperature", "-1"}), "--temperature -1: expected a finite number, 0 or more (0 is greedy)"},
      {with(run, {"--temperature", "inf"}), "--temperature inf: expected a finite number, 0 or more (0 is greedy)"},
      {with(run, {"--temperature", "nan"}), "--temperature nan: expected a finite number, 0 or more (0 is greedy)"},
      {with(run, {"--temperature", "1e999"}), "--temperature 1e999: expected a finite number, 0 or more (0 is greedy)"},
      {with(run, {"--top-p", "0"}), "--top-p 0: expected a number above 0, at most 1"},
      {with(run, {"--top-p", "1.5"}), "--top-p 1.5: expected a number above 0, at most 1"},
      {with(run, {"--top-k", "-5"}), "--top-k -5: expected an integer from 0 to 2147483647 (0 keeps every token)"},
      {with(run, {"--top-k", "3000000000"}),
       "--top-k 3000000000: expected an integer from 0 to 2147483647 (0 keeps every token)"},
      {with(run, {"--ctx", "-2"}), "--ctx -2: expected an integer, 0 or more (0: prompt + n)"},
      {with(run, {"--threads", "99999999999"}),
       "--threads 99999999999: expected an integer from 0 to 1024 (0: all cores)"},
      {with(run, {"--expert-slots", "0"}), "--expert-slots 0: expected an integer from 1 to 2147483647"},
      {with(run, {"--io-depth", "0"}), "--io-depth 0: expected an integer from 1 to 256"},
      {with(run, {"--cut", "2"}), "--cut 2: expected a number from 0 to 1 (0: off)"},
      {with(run, {"--wait-timeout", "0"}), "--wait-timeout 0: expected a number above 0, at most 1e+06 (seconds)"},
      {with(logits, {"--expert-slots", "0"}), "--expert-slots 0: expected an integer from 1 to 2147483647"},
      {with(logits, {"--threads", "-1"}), "--threads -1: expected an integer from 0 to 1024 (0: all cores)"},
      {with(ppl, {"--ctx", "1"}), "--ctx 1: expected an integer from 2 to 1048576"},
      {with(ppl, {"--expert-slots", "-3"}), "--expert-slots -3: expected an integer from 1 to 2147483647"},
      {with(sim, {"--expert-slots", "0"}), "--expert-slots 0: expected an integer from 1 to 2147483647"},
      {with(sim, {"--expert-slots-per-layer", "0"}), "--expert-slots-per-layer 0: expected an integer from 1 to 2147483647"},
      {with(sim, {"--expert-slots", "4", "--lrfu-half-life", "inf"}),
       "--lrfu-half-life inf: expected a finite number above 0"},
      {with(sim, {"--expert-slots", "4", "--lrfu-half-life", "0"}), "--lrfu-half-life 0: expected a finite number above 0"},
      {with(synth, {"--layers", "0"}), "--layers 0: expected an integer, 1 or more"},
      {with(synth, {"--experts", "-1"}), "--experts -1: expected an integer, 1 or more"},
      {with(convert, {"--threads", "5000"}), "--threads 5000: expected an integer from 0 to 1024 (0: all cores)"},
      // Item 11: seeds are 0 to 2^64-1, never wrapped.
      {with(run, {"--seed", "-1"}), "--seed -1: expected an integer from 0 to 18446744073709551615"},
      {with(run, {"--seed", "18446744073709551616"}),
       "--seed 18446744073709551616: too large (at most 18446744073709551615)"},
      {with(synth, {"--seed", "-1"}), "--seed -1: expected an integer from 0 to 18446744073709551615"},
  });
}

// Items 10 and 13: an unknown subcommand lists the subcommands; an option given twice says so.
TEST(CliArgs, UsageErrorsInSluicesWords) {
  expect_error_lines({
      {{"frobnicate"}, "unknown subcommand 'frobnicate' (the subcommands: " + kSubcommands + ")"},
      {{"-v", "frobnicate", "--model", "x"}, "unknown subcommand 'frobnicate' (the subcommands: " + kSubcommands + ")"},
      {{}, "a subcommand is required: " + kSubcommands + " (sluice --help)"},
      {{"run", "--model", kQwen, "--tokens", "1", "-n", "3", "-n", "5"}, "-n was given twice (3, 5); give it once"},
      {{"run", "--model", kQwen, "--tokens", "1", "-n", "3", "--n-predict", "5", "-n", "7"},
       "-n was given 3 times (3, 5, 7); give it once"},
      {{"simulate", "--trace", "a", "--trace", "b", "--expert-slots", "2"}, "--trace was given twice (a, b); give it once"},
      {{"run", "--tokens", "1"}, "--model is required (sluice run --help)"},
      {{"run", "--model", kQwen, "--tokens", "1", "-n"}, "--n-predict needs a value"},
  });
}

// Item 14: a path that is not what the option wants says what it is.
TEST(CliArgs, PathsSayWhatTheyAre) {
  const fs::path d = scratch("paths");
  const fs::path file = d / "file.txt", loop_a = d / "loop-a", loop_b = d / "loop-b";
  write_file(file, "some text\n");
  fs::create_symlink(loop_b, loop_a);
  fs::create_symlink(loop_a, loop_b);
  const std::string model_expected = "; expected a directory with config.json and *.safetensors, or a pack";
  expect_error_lines({
      {{"run", "--model", file.string(), "--tokens", "1"},
       "--model " + file.string() + " is a regular file" + model_expected},
      {{"run", "--model", "/dev/null", "--tokens", "1"}, "--model /dev/null is a character device" + model_expected},
      {{"run", "--model", loop_a.string(), "--tokens", "1"},
       "--model " + loop_a.string() + " is a symlink loop" + model_expected},
      {{"logits", "--model", (d / "none").string(), "--tokens", "1", "--out", (d / "l.npy").string()},
       "--model " + (d / "none").string() + " does not exist" + model_expected},
      {{"perplexity", "--model", kQwen, "--file", d.string()},
       "--file " + d.string() + " is a directory; expected a UTF-8 text file"},
      {{"simulate", "--trace", d.string(), "--expert-slots", "4"},
       "--trace " + d.string() + " is a directory; expected a routing trace (JSON lines)"},
      {{"synth", "--config", d.string(), (d / "pack").string()},
       "--config " + d.string() + " is a directory; expected a config.json file"},
      {{"convert", file.string(), (d / "pack").string()},
       file.string() + ": no such checkpoint directory (it is a regular file)"},
      {{"verify", "/dev/null"}, "/dev/null: no such pack directory (it is a character device)"},
  });
}

// Item 12: -n and --ctx are checked against the model's context, and a context the memory
// cannot hold is refused before it is allocated.
TEST(CliArgs, ContextWithinTheModelAndTheMemory) {
  const fs::path text = scratch("ctx") / "text.txt";
  write_file(text, "The old man walked slowly into the town.\n");
  const std::string limit = " tokens exceed the model's context limit of 256 tokens (max_position_embeddings in its config)";
  expect_error_lines({
      {{"run", "--model", kQwen, "--tokens", "1", "-n", "1000000000000"}, "-n 1000000000000: 1000000000000" + limit},
      {{"run", "--model", kQwen, "--tokens", "1", "--ctx", "2000000000"}, "--ctx 2000000000: 2000000000" + limit},
      {{"perplexity", "--model", kQwen, "--file", text.string(), "--ctx", "1000"}, "--ctx 1000: 1000" + limit},
  });
  // A model that claims 2^31 positions: the KV cache of 2e9 tokens (256 bytes a token and
  // layer here) is more than any test machine has.
  const fs::path big = config_with("qwen3_moe", "max_position_embeddings", int64_t{1} << 31);
  const CliRun r = cli({"run", "--model", big.string(), "--tokens", "1", "--ctx", "2000000000"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: --ctx: a context of 2000000000 tokens needs ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(" for its KV cache, more than the "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" of memory available to the cpu backend\n"), std::string::npos) << r.err;
}

// --kv-cache: auto is f32 on the CPU backend (the same ids as f32, the reference); bf16 runs
// with half the cache; another dtype is refused in one line naming the choices.
TEST(CliArgs, KvCacheDtypes) {
  const FixtureReference ref = read_reference("qwen3_moe");
  auto ids = [&](const std::string& kv) {
    const CliRun r = cli({"run", "--model", kQwen, "--tokens", join_ids(ref.prompt_ids), "-n", "8", "--temperature",
                          "0", "--ignore-eos", "--print-ids", "--kv-cache", kv});
    EXPECT_EQ(r.status, 0) << kv << ": " << r.err;
    return r.out;
  };
  const std::string f32 = ids("f32");
  EXPECT_EQ(ids("auto"), f32);
  EXPECT_FALSE(ids("bf16").empty());
  // -v names the cache's dtype and its bytes: the KV rows (bf16 half of f32's; qwen3_moe:
  // attention only, 3 layers x K and V x 32 elements a token) and the rotary tables' rows
  // (cos and sin, 8 f32 each a token, either way): 4 x (768 + 64) and 4 x (384 + 64) bytes.
  auto info = [&](const std::string& kv) {
    const CliRun r = cli({"-v", "run", "--model", kQwen, "--tokens", "1,2", "-n", "2", "--kv-cache", kv});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.err;
  };
  EXPECT_NE(info("auto").find("sluice: info: a context of 4 tokens: 3.2 KiB of KV cache and state (--kv-cache f32)\n"),
            std::string::npos);
  EXPECT_NE(info("bf16").find("sluice: info: a context of 4 tokens: 1.8 KiB of KV cache and state (--kv-cache bf16)\n"),
            std::string::npos);
  expect_error_lines({
      {{"run", "--model", kQwen, "--tokens", "1", "--kv-cache", "f16"},
       "--kv-cache: f16 not in {auto,f32,bf16} (sluice run --help)"},
  });
}

// Item 13: values float cannot hold keep their meaning: a top-p below float's smallest keeps
// the most likely token alone (greedy), a temperature beyond float's largest samples.
TEST(CliArgs, ExtremeSamplingValuesRun) {
  const FixtureReference ref = read_reference("qwen3_moe");
  const std::string n = std::to_string(ref.continuation_ids.size());
  const CliRun greedy = cli({"run", "--model", kQwen, "--tokens", join_ids(ref.prompt_ids), "-n", n, "--temperature",
                             "1", "--top-p", "1e-300", "--ignore-eos", "--print-ids"});
  ASSERT_EQ(greedy.status, 0) << greedy.err;
  std::string ids_line = "\n";  // not "\n" + join_ids(...) + "\n": GCC 12 warns (-Wrestrict, a false positive)
  ids_line += join_ids(ref.continuation_ids);
  ids_line += '\n';
  EXPECT_NE(greedy.out.find(ids_line), std::string::npos) << greedy.out;
  // Without a tokenizer the ids are the text (item 17), so no id can fail to decode.
  const fs::path ids_only = fixture_copy("qwen3_moe", "no-tokenizer", {"tokenizer.json", "tokenizer_config.json"});
  const CliRun hot = cli(
      {"run", "--model", ids_only.string(), "--tokens", "1,2", "-n", "3", "--temperature", "1e308", "--ignore-eos"});
  EXPECT_EQ(hot.status, 0) << hot.err;
}

// Item 15: a broken tokenizer.json is named, with the position and a plain reason.
TEST(CliArgs, BrokenTokenizerJsonNamesTheFile) {
  const fs::path d = fixture_copy("qwen3_moe", "bad-tokenizer", {"tokenizer.json"});
  const std::string file = (d / "tokenizer.json").string();
  write_file(d / "tokenizer.json", "{\n  \"model\": ");
  expect_error_lines({{{"run", "--model", d.string(), "--tokens", "1"},
                       file + ": invalid JSON: line 2, column 12: syntax error while parsing value - unexpected end "
                              "of input; expected '[', '{', or a literal"}});
  write_file(d / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})");
  expect_error_lines(
      {{{"run", "--model", d.string(), "--tokens", "1"}, file + ": model.vocab[\"a\"] is not an integer id"}});
}

// Item 16: an activation the family does not implement is refused, in every family (Gemma 4
// names it hidden_activation and implements gelu_pytorch_tanh).
TEST(CliArgs, UnsupportedHiddenActIsRefused) {
  for (const std::string& name : model_fixtures()) {
    const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fixture_dir(name) / "config.json"));
    const std::string family = cfg["model_type"];
    const bool gemma = cfg.contains("hidden_activation");
    const std::string key = gemma ? "hidden_activation" : "hidden_act", known = gemma ? "gelu_pytorch_tanh" : "silu only";
    const fs::path gelu = config_with(name, key, "gelu");
    const fs::path number = config_with(name, key, 42);
    expect_error_lines({
        {{"run", "--model", gelu.string(), "--tokens", "1"},
         family + ": " + key + " 'gelu' is not supported (" + known + ")"},
        {{"run", "--model", number.string(), "--tokens", "1"}, family + ": " + key + " 42 is not supported (" + known + ")"},
    });
  }
}

// Item 17: a convert killed outright leaves its staging directory; the next one removes it
// (its process is gone) and leaves a live one's alone.
TEST(CliArgs, ConvertRemovesStalePartials) {
  const fs::path d = scratch("stale");
  pid_t dead = ::fork();
  if (dead == 0) std::_Exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const fs::path stale = d / (".pack.partial-" + std::to_string(dead));
  const fs::path live = d / (".pack.partial-" + std::to_string(::getpid()));
  for (const fs::path& p : {stale, live}) {
    fs::create_directories(p);
    write_file(p / "dense.bin", "half a pack");
  }
  const CliRun r = cli({"convert", kQwen, (d / "pack").string(), "--kinds", "bf16", "-q"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live / "dense.bin"));
  EXPECT_TRUE(fs::exists(d / "pack" / "manifest.json"));
}

// Item 17: output paths are checked before the model is loaded: a directory, or a file in a
// missing directory, is named as such (not "cannot rename ....tmp", nor after generation).
TEST(CliArgs, OutputPathsCheckedFirst) {
  const fs::path d = scratch("outputs");
  const std::string pack = fixture_pack("qwen3_moe").string();
  const std::string missing = (d / "none" / "stats.json").string();
  expect_error_lines({
      {{"logits", "--model", kQwen, "--tokens", "1", "--out", d.string()},
       "--out " + d.string() + " is a directory; expected a file name for the .npy logits"},
      {{"run", "--model", pack, "--tokens", "1", "--expert-slots", "2", "--stats", missing},
       "--stats " + missing +
           " cannot be created: its directory does not exist; expected a file for the streaming "
           "statistics (JSON)"},
      {{"run", "--model", pack, "--tokens", "1", "--trace-routing", d.string()},
       "--trace-routing " + d.string() + " is a directory; expected a file for the routing trace"},
  });
}

// Item 17: without a tokenizer, run prints the generated ids instead of an empty line.
TEST(CliArgs, RunWithoutTokenizerPrintsIds) {
  const FixtureReference ref = read_reference("qwen3_moe");
  const fs::path ids_only = fixture_copy("qwen3_moe", "ids-only", {"tokenizer.json", "tokenizer_config.json"});
  const CliRun r = cli({"run", "--model", ids_only.string(), "--tokens", join_ids(ref.prompt_ids), "-n",
                        std::to_string(ref.continuation_ids.size()), "--temperature", "0", "--ignore-eos"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, join_ids(ref.continuation_ids) + "\n");
}

// Item 18: an empty prompt is the bos token alone where the model has one, else an error
// that says the prompt is empty.
TEST(CliArgs, EmptyPrompt) {
  // mixtral's bos is the tokenizer's <|im_start|>, id 501 (tokenizer_config.json's bos_token
  // comes before config.json's bos_token_id).
  const std::string mixtral = fixture_dir("mixtral").string();
  const CliRun a = cli({"run", "--model", mixtral, "--prompt", "", "-n", "4", "--temperature", "0", "--print-ids"});
  const CliRun b = cli({"run", "--model", mixtral, "--tokens", "501", "-n", "4", "--temperature", "0", "--print-ids"});
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("prompt 1 tokens"), std::string::npos) << a.err;
  expect_error_lines({
      {{"run", "--model", kQwen, "--prompt", ""},
       "--prompt is empty and " + kQwen + " has no bos token to start from: give some text, or --tokens"},
      {{"logits", "--model", kQwen, "--out", "x.npy"}, "logits needs --prompt or --tokens"},
  });
}
