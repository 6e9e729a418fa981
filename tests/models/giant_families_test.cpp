// DeepSeek-V3 / Kimi K2, GLM-4.5 and MiniMax-M2 beyond their parity fixtures (parity_test.cpp
// runs those): multi-head latent attention's latent cache decoded token by token equals the
// expanded form and the whole-prompt pass; Kimi K2's and Kimi K2.5's configs load the same
// model; the multi-token-prediction layer is skipped, named with -v and left out of a pack;
// the latent cache's bytes a token; config errors name the family and the field.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/backend.h"
#include "core/log.h"
#include "tests/models/fixture_util.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/pack.h"
#include "models/load.h"
#include "models/mla.h"
#include "models/rope.h"
#include "models/weight_loader.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

// Log lines at info level (-v) while f runs.
template <typename F>
std::vector<std::string> info_lines(F&& f) {
  std::vector<std::string> lines;
  const LogLevel before = log_level();
  log_set_level(LogLevel::info);
  log_set_sink([&](LogLevel, const std::string& msg) { lines.push_back(msg); });
  try {
    f();
  } catch (...) {
    log_set_sink({});
    log_set_level(before);
    throw;
  }
  log_set_sink({});
  log_set_level(before);
  return lines;
}

int count_containing(const std::vector<std::string>& lines, const std::string& text) {
  int n = 0;
  for (const auto& l : lines) n += l.find(text) != std::string::npos;
  return n;
}

std::vector<float> to_vector(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::f32) {
    be.to_host(t, out.data());
  } else {  // bf16: the values through get_rows' conversion, one row a cache row
    std::vector<int32_t> ids(static_cast<size_t>(t.shape[0]));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const int64_t cols = t.numel() / t.shape[0];
    Tensor f = be.alloc(DType::f32, {t.shape[0], cols});
    be.get_rows(t.reshape({t.shape[0], cols}), ids, f);
    be.to_host(f, out.data());
  }
  return out;
}

// One latent attention layer of a fixture, its inputs and the three ways to run a sequence.
struct MlaLayer {
  std::unique_ptr<Backend> be = make_cpu_backend();
  MlaSpec spec;
  RopeConfig rope;
  MlaWeights w;

  explicit MlaLayer(const std::string& fixture) {
    const nlohmann::json cfg = read_json_file(fixture_dir(fixture) / "config.json");
    spec.n_embd = cfg["hidden_size"];
    spec.n_head = cfg["num_attention_heads"];
    spec.q_lora_rank = cfg["q_lora_rank"].is_null() ? 0 : cfg["q_lora_rank"].get<int64_t>();
    spec.kv_lora_rank = cfg["kv_lora_rank"];
    spec.qk_nope_head_dim = cfg["qk_nope_head_dim"];
    spec.qk_rope_head_dim = cfg["qk_rope_head_dim"];
    spec.v_head_dim = cfg["v_head_dim"];
    spec.scale = 1.1f / std::sqrt(static_cast<float>(spec.qk_head_dim()));
    rope = rope_config_from_json(cfg, fixture, spec.qk_rope_head_dim, cfg["max_position_embeddings"]);
    rope.interleaved = cfg["rope_interleave"];
    CheckpointSource source(Checkpoint::open(fixture_dir(fixture)));
    WeightLoader wl(source, *be, fixture);
    w = load_mla(wl, "model.layers.1.self_attn.", spec);
  }

  // Runs the rows h [n, n_embd] in chunks (their sizes), each in `form`, through a fresh cache
  // of n_ctx rows: the outputs [n, n_embd] and the cache's values.
  std::pair<std::vector<float>, std::vector<float>> run(const std::vector<float>& h_host, int64_t n,
                                                        const std::vector<int64_t>& chunks, MlaForm form) {
    const int64_t d = spec.n_embd, n_ctx = n + 3;
    Tensor cache = be->alloc(be->kv_dtype(), {n_ctx, 1, spec.latent_dim()});
    if (cache.dtype == DType::f32) be->fill(cache, 0.0f);
    Tensor h = be->alloc(DType::f32, {n, d}), out = be->alloc(DType::f32, {n, d});
    be->from_host(h, h_host.data());
    int64_t at = 0;
    for (int64_t m : chunks) {
      const RopeTables t = rope_tables_for(*be, rope, at, m);
      mla_attention_block(*be, spec, rope, w, h.slice_rows(at, m), cache, at, t.cos, t.sin, out.slice_rows(at, m), {},
                          nullptr, form);
      at += m;
    }
    EXPECT_EQ(at, n);
    return {to_vector(*be, out), to_vector(*be, cache.slice_rows(0, n))};
  }
};

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

// The latent cache holds kv_lora_rank + qk_rope_head_dim values a token; decoding a token at
// a time in the absorbed form gives the whole prompt's absorbed pass bit for bit (f32 and bf16
// caches), and the expanded form (keys and values per head, in uneven chunks) the same values
// within f32 rounding: both forms compute the same sums in another order.
TEST(MlaLatentCache, DecodeEqualsExpandedForm) {
  for (const std::string fixture : {"deepseek_v3", "deepseek_v3_plain"}) {
    for (DType kv : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(fixture + " " + std::string(dtype_name(kv)));
      MlaLayer layer(fixture);
      layer.be->set_kv_dtype(kv);
      const int64_t n = 21, d = layer.spec.n_embd;
      std::mt19937 rng(3);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> h(static_cast<size_t>(n * d));
      for (float& x : h) x = dist(rng);
      const auto [whole, cache_whole] = layer.run(h, n, {n}, MlaForm::absorbed);
      std::vector<int64_t> ones(static_cast<size_t>(n), 1);
      const auto [stepped, cache_stepped] = layer.run(h, n, ones, MlaForm::absorbed);
      const auto [expanded, cache_expanded] = layer.run(h, n, {6, 15}, MlaForm::expanded);
      EXPECT_EQ(cache_whole.size(), static_cast<size_t>(n * (layer.spec.kv_lora_rank + layer.spec.qk_rope_head_dim)));
      EXPECT_EQ(floats_differing(cache_whole, cache_stepped), 0u);
      EXPECT_EQ(floats_differing(cache_whole, cache_expanded), 0u) << "the latents do not depend on the form";
      EXPECT_EQ(floats_differing(whole, stepped), 0u) << "token-by-token decode differs from the whole prompt";
      const float diff = max_abs_diff(whole, expanded), scale = max_abs(whole);
      std::printf("mla %s %s: absorbed vs expanded max |diff| %.3g (outputs up to %.3g)\n", fixture.c_str(),
                  std::string(dtype_name(kv)).c_str(), diff, scale);
      // f32 sums of ~100 products in two orders: relative differences of a few 1e-7.
      EXPECT_LE(diff, 2e-6f * std::max(1.0f, scale));
      EXPECT_GT(scale, 0.01f);
    }
  }
}

// Kimi K2 names DeepSeek-V3's architecture model_type kimi_k2; Kimi K2.5 nests it in
// text_config: both load the deepseek_v3 fixture's weights to the same logits bit for bit.
TEST(GiantFamilies, KimiConfigsAreDeepseekV3) {
  const std::vector<int32_t> ids = full_ids("deepseek_v3");
  const std::vector<float> want = teacher_forced(fixture_dir("deepseek_v3"), ids);
  const fs::path k2 = fixture_with_config("deepseek_v3", "kimi-k2", [](nlohmann::json& c) { c["model_type"] = "kimi_k2"; });
  EXPECT_EQ(floats_differing(teacher_forced(k2, ids), want), 0u);
  const fs::path k25 = fixture_with_config("deepseek_v3", "kimi-k25", [](nlohmann::json& c) {
    nlohmann::json text = c;
    text.erase("tie_word_embeddings");
    c = {{"architectures", {"KimiK25ForConditionalGeneration"}},
         {"model_type", "kimi_k25"},
         {"tie_word_embeddings", false},
         {"text_config", text},
         {"vision_config", {{"hidden_size", 8}}}};
  });
  LoadedModel m = load_model(k25, *make_cpu_backend());
  EXPECT_EQ(m.model->info().family, "kimi_k25");
  EXPECT_EQ(floats_differing(teacher_forced(k25, ids), want), 0u);
}

// The multi-token-prediction layer (model.layers.<num_hidden_layers>.*) is skipped with one
// -v line naming it, and a pack leaves it out; a checkpoint that declares none but holds one
// is refused, naming its tensors.
TEST(GiantFamilies, MtpLayerSkippedNamedAndLeftOutOfPacks) {
  for (const std::string fixture : {"deepseek_v3", "glm4_moe"}) {
    SCOPED_TRACE(fixture);
    const auto lines = info_lines([&] { load_model(fixture_dir(fixture), *make_cpu_backend()); });
    EXPECT_EQ(count_containing(lines, "skipping the multi-token-prediction layer model.layers.3.*"), 1);
    std::shared_ptr<Pack> pack = Pack::open(fixture_pack(fixture));
    for (const std::string& name : pack->dense_names()) EXPECT_NE(name.rfind("model.layers.3.", 0), 0u) << name;
    EXPECT_EQ(pack->moe_layer_of_prefix("model.layers.3.mlp.experts."), -1);
    const fs::path none = fixture_with_config(fixture, fixture + "-no-mtp",
                                              [](nlohmann::json& c) { c["num_nextn_predict_layers"] = 0; });
    try {
      load_model(none, *make_cpu_backend());
      ADD_FAILURE() << "a checkpoint with an undeclared MTP layer loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("model.layers.3."), std::string::npos) << e.what();
    }
  }
}

// -v reports the latent cache's bytes a token; context_bytes counts one latent row a layer
// (and the rotary tables' rows).
TEST(GiantFamilies, LatentCacheBytesAToken) {
  for (DType kv : {DType::f32, DType::bf16}) {
    auto be = make_cpu_backend();
    be->set_kv_dtype(kv);
    std::unique_ptr<Model> model;
    const auto lines = info_lines([&] { model = load_model(fixture_dir("deepseek_v3"), *be).model; });
    // 3 layers x (32 + 8) values; the rotary tables: cos and sin, 4 f32 each.
    const uint64_t per_token = 3 * 40 * dtype_size(kv);
    EXPECT_EQ(count_containing(lines, str("latent KV cache: 40 values a token and layer (kv_lora_rank 32 + "
                                          "qk_rope_head_dim 8): ", per_token, " bytes a token")),
              1);
    EXPECT_EQ(model->context_bytes(100), 100 * (per_token + 2 * 4 * sizeof(float)));
  }
}

// Config errors are one line naming the family and the field.
TEST(GiantFamilies, ConfigErrorsNameFamilyAndField) {
  struct Bad {
    std::string fixture, key;
    nlohmann::json value;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {"deepseek_v3", "n_group", 3, "deepseek_v3: n_routed_experts (16) is not a multiple of n_group (3)"},
      {"deepseek_v3", "topk_group", 5, "deepseek_v3: topk_group (5) exceeds n_group (4)"},
      {"deepseek_v3", "num_key_value_heads", 2, "deepseek_v3: num_key_value_heads (2) differs from num_attention_heads (4)"},
      {"deepseek_v3", "n_group", 16, "deepseek_v3: n_group (16) leaves fewer than 2 experts a group"},
      {"glm4_moe", "num_experts_per_tok", 12, "glm4_moe: num_experts_per_tok (12) exceeds the 8 experts of the topk_group (1) groups kept"},
      {"glm4_moe", "routed_scaling_factor", -1.0, "glm4_moe: routed_scaling_factor (-1) must be positive"},
      {"minimax_m2", "rotary_dim", 6, "minimax_m2: rotary_dim (6) disagrees with partial_rotary_factor (0.5) x head_dim (16)"},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.fixture + " " + b.key);
    const fs::path dir = fixture_with_config(b.fixture, b.fixture + "-bad", [&](nlohmann::json& c) { c[b.key] = b.value; });
    try {
      load_model(dir, *make_cpu_backend());
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

// The fixtures' packs (convert, every expert kind) pass sluice verify: records against their
// checksums, and the manifest's config against the dense tensors and records (check_pack_model).
TEST(GiantFamilies, PacksVerify) {
  for (const std::string& fixture : giant_fixtures()) {
    SCOPED_TRACE(fixture);
    const PackVerifyResult r = verify_pack(fixture_pack(fixture));
    EXPECT_TRUE(r.ok);
    check_pack_model(fixture_pack(fixture));
  }
}

