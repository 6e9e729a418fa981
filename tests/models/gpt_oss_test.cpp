// gpt-oss beyond the shared parity tests (parity_test.cpp, pack_parity_test.cpp and the
// streaming tests run its two fixtures like every other):
//  - the MXFP4 kind of a pack converted from an MXFP4 checkpoint holds the checkpoint's
//    blocks and scales bit for bit (gate = even rows, up = odd rows of gate_up_proj), and
//    the biases as the f32 values of the stored bf16 ones, de-interleaved;
//  - each of the family's switches changes the logits of its fixture (the clamp limit, the
//    sliding window), so the parity tests do test them;
//  - damaged gpt-oss checkpoints and packs are refused in one line naming the tensor or field.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>

#include "tests/format/format_test_util.h"
#include "convert/convert.h"
#include "core/quant.h"
#include "tests/models/fixture_util.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/npy.h"
#include "format/pack.h"
#include "format/safetensors.h"
#include "models/load.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

TEST(GptOss, Mxfp4KindIsTheCheckpointsBlocksBitForBit) {
  const std::string fixture = "gpt_oss_mxfp4";
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack(fixture));
  const PackManifest& m = pack->manifest();
  ASSERT_EQ(m.version, 4);  // expert biases
  const PackKindInfo& info = pack->kind(DType::mxfp4);
  ASSERT_TRUE(info.has_biases());
  Checkpoint ck = Checkpoint::open(fixture_dir(fixture));
  const int64_t E = m.n_expert, d = m.n_embd, ff = m.n_ff;
  const int64_t rb_gu = quant_row_bytes(DType::mxfp4, d), sb_gu = quant_scale_row_bytes(DType::mxfp4, d);
  const int64_t rb_dn = quant_row_bytes(DType::mxfp4, ff), sb_dn = quant_scale_row_bytes(DType::mxfp4, ff);
  int64_t rows_checked = 0;
  for (size_t l = 0; l < m.moe_layers.size(); ++l) {
    ASSERT_EQ(m.expert_sources[l], "gpt_oss_mxfp4");
    const std::string& p = m.expert_prefixes[l];
    const auto* gu = ck.get(p + "gate_up_proj_blocks").ptr<uint8_t>();
    const auto* gu_s = ck.get(p + "gate_up_proj_scales").ptr<uint8_t>();
    const auto* dn = ck.get(p + "down_proj_blocks").ptr<uint8_t>();
    const auto* dn_s = ck.get(p + "down_proj_scales").ptr<uint8_t>();
    const Tensor gb = ck.get(p + "gate_up_proj_bias"), db = ck.get(p + "down_proj_bias");
    ASSERT_EQ(gb.dtype, DType::bf16);
    for (int64_t e = 0; e < E; ++e) {
      SCOPED_TRACE(testing::Message() << "layer " << m.moe_layers[l] << " expert " << e);
      const ExpertWeights w =
          expert_view(info, pack->mapped_record(DType::mxfp4, pack->record_id(static_cast<int64_t>(l), e)).data());
      for (int64_t f = 0; f < ff; ++f)
        for (int up = 0; up < 2; ++up) {
          const Tensor& t = up ? w.up : w.gate;
          const int64_t src = e * 2 * ff + 2 * f + up;
          EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(t.data) + f * rb_gu, gu + src * rb_gu, rb_gu));
          EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(t.scales) + f * sb_gu, gu_s + src * sb_gu, sb_gu));
          const float bias = bf16_to_f32(gb.ptr<uint16_t>()[src]);
          EXPECT_EQ(bias, (up ? w.up_bias : w.gate_bias).ptr<float>()[f]);
          ++rows_checked;
        }
      for (int64_t h = 0; h < d; ++h) {
        EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(w.down.data) + h * rb_dn, dn + (e * d + h) * rb_dn, rb_dn));
        EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(w.down.scales) + h * sb_dn, dn_s + (e * d + h) * sb_dn, sb_dn));
        EXPECT_EQ(bf16_to_f32(db.ptr<uint16_t>()[e * d + h]), w.down_bias.ptr<float>()[h]);
        ++rows_checked;
      }
    }
  }
  EXPECT_EQ(rows_checked, static_cast<int64_t>(m.moe_layers.size()) * E * (2 * ff + d));
}

// The fixtures bind every switch: lifting the clamp, widening the window past the prompt, or
// making every layer full attention moves the logits far beyond the parity bound (1e-4).
TEST(GptOss, EachSwitchMovesTheLogits) {
  for (const std::string& fixture : gpt_oss_fixtures()) {
    SCOPED_TRACE(fixture);
    const std::vector<int32_t> ids = full_ids(fixture);
    const std::vector<float> base = teacher_forced(fixture_dir(fixture), ids);
    const NpyArray want = read_npy(fixture_dir(fixture) / "logits_full.npy");
    EXPECT_LE(max_abs_diff(base, want.data), 1e-4f);
    const std::vector<std::pair<std::string, std::function<void(json&)>>> edits = {
        {"no clamp", [](json& c) { c["swiglu_limit"] = 1e9; }},
        {"window 4096", [](json& c) { c["sliding_window"] = 4096; }},
        {"all full", [](json& c) {
           for (auto& t : c["layer_types"]) t = "full_attention";
         }},
        {"alpha 1", [](json& c) { c["swiglu_alpha"] = 1.0; }},
    };
    for (const auto& [what, edit] : edits) {
      const float moved = max_abs_diff(teacher_forced(fixture_with_config(fixture, "gpt-oss-" + fixture, edit), ids), base);
      std::printf("%s %s: logits move by %.3g\n", fixture.c_str(), what.c_str(), moved);
      EXPECT_GT(moved, 1e-2f) << what;
    }
  }
}

std::vector<std::pair<std::string, Tensor>> all_tensors(Checkpoint& ck) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const std::string& n : ck.names()) out.emplace_back(n, ck.get(n));
  return out;
}

// A copy of a fixture's files with its tensors edited (edit may add, drop or replace).
fs::path with_tensors(const std::string& fixture, const std::string& name,
                      const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  const fs::path dir = pack_test_dir(name);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(fixture_dir(fixture) / f)) fs::copy_file(fixture_dir(fixture) / f, dir / f);
  Checkpoint ck = Checkpoint::open(fixture_dir(fixture));
  std::vector<std::pair<std::string, Tensor>> tensors = all_tensors(ck);
  edit(tensors);
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

void drop(std::vector<std::pair<std::string, Tensor>>& ts, const std::string& name) {
  std::erase_if(ts, [&](const auto& t) { return t.first == name; });
}
Tensor& find(std::vector<std::pair<std::string, Tensor>>& ts, const std::string& name) {
  for (auto& [n, t] : ts)
    if (n == name) return t;
  throw std::runtime_error("no tensor " + name);
}

TEST(GptOss, DamagedCheckpointsAreRefusedInOneLine) {
  const std::string p = "model.layers.1.mlp.experts.";
  using Edit = std::function<void(std::vector<std::pair<std::string, Tensor>>&)>;
  static std::vector<uint8_t> bytes(1 << 20, 0);
  const std::vector<std::tuple<std::string, std::string, Edit, Status, std::vector<std::string>>> cases = {
      {"gpt_oss", "no down bias", [&](auto& ts) { drop(ts, p + "down_proj_bias"); }, Status::not_found,
       {"gpt_oss", p + "down_proj_bias"}},
      {"gpt_oss", "gate_up transposed", [&](auto& ts) { find(ts, p + "gate_up_proj").shape = {8, 96, 64, 0}; },
       Status::corrupt, {p + "gate_up_proj", "[8, 96, 64]", "[8, 64, 96]"}},
      {"gpt_oss", "stray tensor",
       [&](auto& ts) { ts.emplace_back(p + "gate_up_proj_scales", Tensor(DType::u8, {8, 96, 2}, bytes.data())); },
       Status::corrupt, {p + "gate_up_proj_scales", "does not use"}},
      {"gpt_oss_mxfp4", "float blocks",
       [&](auto& ts) { find(ts, p + "down_proj_blocks") = Tensor(DType::bf16, {8, 64, 3, 16}, bytes.data()); },
       Status::corrupt, {p + "down_proj_blocks", "bf16", "expected u8"}},
      {"gpt_oss_mxfp4", "short scales", [&](auto& ts) { find(ts, p + "gate_up_proj_scales").shape = {8, 192, 1, 0}; },
       Status::corrupt, {p + "gate_up_proj_scales", "[8, 192, 2]"}},
  };
  for (const auto& [fixture, what, edit, status, fragments] : cases) {
    SCOPED_TRACE(what);
    const fs::path dir = with_tensors(fixture, "gpt-oss-bad", edit);
    const fs::path out = pack_test_dir("gpt-oss-bad-out") / "pack";
    ConvertOptions o;
    o.kinds = {DType::q4};
    const std::string msg = expect_error([&] { convert_checkpoint(dir, out, o); }, status, fragments);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(out));
  }
}

void edit_manifest(const fs::path& dir, const std::function<void(json&)>& edit) {
  json j = read_json_file(dir / kPackManifestName);
  edit(j);
  fs::remove(dir / kPackManifestName);
  std::ofstream(dir / kPackManifestName) << j.dump(1);
}

// Version 4's expert biases, damaged in the manifest: one line naming the field.
TEST(GptOss, DamagedBiasEntriesAreRefused) {
  const fs::path good = fixture_pack("gpt_oss");
  const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
      {[](json& j) { j["version"] = 3; }, {"has expert biases", "version 4"}},
      {[](json& j) { j["kinds"]["q4"]["up_bias"]["bytes"] = 4; }, {"kinds.q4.up_bias.bytes", "48 f32 values are 192"}},
      {[](json& j) { j["kinds"]["q4"]["down_bias"]["n"] = 48; }, {"kinds.q4.down_bias.n", "64 values"}},
      {[](json& j) { j["kinds"]["q4"]["gate_bias"]["offset"] = j["kinds"]["q4"]["down"]["offset"]; }, {"kinds.q4", "overlaps"}},
      {[](json& j) { j["kinds"]["q4"]["gate_bias"]["offset"] = 65; }, {"kinds.q4.gate_bias.offset", "multiple of 64"}},
      {[](json& j) { j["kinds"]["q4"].erase("up_bias"); }, {"kinds.q4", "up_bias"}},
      {[](json& j) { j["kinds"]["q4"]["down_bias"]["offset"] = 1 << 20; }, {"kinds.q4.down_bias", "run past the end"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const fs::path d = pack_test_dir("gpt-oss-bias-bad");
    fs::copy(good, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    edit_manifest(d, cases[i].first);
    const std::string msg = expect_error([&] { Pack::open(d); }, Status::corrupt, cases[i].second);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace
