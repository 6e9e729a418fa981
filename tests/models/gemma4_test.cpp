// Gemma 4 beyond the shared parity tests (parity_test.cpp, pack_parity_test.cpp and the
// streaming tests run its two fixtures like every other):
//  - each switch the config can turn without other weights changes the logits of its fixture
//    (the softcap, the sliding window, the full layers' partial rotary, top-k), so the parity
//    tests do test them;
//  - the published spelling of the full layers' heads (global_head_dim,
//    num_global_key_value_heads) reads the same as transformers' per_layer_config;
//  - the per-layer input embeddings are a row table of the pack (read row by row);
//  - damaged configs are refused in one line.
#include <gtest/gtest.h>

#include <functional>

#include "tests/format/format_test_util.h"
#include "backends/backend.h"
#include "tests/models/fixture_util.h"
#include "format/npy.h"
#include "format/pack.h"
#include "models/load.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

TEST(Gemma4, EachSwitchMovesTheLogits) {
  for (const std::string fixture : {"gemma4", "gemma4_kv"}) {
    SCOPED_TRACE(fixture);
    const std::vector<int32_t> ids = full_ids(fixture);
    const std::vector<float> base = teacher_forced(fixture_dir(fixture), ids);
    const NpyArray want = read_npy(fixture_dir(fixture) / "logits_full.npy");
    EXPECT_LE(max_abs_diff(base, want.data), 1e-4f);
    std::vector<std::pair<std::string, std::function<void(json&)>>> edits = {
        {"no window", [](json& c) { c["sliding_window"] = 4096; }},
        {"full rotary on full layers", [](json& c) { c["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 1.0; }},
        {"top-1 / top-2", [](json& c) { c["top_k_experts"] = c["top_k_experts"].get<int>() == 1 ? 2 : 1; }},
    };
    if (fixture == "gemma4") edits.push_back({"no softcap", [](json& c) { c["final_logit_softcapping"] = nullptr; }});
    for (const auto& [what, edit] : edits) {
      const float moved = max_abs_diff(teacher_forced(fixture_with_config(fixture, "gemma4-edit", edit), ids), base);
      std::printf("%s %s: logits move by %.3g\n", fixture.c_str(), what.c_str(), moved);
      EXPECT_GT(moved, 1e-2f) << what;
    }
  }
}

TEST(Gemma4, GlobalHeadFieldsReadAsPerLayerConfig) {
  const std::string fixture = "gemma4_kv";  // full layers: head_dim 32, one kv head
  const std::vector<int32_t> ids = full_ids(fixture);
  const std::vector<float> base = teacher_forced(fixture_dir(fixture), ids);
  const fs::path dir = fixture_with_config(fixture, "gemma4-global", [](json& c) {
    c.erase("per_layer_config");
    c["global_head_dim"] = 32;
    c["num_global_key_value_heads"] = 1;
  });
  EXPECT_EQ(max_abs_diff(teacher_forced(dir, ids), base), 0.0f);
}

// The per-layer input embeddings go to the pack's row-addressable file (ple.<dtype>.bin), not
// dense.bin, and are read from it row by row; the pack's logits are the checkpoint's.
// Without layer_types, every sliding_window_pattern-th layer is full (and the last): the
// fixture's types spelled as a pattern give its logits.
TEST(Gemma4, SlidingWindowPatternSpellsTheLayerTypes) {
  const std::string fixture = "gemma4_kv";  // sliding, full, sliding, full, sliding, full
  const std::vector<int32_t> ids = full_ids(fixture);
  const std::vector<float> base = teacher_forced(fixture_dir(fixture), ids);
  const fs::path dir = fixture_with_config(fixture, "gemma4-pattern", [](json& c) {
    c.erase("layer_types");
    c["sliding_window_pattern"] = 2;
  });
  EXPECT_EQ(max_abs_diff(teacher_forced(dir, ids), base), 0.0f);
}

TEST(Gemma4, PerLayerEmbeddingsAreARowTableOfThePack) {
  const std::string fixture = "gemma4";
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack(fixture));
  const std::string table = "model.embed_tokens_per_layer.";
  ASSERT_NE(pack->row_table(table), nullptr);
  EXPECT_EQ(pack->row_table(table)->rows, 512);
  EXPECT_EQ(pack->row_table(table)->cols, 4 * 8);  // n_layer x hidden_size_per_layer_input
  EXPECT_FALSE(pack->has_dense(table + "weight"));
  const std::vector<int32_t> ids = full_ids(fixture);
  EXPECT_EQ(max_abs_diff(teacher_forced(fixture_pack(fixture), ids, {DType::bf16}), teacher_forced(fixture_dir(fixture), ids)),
            0.0f);
}

TEST(Gemma4, BadConfigsAreRefusedInOneLine) {
  const std::vector<std::tuple<std::string, std::function<void(json&)>, std::vector<std::string>>> cases = {
      {"gemma4", [](json& c) { c["hidden_activation"] = "silu"; }, {"gemma4_text", "hidden_activation", "silu"}},
      {"gemma4", [](json& c) { c["use_bidirectional_attention"] = "all"; }, {"gemma4_text", "use_bidirectional_attention", "all"}},
      {"gemma4", [](json& c) { c["final_logit_softcapping"] = -1.0; }, {"gemma4_text", "final_logit_softcapping"}},
      {"gemma4", [](json& c) { c["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention", "full_attention"}; },
       {"gemma4_text", "layer_types[1]", "chunked_attention"}},
      {"gemma4", [](json& c) { c["layer_types"] = {"sliding_attention", "full_attention"}; }, {"gemma4_text", "layer_types", "4"}},
      {"gemma4", [](json& c) { c["per_layer_config"]["2"]["num_key_value_heads"] = 3; },
       {"gemma4_text", "layer 2", "not a multiple"}},
      {"gemma4", [](json& c) { c["top_k_experts"] = 9; }, {"gemma4_text", "top_k_experts"}},
      {"gemma4", [](json& c) { c["attention_bias"] = true; }, {"gemma4_text", "attention_bias"}},
      {"gemma4_kv", [](json& c) { c["num_kv_shared_layers"] = 6; }, {"gemma4_text", "num_kv_shared_layers"}},
      {"gemma4_kv", [](json& c) { c["per_layer_config"]["5"]["num_key_value_heads"] = 2; },
       {"gemma4_text", "layer 5", "whose heads differ"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const auto& [fixture, edit, fragments] = cases[i];
    const fs::path dir = fixture_with_config(fixture, "gemma4-bad", edit);
    auto backend = make_cpu_backend();
    const std::string msg = expect_error([&] { load_model(dir, *backend); }, Status::corrupt, fragments);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace
