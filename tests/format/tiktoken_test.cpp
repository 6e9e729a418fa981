// tiktoken vocabularies (Kimi K2's tiktoken.model): tiktoken's rank-ordered BPE on a real
// tiktoken vocabulary, o200k (the first 199,998 tokens of gpt-oss's tokenizer.json, whose
// ranks are its ids), encodes every case as the `tokenizers` reference of gpt-oss does with
// gpt-oss's own pattern; a directory of tiktoken.model (o200k's first 60,000 ranks) +
// tokenizer_config.json with Kimi's pattern and special tokens encodes and decodes as
// js-tiktoken (run by node); hostile rank files are refused with the line.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/models/fixture_util.h"
#include "tests/format/format_test_util.h"
#include "format/json_file.h"
#include "format/tiktoken.h"
#include "format/tokenizer.h"
#include "tests/format/jinja_reference.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;
using json = nlohmann::json;

namespace {

const fs::path gptoss_dir = fs::path(SLUICE_NPM_DIR) / "@lenml" / "tokenizer-gptoss" / "models";
const fs::path fixtures = sluice::test::source_dir() / "tests" / "fixtures" / "tokenizers";

std::string base64(std::string_view bytes) {
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += alphabet[(v >> s) & 63];
  }
  if (bytes.size() - i == 1) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    out += "==";
  } else if (bytes.size() - i == 2) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    for (int s = 18; s >= 6; s -= 6) out += alphabet[(v >> s) & 63];
    out += "=";
  }
  return out;
}

// o200k: the first n tokens of gpt-oss's vocabulary (its ids are o200k's ranks) as
// tiktoken.model text; n = 199,998, the whole vocabulary, by default.
std::string o200k_model_text(int32_t n = 199998) {
  EXPECT_TRUE(fs::exists(gptoss_dir / "tokenizer.json")) << gptoss_dir << " is missing: run scripts/fetch-test-data";
  const Tokenizer tok = Tokenizer::load(gptoss_dir);
  EXPECT_FALSE(tok.is_special(199997));
  EXPECT_TRUE(tok.is_special(199998));  // the added tokens start here
  std::string text;
  for (int32_t id = 0; id < n; ++id) text += base64(tok.token_text(id)) + " " + std::to_string(id) + "\n";
  return text;
}

std::vector<std::string> cases() { return read_json_file(fixtures / "cases.json").get<std::vector<std::string>>(); }

TEST(Tiktoken, RankOrderedBpeEncodesAsTokenizers) {
  const auto ranks = parse_tiktoken_ranks(o200k_model_text(), "o200k");
  ASSERT_EQ(ranks.size(), 199998u);
  // gpt-oss's pattern (its pre_tokenizer's first Split) and its added tokens as the specials.
  const json tokenizer_json = read_json_file(gptoss_dir / "tokenizer.json");
  const std::string pattern = tokenizer_json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
  std::vector<std::pair<int32_t, std::string>> specials;
  for (const json& t : tokenizer_json["added_tokens"]) specials.emplace_back(t["id"], t["content"]);
  const Tokenizer tok = Tokenizer::from_tiktoken(ranks, pattern, specials);
  const json ref = read_json_file(fixtures / "gptoss" / "reference.json");
  ASSERT_EQ(ref["cases"].size(), cases().size());
  for (const json& c : ref["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok.encode(text), c["ids"].get<std::vector<int32_t>>()) << json(text).dump();
    EXPECT_EQ(tok.decode(c["ids"].get<std::vector<int32_t>>()), c["decoded"].get<std::string>()) << json(text).dump();
  }
}

TEST(Tiktoken, KimiDirectoryEncodesAsJsTiktoken) {
  // The first 60,000 ranks (a tiktoken vocabulary too: a token's parts rank below it): fewer
  // whole-word tokens, more merging, and a quicker reference.
  const int32_t n_ranks = 60000;
  ScratchDir dir;
  write_bytes(dir / "tiktoken.model", o200k_model_text(n_ranks));
  // Kimi's tokenizer_config.json names its first special tokens; the rest are reserved.
  const std::vector<std::string> named = {"[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                          "<|start_header_id|>", "<|end_header_id|>", "[EOT]", "<|im_system|>",
                                          "<|im_middle|>"};
  json config = {{"bos_token", "[BOS]"}, {"eos_token", "[EOS]"}, {"tokenizer_class", "TikTokenTokenizer"}};
  json specials_js = json::object();
  for (size_t i = 0; i < named.size(); ++i) {
    const int32_t id = n_ranks + static_cast<int32_t>(i);
    config["added_tokens_decoder"][std::to_string(id)] = {{"content", named[i]}, {"special", true}, {"normalized", false}};
  }
  for (const auto& [id, content] : tiktoken_special_tokens(n_ranks, &config)) specials_js[content] = id;
  EXPECT_EQ(specials_js.size(), 256u);
  EXPECT_EQ(specials_js["<|reserved_token_" + std::to_string(n_ranks + 100) + "|>"], n_ranks + 100);
  write_bytes(dir / "tokenizer_config.json", config.dump());
  const Tokenizer tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.vocab_size(), n_ranks + 256);
  EXPECT_EQ(tok.bos_id(), std::optional<int32_t>(n_ranks));
  EXPECT_EQ(tok.eos_id(), std::optional<int32_t>(n_ranks + 1));
  EXPECT_TRUE(tok.is_special(n_ranks + 3));
  EXPECT_TRUE(tok.is_special(n_ranks + 200));
  EXPECT_FALSE(tok.is_special(1000));

  std::vector<std::string> texts = cases();
  // Kimi's chat format, a reserved token, and what the pattern singles out: Han runs apart
  // from kana and Latin, contractions in any case, digits in threes, whitespace runs.
  texts.push_back("<|im_system|>system<|im_middle|>You are Kimi.<|im_end|><|im_user|>user<|im_middle|>Hi!<|im_end|>"
                  "<|im_assistant|>assistant<|im_middle|>");
  texts.push_back("a<|reserved_token_" + std::to_string(n_ranks + 42) + "|>b [EOT]");
  texts.push_back("漢字とかなまじりの文、English混在テキスト。中文ABC中文");
  texts.push_back("THEY'RE they're They'Re WE'VE i'M YOU'LL he'D it'S");
  texts.push_back("1234567 12 3.14159 ٣٤٥٦ 二〇二五");
  texts.push_back("  \t\n\n  x  \r\n\r\n   y   ");
  texts.push_back("Ünïcödé ÀÉÎÕÜ àéîõü ǅungla ＡＢＣ");
  ScratchDir io;
  write_bytes(io / "specials.json", specials_js.dump());
  write_bytes(io / "texts.json", json(texts).dump());
  ASSERT_TRUE(run_node_script("tiktoken_reference.mjs",
                              {SLUICE_NPM_DIR, (dir / "tiktoken.model").string(), (io / "specials.json").string(),
                               (io / "texts.json").string(), (io / "out.json").string()}));
  const json want = read_json_file(io / "out.json");
  ASSERT_EQ(want.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> ids = want[i]["ids"];
    EXPECT_EQ(tok.encode(texts[i]), ids) << json(texts[i]).dump();
    EXPECT_EQ(tok.decode(ids), want[i]["decoded"].get<std::string>()) << json(texts[i]).dump();
  }
  // The chat format's special tokens are single ids.
  const std::vector<int32_t> chat = tok.encode("<|im_user|>user<|im_middle|>");
  ASSERT_GE(chat.size(), 3u);
  EXPECT_EQ(chat.front(), n_ranks + 3);
  EXPECT_EQ(chat.back(), n_ranks + 9);
}

TEST(Tiktoken, HostileRankFilesAreRefused) {
  struct Bad {
    std::string text, fragment;
  };
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes += base64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  const std::vector<Bad> bad = {
      {"", "no tokens"},
      {"QQ== 0\nQg==\n", "line 2 is not"},
      {"Q!== 0\n", "line 1: the token is not base64"},
      {"QQ= 0\n", "line 1: the token is not base64"},
      {"QQ== x1\n", "line 1: rank \"x1\" is not a number"},
      {"QQ== 0\nQg== 0\n", "ranks are not 0 .. 1 each once"},
      {"QQ== 0\nQg== 2\n", "ranks are not 0 .. 1 each once"},
      {"QQ== 99999999999\n", "is not a number"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.text);
    expect_error([&] { parse_tiktoken_ranks(b.text, "DIR/tiktoken.model"); }, Status::corrupt, {"DIR/tiktoken.model", b.fragment});
  }
  // A vocabulary without every byte, or with a token twice, as a directory.
  ScratchDir dir;
  write_bytes(dir / "tiktoken.model", "QQ== 0\nQg== 1\n");
  expect_error([&] { Tokenizer::load(dir.path()); }, Status::corrupt, {"tiktoken.model", "byte 0 is not a token"});
  write_bytes(dir / "tiktoken.model", bytes + "QQ== 256\n");
  expect_error([&] { Tokenizer::load(dir.path()); }, Status::corrupt, {"tiktoken.model", "listed twice"});
  write_bytes(dir / "tiktoken.model", bytes);
  write_bytes(dir / "tokenizer_config.json", R"({"added_tokens_decoder": {"12": {"content": "<x>"}}})");
  expect_error([&] { Tokenizer::load(dir.path()); }, Status::corrupt, {"added_tokens_decoder", "inside the tiktoken vocabulary"});
  write_bytes(dir / "tokenizer_config.json", R"({"added_tokens_decoder": {"256": {"content": "<x>"}, "257": {"content": "<x>"}}})");
  expect_error([&] { Tokenizer::load(dir.path()); }, Status::corrupt, {"<x>", "named twice"});
  write_bytes(dir / "tokenizer_config.json", R"({"added_tokens_decoder": {"256": {"content": "<x>"}}})");
  const Tokenizer tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.encode("AB<x>"), (std::vector<int32_t>{65, 66, 256}));
  EXPECT_EQ(tok.vocab_size(), 512);
}

}  // namespace
