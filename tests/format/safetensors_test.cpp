// safetensors parsing as hostile-input code: a table of handcrafted corrupt files, each
// checked for its status and for a message that names the file and the tensor; then the
// good paths (writer round trips, scalars, misaligned data) and the Checkpoint directory
// layouts (single file, sharded index, escaping shard names, consumption tracking).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "format/checkpoint.h"
#include "format/safetensors.h"
#include "tests/format/format_test_util.h"

using namespace sluice;
using sluice::test::as_span;
using sluice::test::expect_error;
using sluice::test::read_bytes;
using sluice::test::ScratchDir;
using sluice::test::write_bytes;

namespace {

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file with the given header text (length taken from it) and `n_data` zero data bytes.
std::string st_file(const std::string& header, size_t n_data) {
  return u64_le(header.size()) + header + std::string(n_data, '\0');
}

// One tensor entry as header JSON.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

struct CorruptCase {
  const char* label;
  std::string bytes;
  Status status;
  std::string tensor;    // the tensor the message must name ("" when none is involved)
  std::string fragment;  // what the message must say
};

std::vector<CorruptCase> corrupt_cases() {
  const std::string ok_w = entry("w", "F32", "[2]", "[0,8]");
  return {
      {"empty_file", "", Status::corrupt, "", "too short"},
      {"shorter_than_8", "abc", Status::corrupt, "", "too short"},
      {"header_len_past_end", u64_le(100) + "{}", Status::corrupt, "", "past the end"},
      {"header_len_2_63", u64_le(uint64_t{1} << 63) + "{}", Status::corrupt, "", "exceeds the limit"},
      {"header_len_max", u64_le(~uint64_t{0}) + "{}", Status::corrupt, "", "exceeds the limit"},
      {"header_not_json", st_file("{not json", 0), Status::corrupt, "", "not valid JSON"},
      {"header_truncated_json", st_file("{\"w\":{\"dtype\":", 0), Status::corrupt, "", "not valid JSON"},
      {"header_trailing_garbage", st_file("{} x", 0), Status::corrupt, "", "not valid JSON"},
      {"header_invalid_utf8", st_file("{\"\xff\xfe\":1}", 0), Status::corrupt, "", "not valid JSON"},
      {"header_number_overflow", st_file("{\"w\":{\"shape\":[1e999]}}", 0), Status::corrupt, "", "number overflow"},
      {"header_array", st_file("[1,2]", 0), Status::corrupt, "", "not an object"},
      {"header_number", st_file("7", 0), Status::corrupt, "", "not an object"},
      {"entry_not_object", st_file("{\"w\":[1]}", 0), Status::corrupt, "w", "not a JSON object"},
      {"missing_dtype", st_file("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8), Status::corrupt, "w", "missing \"dtype\""},
      {"missing_shape", st_file("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8), Status::corrupt, "w", "missing \"shape\""},
      {"missing_offsets", st_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8), Status::corrupt, "w", "missing \"data_offsets\""},
      {"dtype_not_string", st_file("{\"w\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8), Status::corrupt, "w", "not a string"},
      {"offsets_reversed", st_file("{" + entry("w", "F32", "[2]", "[8,0]") + "}", 8), Status::corrupt, "w", "reversed"},
      {"offsets_past_end", st_file("{" + entry("w", "F32", "[2]", "[0,8]") + "}", 4), Status::corrupt, "w", "past the end"},
      {"offsets_one_element", st_file("{" + entry("w", "F32", "[2]", "[8]") + "}", 8), Status::corrupt, "w", "[begin, end]"},
      {"offsets_three_elements", st_file("{" + entry("w", "F32", "[2]", "[0,8,8]") + "}", 8), Status::corrupt, "w", "[begin, end]"},
      {"offsets_negative", st_file("{" + entry("w", "F32", "[2]", "[-8,0]") + "}", 8), Status::corrupt, "w", "negative"},
      {"offsets_float", st_file("{" + entry("w", "F32", "[2]", "[0,8.0]") + "}", 8), Status::corrupt, "w", "not a non-negative integer"},
      {"offsets_huge", st_file("{" + entry("w", "F32", "[2]", "[18446744073709551615,18446744073709551615]") + "}", 8),
       Status::corrupt, "w", "past the end"},
      {"overlapping", st_file("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}", 12),
       Status::corrupt, "b", "overlaps tensor \"a\""},
      {"overlap_contained", st_file("{" + entry("a", "F32", "[4]", "[0,16]") + "," + entry("b", "F32", "[1]", "[4,8]") + "," +
                                        entry("c", "F32", "[1]", "[8,12]") + "}", 16),
       Status::corrupt, "a", "overlaps"},
      {"duplicate_names", st_file("{" + ok_w + "," + entry("w", "F32", "[2]", "[8,16]") + "}", 16), Status::corrupt, "w",
       "duplicate tensor name"},
      {"duplicate_key_in_entry", st_file("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
       Status::corrupt, "w", "duplicate key \"dtype\""},
      {"size_mismatch", st_file("{" + entry("w", "F32", "[3]", "[0,8]") + "}", 8), Status::corrupt, "w", "needs 12"},
      {"size_mismatch_bf16", st_file("{" + entry("w", "BF16", "[2,2]", "[0,16]") + "}", 16), Status::corrupt, "w", "needs 8"},
      {"shape_product_overflow", st_file("{" + entry("w", "F32", "[4294967296,4294967296,16]", "[0,4]") + "}", 4),
       Status::corrupt, "w", "overflows"},
      {"shape_times_size_overflow", st_file("{" + entry("w", "F32", "[4611686018427387904]", "[0,4]") + "}", 4),
       Status::corrupt, "w", "overflows"},
      {"shape_dim_beyond_u64", st_file("{" + entry("w", "F32", "[18446744073709551616]", "[0,4]") + "}", 4),
       Status::corrupt, "w", "not a non-negative integer"},
      {"shape_dim_beyond_i64", st_file("{" + entry("w", "U8", "[9223372036854775808]", "[0,4]") + "}", 4),
       Status::corrupt, "w", "too large"},
      {"shape_negative_dim", st_file("{" + entry("w", "F32", "[-1]", "[0,4]") + "}", 4), Status::corrupt, "w", "negative"},
      {"shape_float_dim", st_file("{" + entry("w", "F32", "[1.5]", "[0,4]") + "}", 4), Status::corrupt, "w", "not a non-negative integer"},
      {"shape_not_array", st_file("{" + entry("w", "F32", "2", "[0,8]") + "}", 8), Status::corrupt, "w", "not an array"},
      {"shape_9_dims", st_file("{" + entry("w", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") + "}", 1), Status::corrupt, "w", "at most 8"},
      {"nested_too_deep", st_file("{\"w\":{\"shape\":[[1]]}}", 0), Status::corrupt, "w", "nested"},
      {"dtype_f64", st_file("{" + entry("w", "F64", "[1]", "[0,8]") + "}", 8), Status::unsupported, "w", "unsupported dtype F64"},
      {"dtype_bool", st_file("{" + entry("w", "BOOL", "[1]", "[0,1]") + "}", 1), Status::unsupported, "w", "unsupported dtype BOOL"},
      // F8_E4M3 / F8_E5M2 are read (FP8 weights, fp8_test.cpp); E8M0 is not.
      {"dtype_f8_e8m0", st_file("{" + entry("w", "F8_E8M0", "[1]", "[0,1]") + "}", 1), Status::unsupported, "w", "unsupported dtype F8_E8M0"},
      {"dtype_unknown", st_file("{" + entry("w", "Q7", "[1]", "[0,1]") + "}", 1), Status::corrupt, "w", "unknown dtype \"Q7\""},
      {"dtype_lowercase", st_file("{" + entry("w", "f32", "[1]", "[0,4]") + "}", 4), Status::corrupt, "w", "unknown dtype"},
      {"metadata_not_object", st_file("{\"__metadata__\":[\"x\"]}", 0), Status::corrupt, "", "\"__metadata__\" is not"},
      {"metadata_value_number", st_file("{\"__metadata__\":{\"format\":1}}", 0), Status::corrupt, "", "not a string"},
  };
}

class SafetensorsCorrupt : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(SafetensorsCorrupt, RejectedWithNamedFileAndTensor) {
  const CorruptCase& c = GetParam();
  ScratchDir dir;
  const std::string file_name = std::string("case_") + c.label + ".safetensors";
  std::vector<std::string> fragments = {file_name, c.fragment};
  if (!c.tensor.empty()) fragments.push_back("\"" + c.tensor + "\"");

  // The pure parser over the bytes...
  expect_error([&] { parse_safetensors_header(as_span(c.bytes), file_name); }, c.status, fragments);
  // ...and the same file on disk through the mmap reader.
  write_bytes(dir / file_name, c.bytes);
  expect_error([&] { SafetensorsFile::open(dir / file_name); }, c.status, fragments);
}

INSTANTIATE_TEST_SUITE_P(Table, SafetensorsCorrupt, ::testing::ValuesIn(corrupt_cases()),
                         [](const ::testing::TestParamInfo<CorruptCase>& info) { return std::string(info.param.label); });

TEST(Safetensors, LongTensorNameIsShortenedInMessages) {
  const std::string name(100000, 'x');
  std::string bytes = st_file("{" + entry(name, "F32", "[3]", "[0,8]") + "}", 8);
  std::string message = expect_error([&] { parse_safetensors_header(as_span(bytes), "f.safetensors"); }, Status::corrupt,
                                     {"f.safetensors", "needs 12", "..."});
  EXPECT_LT(message.size(), 1000u);
}

TEST(Safetensors, LongArrayRejectedWhileParsing) {
  // 1M-element array in an entry: rejected at the 9th element, not after building it.
  std::string shape = "[";
  for (int i = 0; i < 1000000; ++i) shape += i ? ",1" : "1";
  shape += "]";
  std::string bytes = st_file("{" + entry("w", "U8", shape, "[0,1]") + "}", 1);
  expect_error([&] { parse_safetensors_header(as_span(bytes), "f.safetensors"); }, Status::corrupt,
               {"f.safetensors", "\"w\"", "longer than 8"});
}

TEST(Safetensors, HeaderEdgeCasesAccepted) {
  // Empty header object, empty tensor, scalar, gaps between tensors, unknown extra fields,
  // trailing padding spaces, 8 dims.
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}," + entry("empty", "F32", "[0,3]", "[4,4]") + "," +
                       entry("scalar", "F32", "[]", "[0,4]") + "," + entry("gap", "U8", "[2]", "[8,10]") + "," +
                       "\"extra\":{\"dtype\":\"I8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[10,11],\"note\":\"x\"}}    ";
  std::string bytes = st_file(header, 11);
  std::map<std::string, std::string> metadata;
  auto entries = parse_safetensors_header(as_span(bytes), "f", &metadata);
  ASSERT_EQ(entries.size(), 4u);
  // File order: by begin.
  EXPECT_EQ(entries[0].name, "scalar");
  EXPECT_EQ(entries[1].name, "empty");
  EXPECT_EQ(entries[2].name, "gap");
  EXPECT_EQ(entries[3].name, "extra");
  EXPECT_TRUE(entries[0].shape.empty());
  EXPECT_EQ(entries[1].shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(entries[3].shape.size(), 8u);
  EXPECT_EQ(metadata.at("format"), "pt");
  EXPECT_TRUE(parse_safetensors_header(as_span(st_file("{}", 0)), "f").empty());
}

TEST(Safetensors, OpenErrors) {
  ScratchDir dir;
  expect_error([&] { SafetensorsFile::open(dir / "missing.safetensors"); }, Status::not_found, {"missing.safetensors"});
  expect_error([&] { SafetensorsFile::open(dir.path()); }, Status::invalid_argument, {"not a regular file"});
  if (::geteuid() != 0) {  // root reads through any permission bits
    write_bytes(dir / "locked.safetensors", st_file("{}", 0));
    ::chmod((dir / "locked.safetensors").c_str(), 0);
    expect_error([&] { SafetensorsFile::open(dir / "locked.safetensors"); }, Status::io,
                 {"locked.safetensors", "Permission denied"});
  }
}

// Values exactly representable in every dtype under test.
const std::vector<float> exact_values = {0.0f, 1.0f, -2.5f, 3.140625f, 0.015625f, -1024.0f};

TEST(Safetensors, WriteReadRoundTripExact) {
  ScratchDir dir;
  std::vector<float> f32 = exact_values;
  std::vector<uint16_t> bf16, f16;
  for (float v : exact_values) {
    bf16.push_back(f32_to_bf16(v));
    f16.push_back(f32_to_f16(v));
  }
  std::vector<int32_t> i32 = {7, -1, 2147483647};
  std::vector<uint8_t> u8 = {1, 2, 3};  // odd size: tests that later tensors stay aligned
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"u8", Tensor(DType::u8, {3}, u8.data())},
      {"model.bf16", Tensor(DType::bf16, {2, 3}, bf16.data())},
      {"model.f32", Tensor(DType::f32, {3, 2}, f32.data())},
      {"model.f16", Tensor(DType::f16, {1, 2, 3}, f16.data())},
      {"i32", Tensor(DType::i32, {3}, i32.data())},
      {"empty", Tensor(DType::f32, {0, 4}, nullptr)},
  };
  const auto path = dir / "model.safetensors";
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "round trip"}});

  std::string raw = read_bytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "header padded to a multiple of 8";
  std::string header = raw.substr(8, header_len);
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header_len - 1 - last, 8u) << "at most 7 padding spaces";

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->entries().size(), 6u);
  EXPECT_EQ(f->metadata().at("note"), "round trip");
  EXPECT_EQ(f->data_offset(), 8 + header_len);

  Tensor t = f->tensor("model.f32");
  EXPECT_EQ(t.dtype, DType::f32);
  EXPECT_EQ(t.shape_str(), "[3, 2]");
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(t.ptr<float>()[i], f32[i]);

  t = f->tensor("model.bf16");
  EXPECT_EQ(t.dtype, DType::bf16);
  EXPECT_EQ(t.shape_str(), "[2, 3]");
  for (size_t i = 0; i < exact_values.size(); ++i) EXPECT_EQ(bf16_to_f32(t.ptr<uint16_t>()[i]), exact_values[i]);

  t = f->tensor("model.f16");
  EXPECT_EQ(t.dtype, DType::f16);
  EXPECT_EQ(t.shape_str(), "[1, 2, 3]");
  for (size_t i = 0; i < exact_values.size(); ++i) EXPECT_EQ(f16_to_f32(t.ptr<uint16_t>()[i]), exact_values[i]);

  t = f->tensor("i32");
  EXPECT_EQ(t.ptr<int32_t>()[2], 2147483647);
  t = f->tensor("u8");
  EXPECT_EQ(t.ptr<uint8_t>()[2], 3);
  t = f->tensor("empty");
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.shape_str(), "[0, 4]");

  // Every tensor lies in the mapping, aligned to its element size.
  for (const SafetensorsEntry& e : f->entries()) {
    Tensor v = f->tensor(e.name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype), 0u) << e.name;
  }
  expect_error([&] { f->tensor("nope"); }, Status::not_found, {"model.safetensors", "\"nope\""});
}

TEST(Safetensors, TensorKeepsMappingAlive) {
  ScratchDir dir;
  std::vector<float> v = {1.5f, -2.0f};
  write_safetensors(dir / "a.safetensors", {{"w", Tensor(DType::f32, {2}, v.data())}});
  Tensor t;
  {
    auto f = SafetensorsFile::open(dir / "a.safetensors");
    t = f->tensor("w");
  }
  std::filesystem::remove(dir / "a.safetensors");
  EXPECT_EQ(t.ptr<float>()[1], -2.0f);
}

TEST(Safetensors, ScalarMisalignedAndFiveDims) {
  ScratchDir dir;
  // Unpadded 57-byte header: the data section starts at byte 65, so the f32 is misaligned in
  // the mapping and tensor() must copy it.
  std::string header = "{" + entry("s", "F32", "[]", "[0,4]") + "," + entry("d5", "U8", "[1,1,1,1,1]", "[4,5]") + "}";
  ASSERT_NE((8 + header.size()) % 4, 0u);
  float value = 6.25f;
  std::string bytes = u64_le(header.size()) + header + std::string(reinterpret_cast<const char*>(&value), 4) + "\x09";
  write_bytes(dir / "odd.safetensors", bytes);
  auto f = SafetensorsFile::open(dir / "odd.safetensors");
  Tensor s = f->tensor("s");
  EXPECT_EQ(s.shape_str(), "[1]");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data) % 4, 0u);
  EXPECT_EQ(s.ptr<float>()[0], 6.25f);
  EXPECT_EQ(f->bytes(*f->find("d5"))[0], 9);
  expect_error([&] { f->tensor("d5"); }, Status::unsupported, {"odd.safetensors", "\"d5\"", "5 dimensions"});
}

TEST(Safetensors, WriterRejectsBadInput) {
  ScratchDir dir;
  float x = 0;
  expect_error([&] { write_safetensors(dir / "a", {{"w", Tensor(DType::f32, {1}, &x)}, {"w", Tensor(DType::f32, {1}, &x)}}); },
               Status::invalid_argument, {"duplicate"});
  expect_error([&] { write_safetensors(dir / "a", {{"w", Tensor()}}); }, Status::invalid_argument, {"0 dimensions"});
  expect_error([&] { write_safetensors(dir / "a", {{"w", Tensor(DType::f32, {2}, nullptr)}}); }, Status::invalid_argument,
               {"no data"});
  expect_error([&] { write_safetensors(dir / "a", {{"__metadata__", Tensor(DType::f32, {1}, &x)}}); },
               Status::invalid_argument, {"__metadata__"});
  expect_error([&] { write_safetensors(dir / "no_such_dir" / "a", {}); }, Status::io, {"no_such_dir"});
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));
}

TEST(Safetensors, FuzzSeedCorpusParses) {
  // Written by an independent (Python) writer; also keeps the fuzz seeds valid.
  const std::filesystem::path dir = std::filesystem::path(SLUICE_SOURCE_DIR) / "tests/fuzz/corpus_safetensors";
  int n_file = 0;
  for (const auto& de : std::filesystem::directory_iterator(dir)) {
    auto f = SafetensorsFile::open(de.path());
    for (const SafetensorsEntry& e : f->entries()) {
      if (e.shape.size() <= 4) f->tensor(e.name);
    }
    ++n_file;
  }
  EXPECT_GE(n_file, 3);
  auto f = SafetensorsFile::open(dir / "mixed_dtypes.safetensors");
  EXPECT_EQ(f->tensor("a.i64").ptr<int64_t>()[0], -7);
  EXPECT_EQ(bf16_to_f32(f->tensor("b.bf16").ptr<uint16_t>()[1]), -2.0f);
  EXPECT_EQ(f16_to_f32(f->tensor("c.f16").ptr<uint16_t>()[1]), -1.0f);
  EXPECT_EQ(f->tensor("e.empty").shape_str(), "[0, 5]");
}

// ---- Checkpoint ----

// Writes one f32 tensor per name, value i at element i, into `path`.
void write_shard(const std::filesystem::path& path, const std::vector<std::string>& names) {
  std::vector<std::vector<float>> storage;
  std::vector<std::pair<std::string, Tensor>> tensors;
  storage.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    storage.push_back({static_cast<float>(i), static_cast<float>(i) + 0.5f});
    tensors.emplace_back(names[i], Tensor(DType::f32, {2}, storage.back().data()));
  }
  write_safetensors(path, tensors);
}

void write_index(const std::filesystem::path& dir, const std::string& weight_map_json) {
  write_bytes(dir / "model.safetensors.index.json", "{\"metadata\":{\"total_size\":0},\"weight_map\":" + weight_map_json + "}");
}

TEST(Checkpoint, SingleFileAndConsumption) {
  ScratchDir dir;
  write_shard(dir / "model.safetensors", {"b.weight", "a.weight", "c.bias"});
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"a.weight", "b.weight", "c.bias"}));
  EXPECT_TRUE(c.has("a.weight"));
  EXPECT_FALSE(c.has("d"));
  EXPECT_EQ(c.unconsumed().size(), 3u);
  Tensor t = c.get("b.weight");
  EXPECT_EQ(t.ptr<float>()[1], 0.5f);
  c.consume("c.bias");
  EXPECT_EQ(c.unconsumed(), (std::vector<std::string>{"a.weight"}));
  EXPECT_FALSE(c.has("missing"));
  expect_error([&] { c.get("missing.weight"); }, Status::not_found, {"\"missing.weight\"", dir.path().string()});
  expect_error([&] { c.consume("missing.weight"); }, Status::not_found, {"\"missing.weight\""});
  c.get("a.weight");
  EXPECT_TRUE(c.unconsumed().empty());
  EXPECT_EQ(c.entry("c.bias").end - c.entry("c.bias").begin, 8u);
  EXPECT_EQ(c.file_of("c.bias").path(), dir / "model.safetensors");
}

TEST(Checkpoint, ShardedThroughIndex) {
  ScratchDir dir;
  write_shard(dir / "model-00001-of-00002.safetensors", {"layers.0.w", "embed"});
  write_shard(dir / "model-00002-of-00002.safetensors", {"layers.1.w", "head", "unlisted"});
  write_index(dir.path(), R"({"layers.0.w": "model-00001-of-00002.safetensors", "embed": "model-00001-of-00002.safetensors",
                             "layers.1.w": "model-00002-of-00002.safetensors", "head": "model-00002-of-00002.safetensors"})");
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"embed", "head", "layers.0.w", "layers.1.w", "unlisted"}));
  EXPECT_EQ(c.get("head").ptr<float>()[0], 1.0f);      // second in its shard
  EXPECT_EQ(c.get("embed").ptr<float>()[1], 1.5f);
  EXPECT_EQ(c.file_of("layers.1.w").path().filename(), "model-00002-of-00002.safetensors");
  c.consume("layers.0.w");
  c.consume("layers.1.w");
  // A tensor the index forgot is still reported, so the loader notices it.
  EXPECT_EQ(c.unconsumed(), (std::vector<std::string>{"unlisted"}));
}

TEST(Checkpoint, IndexPreferredOverStraySingleFile) {
  ScratchDir dir;
  write_shard(dir / "s1.safetensors", {"a"});
  write_shard(dir / "model.safetensors", {"stale"});
  write_index(dir.path(), R"({"a": "s1.safetensors"})");
  EXPECT_EQ(Checkpoint::open(dir.path()).names(), (std::vector<std::string>{"a"}));
}

TEST(Checkpoint, ShardNamesMayNotEscapeTheDirectory) {
  ScratchDir dir;
  std::filesystem::create_directories(dir / "model");
  std::filesystem::create_directories(dir / "model" / "sub");
  write_shard(dir / "outside.safetensors", {"a"});
  write_shard(dir / "model" / "sub" / "inner.safetensors", {"a"});
  for (const char* shard : {"../outside.safetensors", "sub/inner.safetensors", "/etc/passwd", "..", "", "a\\\\b"}) {
    SCOPED_TRACE(shard);
    write_index(dir / "model", std::string(R"({"a": ")") + shard + "\"}");
    expect_error([&] { Checkpoint::open(dir / "model"); }, Status::corrupt,
                 {"model.safetensors.index.json", "\"a\"", "not a plain file name"});
  }
}

TEST(Checkpoint, IndexErrors) {
  ScratchDir dir;
  write_shard(dir / "s1.safetensors", {"a"});
  write_index(dir.path(), R"({"a": "s1.safetensors", "b": "s2.safetensors"})");
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::not_found, {"s2.safetensors", "model.safetensors.index.json"});

  write_index(dir.path(), R"({"a": "s1.safetensors", "b": "s1.safetensors"})");
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::corrupt, {"\"b\"", "s1.safetensors", "no such tensor"});

  write_index(dir.path(), R"({"a": 3})");
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::corrupt, {"\"a\"", "not a file name"});

  write_bytes(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::corrupt, {"weight_map"});

  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors",})");
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::corrupt, {"model.safetensors.index.json", "invalid JSON: line 1, column 39"});

  // The same unlisted tensor in two shards: ambiguous.
  write_index(dir.path(), R"({"a": "s1.safetensors", "b": "s2.safetensors", "c": "s3.safetensors"})");
  write_shard(dir / "s2.safetensors", {"b", "x"});
  write_shard(dir / "s3.safetensors", {"c", "x"});
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::corrupt, {"\"x\"", "s2.safetensors", "s3.safetensors"});

  // A corrupt shard is reported as itself.
  write_index(dir.path(), R"({"a": "s1.safetensors"})");
  write_bytes(dir / "s1.safetensors", "junk");
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::corrupt, {"s1.safetensors", "too short"});
}

TEST(Checkpoint, DirectoryLayouts) {
  ScratchDir dir;
  expect_error([&] { Checkpoint::open(dir / "absent"); }, Status::not_found, {"absent"});
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::not_found, {"no model.safetensors"});

  write_shard(dir / "weights.safetensors", {"w"});
  EXPECT_EQ(Checkpoint::open(dir.path()).names(), (std::vector<std::string>{"w"}));

  write_shard(dir / "other.safetensors", {"v"});
  expect_error([&] { Checkpoint::open(dir.path()); }, Status::not_found, {"other.safetensors, weights.safetensors"});

  write_shard(dir / "model.safetensors", {"m"});
  EXPECT_EQ(Checkpoint::open(dir.path()).names(), (std::vector<std::string>{"m"}));
}

}  // namespace
