// convert_checkpoint: both expert layouts give the same records, failures leave nothing that
// looks like a pack, existing output is protected, and bad checkpoints are refused before
// anything is written, with errors naming the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "tests/format/format_test_util.h"
#include "convert/convert.h"
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

// A copy of a fixture's files (config, tokenizer) with new tensors.
fs::path write_variant(const std::string& fixture, const std::string& name,
                       const std::vector<std::pair<std::string, Tensor>>& tensors) {
  fs::path dir = pack_test_dir(name);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(fixture_dir(fixture) / f)) fs::copy_file(fixture_dir(fixture) / f, dir / f);
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

std::vector<std::pair<std::string, Tensor>> all_tensors(Checkpoint& ck) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const std::string& n : ck.names()) out.emplace_back(n, ck.get(n));
  return out;
}

// Nothing but `keep` in the directory: no temporary directory was left behind.
void expect_only(const fs::path& parent, const std::set<std::string>& keep) {
  for (const auto& e : fs::directory_iterator(parent))
    EXPECT_TRUE(keep.count(e.path().filename().string())) << "left behind: " << e.path();
}

ConvertOptions kinds(std::vector<DType> k) {
  ConvertOptions o;
  o.kinds = std::move(k);
  return o;
}

// transformers 5's fused layout ([E, 2 ff, d] gate rows first, [E, d, ff]) converts to the
// same records and dense bytes as the per-expert tensors, and loads.
TEST(Convert, FusedAndPerExpertLayoutsGiveTheSameRecords) {
  Checkpoint ck = Checkpoint::open(fixture_dir("qwen3_moe"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<std::shared_ptr<std::vector<float>>> storage;
  const int64_t E = 8, d = 64, ff = 32;
  for (const std::string& n : ck.names())
    if (n.find(".experts.") == std::string::npos) tensors.emplace_back(n, ck.get(n));
  for (int layer : {0, 2}) {  // layer 1 is dense (mlp_only_layers)
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    auto gu = std::make_shared<std::vector<float>>(E * 2 * ff * d), dn = std::make_shared<std::vector<float>>(E * d * ff);
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + std::to_string(e) + ".";
      std::memcpy(gu->data() + e * 2 * ff * d, ck.get(ep + "gate_proj.weight").data, ff * d * 4);
      std::memcpy(gu->data() + e * 2 * ff * d + ff * d, ck.get(ep + "up_proj.weight").data, ff * d * 4);
      std::memcpy(dn->data() + e * d * ff, ck.get(ep + "down_proj.weight").data, d * ff * 4);
    }
    storage.push_back(gu);
    storage.push_back(dn);
    tensors.emplace_back(p + "gate_up_proj", Tensor(DType::f32, {E, 2 * ff, d}, gu->data()));
    tensors.emplace_back(p + "down_proj", Tensor(DType::f32, {E, d, ff}, dn->data()));
  }
  fs::path fused = write_variant("qwen3_moe", "fused", tensors);
  fs::path out = pack_test_dir("fused-out") / "pack";
  convert_checkpoint(fused, out, kinds({DType::bf16, DType::q8, DType::q4, DType::q2}));
  const fs::path& ref = fixture_pack("qwen3_moe");
  for (const char* f : {"dense.bin", "experts.bf16.bin", "experts.int8.bin", "experts.q4.bin", "experts.q2.bin"})
    EXPECT_TRUE(read_bytes(out / f) == read_bytes(ref / f)) << f;
  std::shared_ptr<Pack> pack = Pack::open(out);
  EXPECT_EQ(pack->manifest().expert_sources, (std::vector<std::string>{"fused", "fused"}));
  EXPECT_EQ(pack->manifest().moe_layers, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(pack->manifest().kinds.at(DType::q4).checksums, Pack::open(ref)->manifest().kinds.at(DType::q4).checksums);
  auto backend = make_cpu_backend();
  EXPECT_NO_THROW(load_model(out, *backend));
  EXPECT_TRUE(verify_pack(out).ok);
}

// A sharded checkpoint (model.safetensors.index.json) converts to the same records and the
// same dense tensors as the single file.
TEST(Convert, ShardedCheckpoint) {
  Checkpoint ck = Checkpoint::open(fixture_dir("mixtral"));
  std::vector<std::pair<std::string, Tensor>> a, b;
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  for (const std::string& n : ck.names()) {
    const bool first = n.find("layers.1.") == std::string::npos;  // layer 1 in the second shard
    (first ? a : b).emplace_back(n, ck.get(n));
    index["weight_map"][n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  fs::path dir = pack_test_dir("sharded");
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fixture_dir("mixtral") / f, dir / f);
  write_safetensors(dir / "model-00001-of-00002.safetensors", a);
  write_safetensors(dir / "model-00002-of-00002.safetensors", b);
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  const fs::path out = pack_test_dir("sharded-out") / "pack";
  const fs::path one = pack_test_dir("single-out") / "pack";
  convert_checkpoint(dir, out, kinds({DType::q8, DType::q2}));
  convert_checkpoint(fixture_dir("mixtral"), one, kinds({DType::q8, DType::q2}));
  for (const char* f : {"experts.int8.bin", "experts.q2.bin"}) EXPECT_TRUE(read_bytes(out / f) == read_bytes(one / f)) << f;
  std::shared_ptr<Pack> p = Pack::open(out), q = Pack::open(one);
  ASSERT_EQ(p->dense_names(), q->dense_names());
  for (const std::string& n : p->dense_names()) {
    Tensor x = p->dense(n), y = q->dense(n);
    ASSERT_EQ(x.shape_str(), y.shape_str()) << n;
    EXPECT_EQ(0, std::memcmp(x.data, y.data, x.nbytes())) << n;
  }
  EXPECT_TRUE(verify_pack(out).ok);
}

TEST(Convert, DefaultsAndDenseDtype) {
  fs::path parent = pack_test_dir("defaults");
  ConvertSummary s = convert_checkpoint(fixture_dir("mixtral"), parent / "pack", {});
  EXPECT_EQ(s.kinds, (std::vector<DType>{DType::bf16, DType::q4, DType::q2}));
  EXPECT_EQ(s.dense_dtype, DType::f32);  // an f16 checkpoint: f32 keeps every value
  EXPECT_EQ(s.n_records, 2 * 8);
  std::shared_ptr<Pack> pack = Pack::open(parent / "pack");
  EXPECT_EQ(pack->manifest().expert_sources[0], "w1,w3,w2");
  EXPECT_EQ(pack->manifest().expert_prefixes[0], "model.layers.0.block_sparse_moe.experts.");
  ConvertOptions o;
  o.kinds = {DType::q4};
  o.dense_dtype = DType::bf16;
  s = convert_checkpoint(fixture_dir("qwen3_moe"), parent / "bf16dense", o);
  pack = Pack::open(parent / "bf16dense");
  EXPECT_EQ(pack->manifest().dense_dtype, DType::bf16);
  EXPECT_EQ(pack->dense("lm_head.weight").dtype, DType::bf16);
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(parent / "bf16dense", *backend);
  EXPECT_EQ(m.expert_kind, DType::q4);
  convert_checkpoint(fixture_dir("olmoe"), (parent / "slash").string() + "/", kinds({DType::q2}));
  EXPECT_TRUE(Pack::is_pack(parent / "slash"));
  expect_only(parent, {"pack", "bf16dense", "slash"});
}

TEST(Convert, RefusesToOverwriteWithoutForce) {
  fs::path parent = pack_test_dir("force");
  const fs::path out = parent / "pack";
  convert_checkpoint(fixture_dir("olmoe"), out, kinds({DType::q2}));
  expect_error([&] { convert_checkpoint(fixture_dir("olmoe"), out, kinds({DType::q4})); }, Status::invalid_argument,
               {"already holds a pack", "--force"});
  EXPECT_TRUE(Pack::open(out)->has_kind(DType::q2));
  ConvertOptions o = kinds({DType::q4});
  o.force = true;
  convert_checkpoint(fixture_dir("olmoe"), out, o);
  EXPECT_TRUE(Pack::open(out)->has_kind(DType::q4));
  EXPECT_FALSE(Pack::open(out)->has_kind(DType::q2));
  EXPECT_FALSE(fs::exists(out / "experts.q2.bin"));
  expect_only(parent, {"pack"});
  // A directory that is not a pack is never replaced, even with --force.
  fs::create_directories(parent / "mine");
  write_bytes(parent / "mine" / "notes.txt", "precious");
  expect_error([&] { convert_checkpoint(fixture_dir("olmoe"), parent / "mine", o); }, Status::invalid_argument,
               {"not a sluice pack", "refusing"});
  EXPECT_EQ(read_bytes(parent / "mine" / "notes.txt"), "precious");
  // An empty directory is fine.
  fs::create_directories(parent / "empty");
  convert_checkpoint(fixture_dir("olmoe"), parent / "empty", kinds({DType::q4}));
  EXPECT_TRUE(Pack::is_pack(parent / "empty"));
  expect_error([&] { convert_checkpoint(parent / "empty", parent / "again", o); }, Status::invalid_argument, {"already a sluice pack"});
}

// A failure deep into the experts (a NaN in the last expert of the last layer) leaves no
// output and no temporary directory.
TEST(Convert, FailureLeavesNothingBehind) {
  Checkpoint ck = Checkpoint::open(fixture_dir("olmoe"));
  auto tensors = all_tensors(ck);
  std::vector<uint16_t> bad;
  for (auto& [name, t] : tensors)
    if (name == "model.layers.1.mlp.experts.7.down_proj.weight") {
      bad.assign(static_cast<const uint16_t*>(t.data), static_cast<const uint16_t*>(t.data) + t.numel());
      bad[5 * 40 + 3] = f32_to_bf16(NAN);  // row 5
      t.data = bad.data();
    }
  fs::path src = write_variant("olmoe", "nan", tensors);
  fs::path parent = pack_test_dir("nan-out");
  expect_error([&] { convert_checkpoint(src, parent / "pack", kinds({DType::bf16, DType::q4})); }, Status::corrupt,
               {"model.layers.1.mlp.experts.7.down_proj.weight", "row 5", "NaN"});
  expect_only(parent, {});
  // The bf16 kind alone copies the values (NaN included) and succeeds.
  EXPECT_NO_THROW(convert_checkpoint(src, parent / "pack", kinds({DType::bf16})));
}

TEST(Convert, BadCheckpointsAreRefusedBeforeWriting) {
  fs::path parent = pack_test_dir("bad-ck");
  // Unknown family.
  fs::path llama = pack_test_dir("llama");
  fs::copy(fixture_dir("olmoe"), llama, fs::copy_options::recursive);
  std::ofstream(llama / "config.json", std::ios::trunc) << R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})";
  expect_error([&] { convert_checkpoint(llama, parent / "a", {}); }, Status::unsupported, {"unknown model family 'llama'"});
  // A missing expert tensor.
  Checkpoint ck = Checkpoint::open(fixture_dir("olmoe"));
  auto tensors = all_tensors(ck);
  std::erase_if(tensors, [](const auto& p) { return p.first == "model.layers.0.mlp.experts.3.up_proj.weight"; });
  fs::path missing = write_variant("olmoe", "missing", tensors);
  expect_error([&] { convert_checkpoint(missing, parent / "b", {}); }, Status::not_found,
               {"model.layers.0.mlp.experts.3.up_proj.weight"});
  // An expert tensor of the wrong shape.
  tensors = all_tensors(ck);
  for (auto& [name, t] : tensors)
    if (name == "model.layers.1.mlp.experts.2.gate_proj.weight") t = t.reshape({20, 128});
  fs::path shaped = write_variant("olmoe", "shaped", tensors);
  expect_error([&] { convert_checkpoint(shaped, parent / "c", {}); }, Status::corrupt,
               {"model.layers.1.mlp.experts.2.gate_proj.weight", "[20, 128]"});
  // No such directory; no kinds.
  expect_error([&] { convert_checkpoint(parent / "nope", parent / "d", {}); }, Status::not_found, {"nope"});
  expect_error([&] { convert_checkpoint(fixture_dir("olmoe"), parent / "e", kinds({})); }, Status::invalid_argument, {"no expert kinds"});
  expect_only(parent, {});
}

}  // namespace

// Llama 4's experts are stored inputs first ([E, d, 2 ff] gate columns then up columns, and
// [E, ff, d]); convert transposes them in tiles of 64 block rows. A checkpoint whose
// projections span several tiles with a partial last one (ff 72, d 80) gives records whose
// bf16 rows are the checkpoint's columns, bit for bit, and it loads.
TEST(Convert, InputsFirstExpertsTransposeAcrossTiles) {
  const int64_t d = 80, ff = 72, E = 4, V = 512, H = 4, KV = 2, HD = 16, ff_mlp = 48;
  nlohmann::json cfg = read_json_file(fixture_dir("llama4") / "config.json");
  cfg["hidden_size"] = d;
  cfg["intermediate_size"] = ff;
  cfg["intermediate_size_mlp"] = ff_mlp;
  cfg["num_local_experts"] = E;
  cfg["num_hidden_layers"] = 2;
  cfg["moe_layers"] = {1};
  cfg["layer_types"] = {"chunked_attention", "full_attention"};
  cfg["no_rope_layers"] = {1, 0};
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"lm_head.weight", {V, d}}, {"model.embed_tokens.weight", {V, d}}, {"model.norm.weight", {d}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (auto [n, s] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"input_layernorm.weight", {d}}, {"post_attention_layernorm.weight", {d}},
             {"self_attn.q_proj.weight", {H * HD, d}}, {"self_attn.k_proj.weight", {KV * HD, d}},
             {"self_attn.v_proj.weight", {KV * HD, d}}, {"self_attn.o_proj.weight", {d, H * HD}}})
      shapes.emplace_back(p + n, s);
    const std::string f = p + "feed_forward.";
    if (l == 0) {
      shapes.push_back({f + "gate_proj.weight", {ff_mlp, d}});
      shapes.push_back({f + "up_proj.weight", {ff_mlp, d}});
      shapes.push_back({f + "down_proj.weight", {d, ff_mlp}});
    } else {
      shapes.push_back({f + "experts.gate_up_proj", {E, d, 2 * ff}});
      shapes.push_back({f + "experts.down_proj", {E, ff, d}});
      shapes.push_back({f + "router.weight", {E, d}});
      shapes.push_back({f + "shared_expert.gate_proj.weight", {ff, d}});
      shapes.push_back({f + "shared_expert.up_proj.weight", {ff, d}});
      shapes.push_back({f + "shared_expert.down_proj.weight", {d, ff}});
    }
  }
  std::vector<std::vector<uint16_t>> storage;
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint32_t seed = 12345;
  for (const auto& [name, s] : shapes) {
    int64_t n = 1;
    for (int64_t x : s) n *= x;
    std::vector<uint16_t>& v = storage.emplace_back(static_cast<size_t>(n));
    for (uint16_t& x : v) {  // finite bf16 values of magnitude 2^-8 .. 2^-2, distinct enough to tell rows apart
      seed = seed * 1664525u + 1013904223u;
      x = static_cast<uint16_t>(((seed >> 31) << 15) | ((0x77 + (seed >> 8) % 6) << 7) | ((seed >> 16) & 0x7f));
    }
    Tensor t(DType::bf16, {1}, v.data());
    t.ndim = static_cast<int>(s.size());
    for (size_t i = 0; i < s.size(); ++i) t.shape[i] = s[i];
    tensors.emplace_back(name, t);
  }
  const fs::path dir = pack_test_dir("inputs-first-tiles");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fixture_dir("llama4") / f, dir / f);
  std::ofstream(dir / "config.json") << cfg.dump(1);
  write_safetensors(dir / "model.safetensors", tensors);
  const fs::path out = pack_test_dir("inputs-first-tiles-out") / "pack";
  convert_checkpoint(dir, out, kinds({DType::bf16, DType::q4}));
  std::shared_ptr<Pack> pack = Pack::open(out);
  EXPECT_EQ(pack->manifest().expert_sources, (std::vector<std::string>{"fused_inputs_first"}));
  const std::string f = "model.layers.1.feed_forward.experts.";
  const uint16_t *gu = nullptr, *dn = nullptr;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (shapes[i].first == f + "gate_up_proj") gu = storage[i].data();
    if (shapes[i].first == f + "down_proj") dn = storage[i].data();
  }
  ASSERT_TRUE(gu && dn);
  size_t differ = 0;
  for (int64_t e = 0; e < E; ++e) {
    const ExpertWeights w = expert_view(pack->kind(DType::bf16), pack->mapped_record(DType::bf16, e).data());
    const auto *g = w.gate.ptr<uint16_t>(), *u = w.up.ptr<uint16_t>(), *o = w.down.ptr<uint16_t>();
    for (int64_t r = 0; r < ff; ++r)
      for (int64_t c = 0; c < d; ++c) {
        differ += g[r * d + c] != gu[(e * d + c) * 2 * ff + r];
        differ += u[r * d + c] != gu[(e * d + c) * 2 * ff + ff + r];
      }
    for (int64_t r = 0; r < d; ++r)
      for (int64_t c = 0; c < ff; ++c) differ += o[r * ff + c] != dn[(e * ff + c) * d + r];
  }
  EXPECT_EQ(differ, 0u) << "record values that are not the checkpoint's transposed";
  auto backend = make_cpu_backend();
  EXPECT_NO_THROW(load_model(out, *backend));
  EXPECT_TRUE(verify_pack(out).ok);
}
