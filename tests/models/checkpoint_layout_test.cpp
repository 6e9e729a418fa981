// Checkpoint layouts beyond the fixtures' own:
//  - Llama 4, Gemma 4 and Kimi K2.5 as published: multimodal checkpoints
//    (Llama4ForConditionalGeneration, Gemma4ForConditionalGeneration,
//    KimiK25ForConditionalGeneration) whose text model sits under a prefix, its config in
//    text_config, beside vision and audio towers. Built here from the text fixtures (the
//    weights renamed as the published checkpoints name them, tower tensors added), they must
//    give the text model's logits bit for bit, from the checkpoint and from a pack, which
//    leaves the towers out; a tensor that is neither text model nor tower is refused in one
//    line.
//  - A tied checkpoint that still carries lm_head.weight (some writers save the copy) loads,
//    the copy skipped.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "tests/format/format_test_util.h"
#include "backends/backend.h"
#include "core/log.h"
#include "tests/models/fixture_util.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/pack.h"
#include "format/safetensors.h"
#include "models/load.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

struct Layout {
  std::string fixture;
  std::string model_type, architecture;
  std::function<std::string(const std::string&)> rename;  // text checkpoint name -> published name
  std::vector<std::string> towers;                       // tensors the text model never reads
  bool tie_at_top = false;                               // tie_word_embeddings on the outer config
};

std::vector<Layout> layouts() {
  return {
      {"llama4", "llama4", "Llama4ForConditionalGeneration", [](const std::string& n) { return "language_model." + n; },
       {"vision_model.patch_embedding.linear.weight", "vision_model.model.layers.0.mlp.fc1.weight",
        "multi_modal_projector.linear_1.weight"}},
      {"llama4_top2", "llama4", "Llama4ForConditionalGeneration",
       [](const std::string& n) { return "language_model." + n; }, {"vision_model.patch_embedding.linear.weight"}},
      {"gemma4", "gemma4", "Gemma4ForConditionalGeneration",
       [](const std::string& n) { return "model.language_model." + n.substr(std::string("model.").size()); },
       {"model.vision_tower.encoder.layers.0.self_attn.q_proj.weight", "model.embed_vision.embedding_projection.weight",
        "model.audio_tower.layers.0.weight", "model.embed_audio.embedding_projection.weight"},
       true},
      {"gemma4_kv", "gemma4", "Gemma4ForConditionalGeneration",
       [](const std::string& n) { return "model.language_model." + n.substr(std::string("model.").size()); },
       {"model.vision_tower.patch_embedder.input_proj.weight"}, true},
      // Kimi K2.5: DeepSeek-V3's text model (its MTP layer too) under language_model.
      {"deepseek_v3", "kimi_k25", "KimiK25ForConditionalGeneration",
       [](const std::string& n) { return "language_model." + n; },
       {"vision_tower.encoder.blocks.0.norm0.weight", "mm_projector.proj.0.weight"}, true},
  };
}

// The published layout of a text fixture, in a fresh directory; `extra` names one more tensor.
fs::path published_checkpoint(const Layout& lay, const std::string& extra = "") {
  const fs::path dir = pack_test_dir("multimodal-" + lay.fixture);
  Checkpoint ck = Checkpoint::open(fixture_dir(lay.fixture));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : ck.names()) tensors.push_back({lay.rename(name), ck.get(name)});
  static const std::vector<float> tower_values(64, 0.5f);
  std::vector<std::string> towers = lay.towers;
  if (!extra.empty()) towers.push_back(extra);
  for (const std::string& t : towers)
    tensors.push_back({t, Tensor(DType::f32, {8, 8}, const_cast<float*>(tower_values.data()))});
  write_safetensors(dir / "model.safetensors", tensors);
  json text = read_json_file(fixture_dir(lay.fixture) / "config.json");
  json outer = {{"architectures", {lay.architecture}},
                {"model_type", lay.model_type},
                {"vision_config", {{"hidden_size", 8}}},
                {"transformers_version", "5.17.0"}};
  if (lay.tie_at_top) {
    outer["tie_word_embeddings"] = text["tie_word_embeddings"];
    text.erase("tie_word_embeddings");
  }
  for (const char* id : {"bos_token_id", "eos_token_id"})  // the outer config carries them
    if (text.contains(id)) {
      outer[id] = text[id];
      text.erase(id);
    }
  outer["text_config"] = text;
  std::ofstream(dir / "config.json") << outer.dump(1);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::copy_file(fixture_dir(lay.fixture) / f, dir / f);
  return dir;
}

TEST(Multimodal, PublishedLayoutsGiveTheTextModelsLogits) {
  for (const Layout& lay : layouts()) {
    SCOPED_TRACE(lay.fixture);
    const std::vector<int32_t> ids = full_ids(lay.fixture);
    const std::vector<float> text = teacher_forced(fixture_dir(lay.fixture), ids);
    const fs::path dir = published_checkpoint(lay);

    std::vector<std::string> lines;
    const LogLevel before = log_level();
    log_set_level(LogLevel::info);
    log_set_sink([&](LogLevel, const std::string& msg) { lines.push_back(msg); });
    const std::vector<float> mm = teacher_forced(dir, ids);
    log_set_sink({});
    log_set_level(before);
    EXPECT_EQ(max_abs_diff(mm, text), 0.0f);
    int mentions = 0;
    for (const auto& l : lines) mentions += l.find(str("skipping what it never reads (", lay.towers.size(), " tensors")) != std::string::npos;
    EXPECT_EQ(mentions, 1);

    // The pack leaves the towers out and gives the same logits as the text checkpoint's pack.
    const fs::path pack_dir = pack_test_dir("multimodal-pack-" + lay.fixture);
    ConvertOptions o;
    o.kinds = {DType::q4};
    o.force = true;
    convert_checkpoint(dir, pack_dir, o);
    std::shared_ptr<Pack> pack = Pack::open(pack_dir);
    EXPECT_EQ(pack->manifest().family, lay.model_type);
    for (const std::string& t : lay.towers) EXPECT_FALSE(pack->has_dense(t)) << t;
    LoadOptions lo;
    lo.expert_kind = DType::q4;
    EXPECT_EQ(max_abs_diff(teacher_forced(pack_dir, ids, lo), teacher_forced(fixture_pack(lay.fixture), ids, lo)), 0.0f);
  }
}

TEST(Multimodal, ATensorOutsideTheTextModelAndTheTowersIsRefused) {
  for (const Layout& lay : layouts()) {
    SCOPED_TRACE(lay.fixture);
    const fs::path dir = published_checkpoint(lay, "unknown_part.proj.weight");
    auto backend = make_cpu_backend();
    const std::string msg =
        expect_error([&] { load_model(dir, *backend); }, Status::corrupt, {"unknown_part.proj.weight"});
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(TiedHead, ACopyOfTheEmbeddingAsLmHeadIsSkipped) {
  for (const std::string fixture : {"gemma4", "gemma4_kv"}) {
    SCOPED_TRACE(fixture);
    const std::vector<int32_t> ids = full_ids(fixture);
    const fs::path dir = pack_test_dir("tied-head-" + fixture);
    Checkpoint ck = Checkpoint::open(fixture_dir(fixture));
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& name : ck.names()) tensors.push_back({name, ck.get(name)});
    tensors.push_back({"lm_head.weight", ck.get("model.embed_tokens.weight")});
    write_safetensors(dir / "model.safetensors", tensors);
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      fs::copy_file(fixture_dir(fixture) / f, dir / f);
    EXPECT_EQ(max_abs_diff(teacher_forced(dir, ids), teacher_forced(fixture_dir(fixture), ids)), 0.0f);
  }
  // An untied family's checkpoint with its config switched to tied: the head is the embedding
  // (other logits), the checkpoint's lm_head skipped, not an error.
  for (const std::string fixture : {"qwen3_moe", "mixtral", "olmoe", "llama4"}) {
    SCOPED_TRACE(fixture);
    const std::vector<int32_t> ids = full_ids(fixture);
    const fs::path dir = fixture_with_config(fixture, "tied-" + fixture, [](json& c) { c["tie_word_embeddings"] = true; });
    EXPECT_GT(max_abs_diff(teacher_forced(dir, ids), teacher_forced(fixture_dir(fixture), ids)), 1e-3f);
  }
}

}  // namespace
