// The pack format: manifest round trip, record layouts, expert views against the
// checkpoint, verify catching a flipped byte in every record, and a table of handcrafted
// corrupt packs (bad magic or version, truncated files, offsets past the end, overlaps,
// strides smaller than a record, checksum errors, sizes that would allocate terabytes,
// dtypes that do not fit their role), each with a clear error naming what is wrong.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <random>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "convert/convert.h"
#include "core/quant.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/pack.h"
#include "tests/format/format_test_util.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A copy of the olmoe fixture pack to damage.
fs::path pack_copy(const std::string& name) {
  fs::path d = pack_test_dir(name);
  fs::copy(fixture_pack("olmoe"), d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return d;
}

void edit_manifest(const fs::path& dir, const std::function<void(json&)>& fn) {
  json j = read_json_file(dir / kPackManifestName);
  fn(j);
  std::ofstream(dir / kPackManifestName, std::ios::trunc) << j.dump(1);
}

void poke(const fs::path& file, uint64_t offset, const std::string& bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good());
}

uint8_t flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  return static_cast<uint8_t>(c);
}

TEST(Pack, ManifestRoundTripsAndDescribesTheFiles) {
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack("olmoe"));
  const PackManifest& m = pack->manifest();
  EXPECT_EQ(m.family, "olmoe");
  EXPECT_EQ(m.moe_layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(m.expert_prefixes[1], "model.layers.1.mlp.experts.");
  EXPECT_EQ(m.expert_sources[0], "gate_proj,up_proj,down_proj");
  EXPECT_EQ(m.n_expert, 8);
  EXPECT_EQ(m.n_ff, 40);
  EXPECT_EQ(m.dense_dtype, DType::bf16);  // the checkpoint is all bf16
  EXPECT_EQ(m.kinds.size(), 5u);  // bf16, int8, q4, q2, mxfp4 (tests/models/pack_util.cpp)
  EXPECT_EQ(m.tokenizer_files, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"}));
  const std::string text = pack_manifest_to_json(m);
  EXPECT_EQ(pack_manifest_to_json(parse_pack_manifest(text, "again")), text);
  EXPECT_EQ(text, read_bytes(fixture_pack("olmoe") / kPackManifestName));
  for (const auto& [kind, info] : m.kinds) {
    EXPECT_EQ(fs::file_size(pack->expert_file(kind)), kPackHeaderBytes + 16 * info.record_stride);
    EXPECT_EQ(pack->record_offset(kind, 3) % kPackRecordAlign, 0u);
  }
  EXPECT_EQ(pack->describe_record(DType::q4, 13), "layer 1, expert 5, kind q4");
  EXPECT_EQ(pack->moe_layer_of_prefix("model.layers.1.mlp.experts."), 1);
  EXPECT_EQ(pack->moe_layer_of_prefix("model.layers.1.mlp."), -1);
}

TEST(Pack, KindLayouts) {
  for (auto [d, ff] : {std::pair<int64_t, int64_t>{64, 40}, {64, 24}, {4096, 1536}, {7, 3}}) {
    for (DType k : {DType::bf16, DType::q8, DType::q4, DType::q2}) {
      SCOPED_TRACE(testing::Message() << expert_kind_name(k) << " d=" << d << " ff=" << ff);
      PackKindInfo info = pack_kind_layout(k, d, ff);
      const DType t = k;
      const uint64_t gate = k == DType::bf16 ? ff * d * 2 : ff * quant_row_bytes(t, d);
      const uint64_t down = k == DType::bf16 ? d * ff * 2 : d * quant_row_bytes(t, ff);
      EXPECT_EQ(info.gate.bytes, gate);
      EXPECT_EQ(info.down.bytes, down);
      EXPECT_EQ(info.down.scale_bytes, k == DType::bf16 ? 0u : static_cast<uint64_t>(d * quant_scale_row_bytes(t, ff)));
      for (const PackBlock* b : {&info.gate, &info.up, &info.down}) {
        EXPECT_EQ(b->offset % kPackBlockAlign, 0u);
        EXPECT_EQ(b->scale_offset % kPackBlockAlign, 0u);
      }
      EXPECT_GE(info.up.offset, info.gate.offset + info.gate.bytes);
      EXPECT_EQ(info.record_stride % kPackRecordAlign, 0u);
      EXPECT_GE(info.record_stride, info.record_bytes);
      EXPECT_LT(info.record_stride - info.record_bytes, kPackRecordAlign);
    }
  }
  EXPECT_EQ(parse_expert_kinds("q4,bf16"), (std::vector<DType>{DType::q4, DType::bf16}));
  expect_error([] { parse_expert_kinds("q4,q3"); }, Status::invalid_argument, {"q3"});
  expect_error([] { parse_expert_kinds("q4,q4"); }, Status::invalid_argument, {"twice"});
  EXPECT_EQ(default_expert_kind({DType::bf16, DType::q2}), DType::bf16);
  EXPECT_EQ(default_expert_kind({DType::bf16, DType::q4, DType::q8}), DType::q4);
}

// The views of a record hold the checkpoint's expert: the same bytes for bf16 (the
// checkpoint is bf16), the quantization of its rows for the other kinds.
TEST(Pack, ExpertViewsHoldTheCheckpointExperts) {
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack("olmoe"));
  Checkpoint ck = Checkpoint::open(fixture_dir("olmoe"));
  for (const auto& [kind, info] : pack->manifest().kinds) {
    for (int64_t rec : {int64_t{0}, int64_t{13}}) {
      const int64_t layer = rec / 8, e = rec % 8;
      ExpertWeights w = expert_view(info, pack->mapped_record(kind, rec).data());
      const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + ".";
      const std::pair<const Tensor*, std::string> blocks[] = {{&w.gate, "gate_proj"}, {&w.up, "up_proj"}, {&w.down, "down_proj"}};
      for (const auto& [t, proj] : blocks) {
        SCOPED_TRACE(testing::Message() << expert_kind_name(kind) << " record " << rec << " " << proj);
        Tensor src = ck.get(p + proj + ".weight");
        ASSERT_EQ(t->shape_str(), src.shape_str());
        ASSERT_EQ(t->dtype, kind);
        if (kind == DType::bf16) {
          EXPECT_EQ(0, std::memcmp(t->data, src.data, src.nbytes()));
          continue;
        }
        const int64_t cols = src.cols();
        std::vector<float> row(static_cast<size_t>(cols));
        std::vector<uint8_t> q(static_cast<size_t>(quant_row_bytes(t->dtype, cols))), s(static_cast<size_t>(quant_scale_row_bytes(t->dtype, cols)));
        for (int64_t r = 0; r < src.rows(); ++r) {
          for (int64_t c = 0; c < cols; ++c) row[c] = bf16_to_f32(src.ptr<uint16_t>()[r * cols + c]);
          ASSERT_TRUE(quantize_row(t->dtype, row.data(), cols, q.data(), s.data()));
          ASSERT_EQ(0, std::memcmp(q.data(), static_cast<uint8_t*>(t->data) + r * q.size(), q.size())) << "row " << r;
          ASSERT_EQ(0, std::memcmp(s.data(), static_cast<uint8_t*>(t->scales) + r * s.size(), s.size())) << "row " << r;
        }
      }
    }
  }
}

TEST(Pack, VerifyPassesAGoodPack) {
  PackVerifyResult r = verify_pack(fixture_pack("qwen3_moe_yarn"));
  EXPECT_TRUE(r.ok);
  EXPECT_TRUE(r.problems.empty());
  EXPECT_EQ(r.records_checked, 2u * 8 * 5);  // 2 MoE layers (1 and 3) x 8 experts x 5 kinds
}

// One flipped byte anywhere in any record of any kind is found and named as (layer,
// expert, kind); so is one in dense.bin.
TEST(Pack, VerifyCatchesAFlippedByteInEveryRecord) {
  fs::path dir = pack_copy("flip");
  std::shared_ptr<Pack> pack = Pack::open(dir);
  const PackManifest& m = pack->manifest();
  std::mt19937 rng(7);
  for (const auto& [kind, info] : m.kinds) {
    for (int64_t rec = 0; rec < m.n_records(); ++rec) {
      const uint64_t at = pack->record_offset(kind, rec) + rng() % info.record_bytes;
      flip_byte(dir / info.file, at);
      PackVerifyResult r = verify_pack(dir);
      flip_byte(dir / info.file, at);
      ASSERT_FALSE(r.ok) << expert_kind_name(kind) << " record " << rec;
      ASSERT_EQ(r.problems.size(), 1u);
      EXPECT_NE(r.problems[0].find(str("record ", rec, " (", pack->describe_record(kind, rec), ")")), std::string::npos)
          << r.problems[0];
      EXPECT_NE(r.problems[0].find("checksum mismatch"), std::string::npos);
    }
  }
  flip_byte(dir / kPackDenseName, m.dense.back().offset + 3);
  PackVerifyResult r = verify_pack(dir);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.problems[0].find("dense.bin: checksum mismatch"), std::string::npos) << r.problems[0];
  flip_byte(dir / kPackDenseName, m.dense.back().offset + 3);
  // The padding after a record must stay zero.
  const PackKindInfo& q4 = m.kinds.at(DType::q4);
  ASSERT_GT(q4.record_stride, q4.record_bytes);
  flip_byte(dir / q4.file, pack->record_offset(DType::q4, 2) + q4.record_bytes);
  r = verify_pack(dir);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.problems[0].find("padding"), std::string::npos) << r.problems[0];
  EXPECT_TRUE(verify_pack(fixture_pack("olmoe")).ok);
  // A tokenizer file the manifest lists must be there.
  fs::remove(dir / "tokenizer_config.json");
  r = verify_pack(dir);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.problems[0].find("tokenizer_config.json: listed in the manifest but missing"), std::string::npos) << r.problems[0];
}

// ---- corrupt packs: each case damages a copy and expects Pack::open to refuse it ----

struct Corruption {
  std::string name;
  std::function<void(const fs::path&)> damage;
  Status status;
  std::vector<std::string> fragments;
};

void PrintTo(const Corruption& c, std::ostream* os) { *os << c.name; }

std::vector<Corruption> corruptions() {
  auto manifest = [](std::function<void(json&)> fn) { return [fn](const fs::path& d) { edit_manifest(d, fn); }; };
  auto tensor = [](json& j, const std::string& name) -> json& {
    for (json& t : j["dense"]["tensors"])
      if (t["name"] == name) return t;
    throw std::runtime_error("no tensor " + name);
  };
  return {
      {"manifest bad format magic", manifest([](json& j) { j["format"] = "gguf"; }), Status::corrupt, {"manifest.json", "not a sluice pack"}},
      {"manifest newer version", manifest([](json& j) { j["version"] = 5; }), Status::unsupported, {"version 5"}},
      {"version 1 without experts", manifest([](json& j) { j["experts"]["layers"] = json::array(); }), Status::corrupt, {"experts.layers", "version-1"}},
      {"version 1 with n-gram tables", manifest([](json& j) { j["ple"] = json::object(); }), Status::corrupt, {"ple", "version 2"}},
      {"kinds without experts", manifest([](json& j) {
         j["version"] = 2;
         j["experts"]["layers"] = json::array();
       }), Status::corrupt, {"experts.n_expert"}},
      {"manifest truncated", [](const fs::path& d) {
         std::string t = read_bytes(d / kPackManifestName);
         write_bytes(d / kPackManifestName, t.substr(0, t.size() / 2));
       }, Status::corrupt, {"manifest.json", "invalid JSON"}},
      {"manifest empty", [](const fs::path& d) { write_bytes(d / kPackManifestName, ""); }, Status::corrupt, {"manifest.json"}},
      {"manifest not an object", [](const fs::path& d) { write_bytes(d / kPackManifestName, "[1, 2]"); }, Status::corrupt, {"not a JSON object"}},
      {"manifest nested too deep", manifest([](json& j) {
         json deep = json::array();
         for (int i = 0; i < 100; ++i) deep = json::array({deep});
         j["config"]["x"] = deep;
       }), Status::corrupt, {"nested deeper"}},
      {"manifest missing field", manifest([](json& j) { j["kinds"]["q4"].erase("record_stride"); }), Status::corrupt, {"kinds.q4.record_stride", "missing"}},
      {"dense.bin bad magic", [](const fs::path& d) { poke(d / kPackDenseName, 0, "GGUF"); }, Status::corrupt, {"dense.bin", "bad magic"}},
      {"expert file bad version", [](const fs::path& d) { poke(d / "experts.q4.bin", 8, std::string("\x07\0\0\0", 4)); }, Status::unsupported, {"experts.q4.bin", "version 7"}},
      {"expert file of another kind", [](const fs::path& d) { poke(d / "experts.q4.bin", 16, std::string("q2\0", 3)); }, Status::corrupt, {"experts.q4.bin", "holds 'q2'"}},
      {"dense.bin truncated", [](const fs::path& d) { fs::resize_file(d / kPackDenseName, fs::file_size(d / kPackDenseName) - 100); }, Status::corrupt, {"dense.bin", "truncated"}},
      {"expert file truncated", [](const fs::path& d) { fs::resize_file(d / "experts.q2.bin", 5000); }, Status::corrupt, {"experts.q2.bin", "truncated"}},
      {"expert file with trailing bytes", [](const fs::path& d) { fs::resize_file(d / "experts.int8.bin", fs::file_size(d / "experts.int8.bin") + 4096); }, Status::corrupt, {"experts.int8.bin", "trailing"}},
      {"expert file missing", [](const fs::path& d) { fs::remove(d / "experts.bf16.bin"); }, Status::not_found, {"experts.bf16.bin"}},
      {"dense tensor past the end", manifest([&](json& j) { tensor(j, "model.norm.weight")["offset"] = j["dense"]["bytes"].get<uint64_t>() - 64; }), Status::corrupt, {"model.norm.weight", "runs past the end of dense.bin"}},
      {"dense tensors overlap", manifest([&](json& j) { tensor(j, "model.norm.weight")["offset"] = tensor(j, "lm_head.weight")["offset"].get<uint64_t>() + 64; }), Status::corrupt, {"overlaps", "lm_head.weight"}},
      {"dense tensor in the header page", manifest([&](json& j) { tensor(j, "lm_head.weight")["offset"] = 64; }), Status::corrupt, {"lm_head.weight", "after the header page"}},
      {"dense tensor size and shape disagree", manifest([&](json& j) { tensor(j, "model.norm.weight")["shape"] = {65}; }), Status::corrupt, {"model.norm.weight", "bytes", "need 130"}},
      {"record stride smaller than a record", manifest([](json& j) { j["kinds"]["bf16"]["record_stride"] = 4096; }), Status::corrupt, {"kinds.bf16.record_stride", "smaller than a record"}},
      {"record stride unaligned", manifest([](json& j) { j["kinds"]["q4"]["record_stride"] = j["kinds"]["q4"]["record_stride"].get<uint64_t>() + 8; }), Status::corrupt, {"kinds.q4.record_stride", "multiple of 4096"}},
      {"block past the record", manifest([](json& j) { j["kinds"]["q4"]["down"]["scale_offset"] = j["kinds"]["q4"]["record_bytes"]; }), Status::corrupt, {"kinds.q4.down", "past the end"}},
      {"blocks overlap", manifest([](json& j) { j["kinds"]["q2"]["up"]["offset"] = j["kinds"]["q2"]["gate"]["offset"]; }), Status::corrupt, {"kinds.q2", "overlaps"}},
      {"block of the wrong size", manifest([](json& j) { j["kinds"]["int8"]["gate"]["bytes"] = 12; }), Status::corrupt, {"kinds.int8.gate.bytes", "12"}},
      {"block of the wrong shape", manifest([](json& j) { j["kinds"]["int8"]["down"]["rows"] = 40; }), Status::corrupt, {"kinds.int8.down", "[40, 40]"}},
      {"checksum not hex", manifest([](json& j) { j["kinds"]["q4"]["checksums"][3] = "xyz"; }), Status::corrupt, {"kinds.q4.checksums[3]", "hex"}},
      {"checksum count", manifest([](json& j) { j["kinds"]["q4"]["checksums"].erase(0); }), Status::corrupt, {"kinds.q4.checksums", "15 entries for 16 records"}},
      {"terabytes of experts", manifest([](json& j) { j["experts"]["n_expert"] = uint64_t{1} << 40; }), Status::corrupt, {"experts.n_expert", "exceeds the limit"}},
      {"terabyte records", manifest([](json& j) { j["kinds"]["q4"]["record_stride"] = uint64_t{1} << 40; }), Status::corrupt, {"record_stride", "exceeds the limit"}},
      {"terabyte dense tensor", manifest([&](json& j) {
         tensor(j, "lm_head.weight")["shape"] = {4194304, 4194304, 4194304, 4194304};
         tensor(j, "lm_head.weight")["bytes"] = uint64_t{1} << 49;
       }), Status::corrupt, {"lm_head.weight", "overflows"}},
      {"petabyte dense file", manifest([](json& j) { j["dense"]["bytes"] = uint64_t{1} << 49; }), Status::corrupt, {"dense.bin", "562949953421312", "truncated"}},
      {"negative offset", manifest([&](json& j) { tensor(j, "lm_head.weight")["offset"] = -4096; }), Status::corrupt, {"lm_head.weight", "negative"}},
      {"quantized dense tensor in version 1", manifest([&](json& j) { tensor(j, "lm_head.weight")["dtype"] = "q4"; }), Status::corrupt, {"lm_head.weight", "needs pack format version 3"}},
      {"dense tensor off the dense dtype", manifest([&](json& j) { tensor(j, "model.norm.weight")["dtype"] = "f16"; }), Status::corrupt, {"model.norm.weight", "dense dtype is bf16"}},
      {"dense dtype integer", manifest([](json& j) { j["dense"]["dtype"] = "i8"; }), Status::corrupt, {"dense.dtype", "does not fit"}},
      {"kind with a foreign dtype", manifest([](json& j) { j["kinds"]["q4"]["dtype"] = "q2"; }), Status::corrupt, {"kinds.q4.dtype", "does not fit expert kind q4"}},
      {"unknown kind", manifest([](json& j) { j["kinds"]["q3"] = j["kinds"]["q4"]; }), Status::unsupported, {"kinds.q3", "unknown expert kind"}},
      {"kind file outside the pack", manifest([](json& j) { j["kinds"]["q4"]["file"] = "../experts.q4.bin"; }), Status::corrupt, {"kinds.q4.file", "plain"}},
      {"two kinds share a file", manifest([](json& j) { j["kinds"]["q4"]["file"] = j["kinds"]["q2"]["file"]; }), Status::corrupt, {"used twice"}},
      {"tokenizer file outside the pack", manifest([](json& j) { j["tokenizer_files"][0] = "/etc/passwd"; }), Status::corrupt, {"tokenizer_files[0]"}},
      {"layers out of order", manifest([](json& j) { j["experts"]["layers"][1]["layer"] = 0; }), Status::corrupt, {"experts.layers[1].layer", "ascend"}},
      {"no kinds", manifest([](json& j) { j["kinds"] = json::object(); }), Status::corrupt, {"kinds", "is empty"}},
  };
}

// One test per case (ctest lists each): Pack::open, verify and load_model all refuse the
// damaged pack with the expected status and a message naming what is wrong.
class PackCorrupt : public ::testing::TestWithParam<Corruption> {};

TEST_P(PackCorrupt, GivesAClearError) {
  const Corruption& c = GetParam();
  fs::path d = pack_copy("corrupt");
  c.damage(d);
  std::string msg = expect_error([&] { Pack::open(d); }, c.status, c.fragments);
  if (!msg.empty()) {
    expect_error([&] { verify_pack(d); }, c.status, c.fragments);
    auto backend = make_cpu_backend();
    expect_error([&] { load_model(d, *backend); }, c.status, c.fragments);
  }
  fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Cases, PackCorrupt, ::testing::ValuesIn(corruptions()), [](const auto& info) {
  std::string name;
  for (char ch : info.param.name) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
});

// A version-3 pack (olmoe with --dense q4) with its quantized dense entries damaged: each is
// one line naming the tensor and the field.
TEST(PackCorruptDenseQuant, GivesAClearError) {
  const fs::path good = pack_test_dir("dense-q4");
  ConvertOptions o;
  o.kinds = {DType::q4};
  o.dense_dtype = DType::q4;
  convert_checkpoint(fixture_dir("olmoe"), good, o);
  ASSERT_EQ(Pack::open(good)->manifest().version, 3);
  auto tensor = [](json& j, const std::string& name) -> json& {
    for (json& t : j["dense"]["tensors"])
      if (t["name"] == name) return t;
    throw std::runtime_error("no tensor " + name);
  };
  const std::string lm = "lm_head.weight", q = "model.layers.0.self_attn.q_proj.weight";
  const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
      {[&](json& j) { tensor(j, lm)["dtype"] = "q3"; }, {lm, "unknown dtype 'q3'"}},
      {[&](json& j) { tensor(j, lm)["dtype"] = "q2"; }, {lm, "q2 does not fit a dense tensor"}},
      {[&](json& j) { tensor(j, lm)["dtype"] = "q8"; }, {lm, "bytes", "shape and dtype need"}},
      {[&](json& j) { tensor(j, lm).erase("scale_offset"); }, {lm, "scale_offset", "missing"}},
      {[&](json& j) { tensor(j, lm)["scale_bytes"] = 8; }, {lm, "scale_bytes", "8 but shape and dtype need"}},
      {[&](json& j) { tensor(j, lm)["scale_offset"] = tensor(j, q)["offset"]; }, {"overlaps", q}},
      {[&](json& j) { tensor(j, lm)["scale_offset"] = (j["dense"]["bytes"].get<uint64_t>() + 63) / 64 * 64; }, {lm, "scales", "run past the end"}},
      {[&](json& j) { tensor(j, q)["shape"] = {64, 8, 8}; }, {q, "is not a matrix"}},
      {[&](json& j) { j["version"] = 2; }, {"needs pack format version 3"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const fs::path d = pack_test_dir("dense-q4-bad");
    fs::copy(good, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    edit_manifest(d, cases[i].first);
    const std::string msg = expect_error([&] { Pack::open(d); }, Status::corrupt, cases[i].second);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    fs::remove_all(d);
  }
  // A norm stored quantized is refused by the parser: it is not a matrix.
  const fs::path d = pack_test_dir("dense-q4-role");
  fs::copy(good, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  edit_manifest(d, [&](json& j) { tensor(j, "model.norm.weight")["dtype"] = "q4"; });
  expect_error([&] { Pack::open(d); }, Status::corrupt, {"model.norm.weight", "is not a matrix"});
}

// Damage that the manifest parser cannot see but loading does: a dense tensor whose dtype
// does not fit its role (a norm weight stored as i8), and a config that disagrees with the
// experts.
TEST(PackLoad, RefusesTensorsThatDoNotFitTheirRole) {
  fs::path d = pack_copy("role");
  edit_manifest(d, [](json& j) {
    for (json& t : j["dense"]["tensors"])
      if (t["name"] == "model.norm.weight") {
        t["dtype"] = "i8";
        t["bytes"] = 64;
      }
  });
  auto backend = make_cpu_backend();
  expect_error([&] { load_model(d, *backend); }, Status::unsupported, {"model.norm.weight", "dtype i8"});
  fs::path d2 = pack_copy("config");
  edit_manifest(d2, [](json& j) { j["experts"]["n_ff"] = 48; });  // the blocks no longer fit n_ff
  expect_error([&] { Pack::open(d2); }, Status::corrupt, {"kinds."});
  fs::path d3 = pack_copy("family");
  edit_manifest(d3, [](json& j) { j["config"]["intermediate_size"] = 48; });
  expect_error([&] { load_model(d3, *backend); }, Status::corrupt, {"olmoe", "manifest.json says 8 of [48, 64]"});
  EXPECT_NO_THROW(load_model(fixture_pack("olmoe"), *backend, LoadOptions{DType::q8}));
  // A kind the pack does not hold.
  fs::path d4 = pack_copy("kinds");
  edit_manifest(d4, [](json& j) { j["kinds"].erase("q2"); });
  expect_error([&] { load_model(d4, *backend, LoadOptions{DType::q2}); }, Status::invalid_argument,
               {"no q2 experts", "bf16, int8, q4"});
}

}  // namespace
