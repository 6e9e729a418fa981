// Hybrid families beyond parity: the per-sequence recurrent state (reset clears it, two
// sequences never share it, a prefill and token-by-token decode agree), the multimodal
// checkpoint's vision tower skipped with one message, config validation that names the
// family and the field, and PLE's hashing and table lookup.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "core/log.h"
#include "tests/models/fixture_util.h"
#include "format/json_file.h"
#include "models/load.h"
#include "models/ple.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kHybridFixtures = {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen4_exp_qsa",
                                                  "qwen4_exp_ple"};

std::vector<float> run(Model& m, SequenceState& st, std::span<const int32_t> ids) {
  std::vector<float> out(ids.size() * m.info().n_vocab);
  m.forward(ids, st, out, true);
  return out;
}

class HybridSequence : public ::testing::TestWithParam<std::string> {};

// After reset a sequence computes exactly what a fresh one does (every recurrent state, PLE's
// token history and QSA's block keys cleared).
TEST_P(HybridSequence, ResetClearsEverything) {
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  const std::vector<int32_t>& p = ref.prompt_ids;
  auto st = m.model->new_state(static_cast<int64_t>(p.size()) + 8);
  std::vector<float> first = run(*m.model, *st, p);
  run(*m.model, *st, std::span(ref.continuation_ids).first(3));
  st->reset();
  EXPECT_EQ(st->n_past, 0);
  EXPECT_EQ(run(*m.model, *st, p), first);
}

// Two sequences interleaved step by step compute what each computes alone.
TEST_P(HybridSequence, SequencesDoNotShareState) {
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  std::vector<int32_t> a(ref.prompt_ids.begin(), ref.prompt_ids.begin() + 12);
  std::vector<int32_t> b(ref.prompt_ids.rbegin(), ref.prompt_ids.rbegin() + 12);
  auto alone = [&](const std::vector<int32_t>& ids) {
    auto st = m.model->new_state(12);
    std::vector<float> out;
    for (size_t i = 0; i < ids.size(); i += 4) {
      std::vector<float> part = run(*m.model, *st, std::span(ids).subspan(i, 4));
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  };
  std::vector<float> want_a = alone(a), want_b = alone(b), got_a, got_b;
  auto sa = m.model->new_state(12), sb = m.model->new_state(12);
  for (size_t i = 0; i < 12; i += 4) {
    std::vector<float> pa = run(*m.model, *sa, std::span(a).subspan(i, 4));
    std::vector<float> pb = run(*m.model, *sb, std::span(b).subspan(i, 4));
    got_a.insert(got_a.end(), pa.begin(), pa.end());
    got_b.insert(got_b.end(), pb.begin(), pb.end());
  }
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
}

// The chunked delta rule of a prefill and the recurrent one of decode agree on the whole
// model: the prompt in one pass vs one token at a time.
TEST_P(HybridSequence, TokenByTokenDecodeMatchesOnePrefill) {
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  const std::vector<int32_t>& p = ref.prompt_ids;
  const int64_t V = m.model->info().n_vocab;
  auto s1 = m.model->new_state(static_cast<int64_t>(p.size()));
  std::vector<float> all = run(*m.model, *s1, p);
  auto s2 = m.model->new_state(static_cast<int64_t>(p.size()));
  std::vector<float> step;
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<float> row = run(*m.model, *s2, std::span(p).subspan(i, 1));
    step.insert(step.end(), row.begin(), row.begin() + V);
  }
  float diff = max_abs_diff(all, step);
  std::printf("%s: max |prefill - token-by-token decode| = %.3g\n", GetParam().c_str(), diff);
  EXPECT_LE(diff, 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridSequence, ::testing::ValuesIn(kHybridFixtures),
                         [](const auto& info) { return info.param; });

TEST(HybridLoad, MultimodalCheckpointSkipsTheVisionTowerWithOneMessage) {
  std::vector<std::string> lines;
  LogLevel before = log_level();
  log_set_level(LogLevel::info);
  log_set_sink([&](LogLevel, const std::string& msg) { lines.push_back(msg); });
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir("qwen3_5_moe"), *backend);
  log_set_sink({});
  log_set_level(before);
  int mentions = 0;
  for (const auto& l : lines) mentions += l.find("tensors under model.visual.") != std::string::npos;
  EXPECT_EQ(mentions, 1);
  EXPECT_EQ(m.model->info().family, "qwen3_5_moe");
}

// A copy of a fixture with its config edited; the weights are links to the fixture's.
fs::path edited_fixture(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  static int counter = 0;
  fs::path d = fs::temp_directory_path() / ("sluice-hybrid-test-" + std::to_string(::getpid())) /
               (name + "-" + std::to_string(counter++));
  fs::create_directories(d);
  for (const auto& e : fs::directory_iterator(fixture_dir(name)))
    if (e.path().filename() != "config.json") fs::create_symlink(fs::absolute(e.path()), d / e.path().filename());
  nlohmann::json cfg = read_json_file(fixture_dir(name) / "config.json");
  edit(cfg);
  std::ofstream(d / "config.json") << cfg.dump(2);
  return d;
}

std::string load_error(const fs::path& dir) {
  auto backend = make_cpu_backend();
  try {
    load_model(dir, *backend);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(HybridLoad, ConfigErrorsNameFamilyAndField) {
  struct Case {
    std::string fixture, want;
    std::function<void(nlohmann::json&)> edit;
  };
  const std::vector<Case> cases = {
      {"qwen4_exp_qsa", "qwen4_exp: hc_count (1) must be at least 2",
       [](nlohmann::json& j) { j["text_config"]["hc_count"] = 1; }},
      {"qwen4_exp_qsa", "qwen4_exp: indexer_kv_heads must be 1",
       [](nlohmann::json& j) { j["text_config"]["indexer_kv_heads"] = 2; }},
      {"qwen4_exp_qsa", "qwen4_exp: indexer_budget (6) is not a multiple of indexer_compress_ratio (4)",
       [](nlohmann::json& j) { j["text_config"]["indexer_budget"] = 6; }},
      {"qwen4_exp_qsa", "qwen4_exp: output_gate_type 'gelu' is not silu or sigmoid",
       [](nlohmann::json& j) { j["text_config"]["output_gate_type"] = "gelu"; }},
      {"qwen4_exp_ple", "qwen4_exp: ple_layer_ids holds 2, which is not a linear_attention layer",
       [](nlohmann::json& j) { j["text_config"]["ple_layer_ids"] = {1, 2}; }},
      {"qwen4_exp_ple", "layer_multipliers differs from the hash multipliers",
       [](nlohmann::json& j) { j["text_config"]["seed"] = 1234; }},
      {"qwen4_exp_ple", "config.json (ngram_vocab_size_base",
       [](nlohmann::json& j) { j["text_config"]["ngram_vocab_size_base"] = 60; }},
      {"qwen3_next", "qwen3_next: linear_num_value_heads (3) is not a multiple of linear_num_key_heads (2)",
       [](nlohmann::json& j) { j["linear_num_value_heads"] = 3; }},
      {"qwen3_next", "qwen3_next: hidden_act 'gelu' is not supported",
       [](nlohmann::json& j) { j["hidden_act"] = "gelu"; }},
      {"qwen3_5_moe", "qwen3_5_moe: layer_types holds 'sliding_attention'",
       [](nlohmann::json& j) { j["text_config"]["layer_types"][1] = "sliding_attention"; }},
      {"qwen3_5", "qwen3_5: layer_types must list one type for each of the 4 layers",
       [](nlohmann::json& j) { j["text_config"]["layer_types"].erase(0); }},
  };
  for (const Case& c : cases) {
    std::string err = load_error(edited_fixture(c.fixture, c.edit));
    EXPECT_NE(err.find(c.want), std::string::npos) << c.fixture << ": got \"" << err << "\", want \"" << c.want << "\"";
  }
  fs::remove_all(fs::temp_directory_path() / ("sluice-hybrid-test-" + std::to_string(::getpid())));
}

TEST(Ple, PrimesAndHashFollowTheReference) {
  // transformers: _find_nth_prime_after(49, i + 1) for heads i = 0..7 of two PLE layers.
  EXPECT_EQ(primes_from(50, 8), (std::vector<int64_t>{53, 59, 61, 67, 71, 73, 79, 83}));
  PleSpec spec;
  spec.ngram_size = 3;
  spec.heads_per_ngram = 2;
  spec.eos = 9;
  std::vector<int64_t> primes = primes_from(50, 8);
  NgramHash h1 = ngram_hash(spec, 512, 4321, 1, primes, 8);
  EXPECT_EQ(h1.head_vocab, (std::vector<int64_t>{71, 73, 79, 83}));
  EXPECT_EQ(h1.head_offset, (std::vector<int64_t>{0, 71, 144, 223}));
  EXPECT_EQ(h1.n_rows, 312);  // 306 padded to a multiple of 8
  for (int64_t m : h1.multipliers) EXPECT_EQ(m % 2, 1);

  // n-grams never reach back over an end-of-text token: with history [eos, eos] and tokens
  // [5, 6, eos, 7, 8], token 7's bigram is (eos, 7) and its trigram (eos, eos, 7).
  NgramHash h;
  h.multipliers = {3, 5, 7};
  h.head_vocab = {101, 103, 107, 109};
  h.head_offset = {0, 101, 204, 311};
  std::vector<int32_t> history = {9, 9}, tokens = {5, 6, 9, 7, 8};
  std::vector<int64_t> ids;
  ngram_ids(spec, h, history, tokens, ids);
  auto id = [&](int64_t head, int64_t mixed) { return mixed % h.head_vocab[head] + h.head_offset[head]; };
  auto bigram = [&](int64_t a, int64_t b) { return (b * 3) ^ (a * 5); };          // token b, one back a
  auto trigram = [&](int64_t a, int64_t b, int64_t c) { return (c * 3) ^ (b * 5) ^ (a * 7); };
  const int64_t H = 4;
  EXPECT_EQ(ids[0 * H + 0], id(0, bigram(9, 5)));
  EXPECT_EQ(ids[1 * H + 1], id(1, bigram(5, 6)));
  EXPECT_EQ(ids[1 * H + 2], id(2, trigram(9, 5, 6)));
  EXPECT_EQ(ids[2 * H + 3], id(3, trigram(5, 6, 9)));   // the eos itself ends an n-gram
  EXPECT_EQ(ids[3 * H + 0], id(0, bigram(9, 7)));
  EXPECT_EQ(ids[3 * H + 2], id(2, trigram(9, 9, 7)));   // not (6, eos, 7)
  EXPECT_EQ(ids[4 * H + 3], id(3, trigram(9, 7, 8)));   // the eos two back starts the n-gram
}

TEST(Ple, ResidentTableReadsRowsAcrossShards) {
  std::vector<float> a = {0, 1, 2, 3}, b = {4, 5, 6, 7, 8, 9};  // rows of 2: shard a rows 0-1, b rows 2-4
  ResidentNgramTable table({Tensor(DType::f32, {2, 2}, a.data()), Tensor(DType::f32, {3, 2}, b.data())});
  EXPECT_EQ(table.n_rows(), 5);
  CpuBackend be;
  std::vector<float> out(8);
  std::vector<int64_t> ids = {4, 0, 2, 1};
  table.gather(be, ids, Tensor(DType::f32, {4, 2}, out.data()));
  EXPECT_EQ(out, (std::vector<float>{8, 9, 0, 1, 4, 5, 2, 3}));
}

}  // namespace
