// .npy: writer/reader round trips (the header bytes match what numpy.save writes), the
// f2/f8 conversions, and handcrafted corrupt files. Also read_json_file's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "format/json_file.h"
#include "format/npy.h"
#include "tests/format/format_test_util.h"

using namespace sluice;
using sluice::test::as_span;
using sluice::test::expect_error;
using sluice::test::read_bytes;
using sluice::test::ScratchDir;
using sluice::test::write_bytes;

namespace {

// A v1.0 file with the given header dict (padded as numpy pads it) and raw data bytes.
std::string npy_file(const std::string& dict, const std::string& data, char major = 1) {
  std::string header = dict;
  size_t prefix = major == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string s = std::string("\x93NUMPY", 6) + major + '\0';
  s += static_cast<char>(header.size() & 0xff);
  s += static_cast<char>(header.size() >> 8);
  if (major != 1) s += std::string(2, '\0');
  return s + header + data;
}

std::string f32_bytes(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size()); }

TEST(Npy, RoundTripAndNumpyHeader) {
  ScratchDir dir;
  std::vector<float> v(2 * 3 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f - 3.0f;
  v[7] = std::numeric_limits<float>::infinity();
  v[8] = -0.0f;
  const int64_t shape[] = {2, 3, 5};
  write_npy(dir / "a.npy", v.data(), shape);

  // Byte for byte what numpy 1.x/2.x np.save writes for this array.
  std::string raw = read_bytes(dir / "a.npy");
  std::string expected_header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 5), }";
  ASSERT_EQ(raw.size(), 128u + 4 * v.size());
  EXPECT_EQ(raw.substr(0, 10), std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  EXPECT_EQ(raw.substr(10, expected_header.size()), expected_header);
  EXPECT_EQ(raw[127], '\n');

  NpyArray a = read_npy(dir / "a.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3, 5}));
  ASSERT_EQ(a.data.size(), v.size());
  EXPECT_EQ(std::memcmp(a.data.data(), v.data(), 4 * v.size()), 0);
}

TEST(Npy, OneDimScalarAndEmpty) {
  ScratchDir dir;
  float x[3] = {1.0f, 2.0f, 3.0f};
  const int64_t one[] = {3};
  write_npy(dir / "v.npy", x, one);
  EXPECT_NE(read_bytes(dir / "v.npy").find("'shape': (3,), }"), std::string::npos);
  EXPECT_EQ(read_npy(dir / "v.npy").data, (std::vector<float>{1.0f, 2.0f, 3.0f}));

  write_npy(dir / "s.npy", x + 1, std::span<const int64_t>());
  NpyArray s = read_npy(dir / "s.npy");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.data, (std::vector<float>{2.0f}));

  const int64_t empty[] = {0, 7};
  write_npy(dir / "e.npy", nullptr, empty);
  NpyArray e = read_npy(dir / "e.npy");
  EXPECT_EQ(e.shape, (std::vector<int64_t>{0, 7}));
  EXPECT_TRUE(e.data.empty());

  const int64_t negative[] = {-1};
  expect_error([&] { write_npy(dir / "n.npy", x, negative); }, Status::invalid_argument, {"n.npy", "negative"});
}

TEST(Npy, HalfAndDoubleConvertedToFloat) {
  std::string f2;
  for (float v : {1.0f, -0.5f, 65504.0f}) {
    uint16_t h = f32_to_f16(v);
    f2 += std::string(reinterpret_cast<const char*>(&h), 2);
  }
  NpyArray a = parse_npy(as_span(npy_file("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", f2)), "h.npy");
  EXPECT_EQ(a.data, (std::vector<float>{1.0f, -0.5f, 65504.0f}));

  std::string f8;
  for (double v : {0.1, -1e300, 3.0}) f8 += std::string(reinterpret_cast<const char*>(&v), 8);
  // Python 2 era header: double quotes, long suffix, no trailing comma.
  NpyArray d = parse_npy(as_span(npy_file("{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (3L,)}", f8)), "d.npy");
  EXPECT_EQ(d.data[0], 0.1f);
  EXPECT_EQ(d.data[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(d.data[2], 3.0f);

  // Format 2.0 (4-byte header length).
  NpyArray v2 = parse_npy(as_span(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                                                          f32_bytes({4.5f}), 2)), "v2.npy");
  EXPECT_EQ(v2.data, (std::vector<float>{4.5f}));
}

struct NpyCase {
  const char* label;
  std::string bytes;
  Status status;
  std::string fragment;
};

std::vector<NpyCase> npy_cases() {
  const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::string two = f32_bytes({1.0f, 2.0f});
  std::string good = npy_file(good_dict, two);
  std::string bad_magic = good;
  bad_magic[1] = 'n';
  std::string header_past_end = good.substr(0, 8) + "\xff\xff" + good.substr(10);
  std::string sixty_five_ones;
  for (int i = 0; i < 65; ++i) sixty_five_ones += "1, ";
  return {
      {"empty", "", Status::corrupt, "bad magic"},
      {"bad_magic", bad_magic, Status::corrupt, "bad magic"},
      {"magic_only", std::string("\x93NUMPY", 6), Status::corrupt, "bad magic"},
      {"version_9", npy_file(good_dict, two, 9), Status::unsupported, "version 9.0"},
      {"header_past_end", header_past_end, Status::corrupt, "past the end"},
      {"fortran_order", npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", two), Status::unsupported, "Fortran"},
      {"big_endian", npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", two), Status::unsupported, "big-endian"},
      {"int_dtype", npy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", two), Status::unsupported, "'<i4'"},
      {"truncated_data", npy_file(good_dict, two.substr(0, 5)), Status::corrupt, "truncated"},
      {"trailing_data", npy_file(good_dict, two + "xx"), Status::corrupt, "2 bytes after the data"},
      {"absurd_shape", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 1000000000), }", two),
       Status::corrupt, "needs 4000000000000000000 bytes"},
      {"overflowing_shape", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }", two),
       Status::corrupt, "overflows"},
      {"dim_beyond_i64", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", two),
       Status::corrupt, "does not fit"},
      {"negative_dim", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", two), Status::corrupt,
       "non-negative"},
      {"missing_shape", npy_file("{'descr': '<f4', 'fortran_order': False, }", two), Status::corrupt, "missing 'shape'"},
      {"missing_descr", npy_file("{'fortran_order': False, 'shape': (2,), }", two), Status::corrupt, "missing 'descr'"},
      {"duplicate_key", npy_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", two),
       Status::corrupt, "duplicate"},
      {"unknown_key", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", two), Status::corrupt,
       "unexpected key 'x'"},
      {"not_a_dict", npy_file("['<f4', False, (2,)]", two), Status::corrupt, "expected '{'"},
      {"unterminated_string", npy_file("{'descr: ", ""), Status::corrupt, "unterminated"},
      {"unterminated_dict", npy_file("{'descr': '<f4'", ""), Status::corrupt, "expected ',' or '}'"},
      {"garbage_after_dict", npy_file(good_dict + " x", two), Status::corrupt, "after the dict"},
      {"too_many_dims", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (" + sixty_five_ones + "), }", "\1"),
       Status::corrupt, "more than 64"},
  };
}

class NpyCorrupt : public ::testing::TestWithParam<NpyCase> {};

TEST_P(NpyCorrupt, RejectedWithNamedFile) {
  const NpyCase& c = GetParam();
  ScratchDir dir;
  const std::string name = std::string("case_") + c.label + ".npy";
  write_bytes(dir / name, c.bytes);
  expect_error([&] { read_npy(dir / name); }, c.status, {name, c.fragment});
}

INSTANTIATE_TEST_SUITE_P(Table, NpyCorrupt, ::testing::ValuesIn(npy_cases()),
                         [](const ::testing::TestParamInfo<NpyCase>& info) { return std::string(info.param.label); });

TEST(Npy, FuzzSeedCorpusParses) {
  const std::filesystem::path dir = std::filesystem::path(SLUICE_SOURCE_DIR) / "tests/fuzz/corpus_npy";
  EXPECT_EQ(read_npy(dir / "f4_2x3.npy").data, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(read_npy(dir / "f2_1d.npy").data, (std::vector<float>{1.0f, -1.0f}));
  EXPECT_EQ(read_npy(dir / "f8_scalar.npy").data, (std::vector<float>{0.1f}));
}

TEST(Npy, MissingFile) {
  ScratchDir dir;
  expect_error([&] { read_npy(dir / "absent.npy"); }, Status::not_found, {"absent.npy"});
}

// ---- read_json_file ----

TEST(JsonFile, ReadsObject) {
  ScratchDir dir;
  write_bytes(dir / "config.json", "{\"hidden_size\": 64, \"layers\": [1, 2]}\n");
  nlohmann::json j = read_json_file(dir / "config.json");
  EXPECT_EQ(j.at("hidden_size").get<int>(), 64);
  EXPECT_EQ(j.at("layers").size(), 2u);
}

TEST(JsonFile, MissingFile) {
  ScratchDir dir;
  expect_error([&] { read_json_file(dir / "config.json"); }, Status::not_found, {"config.json", "no such file"});
  expect_error([&] { read_json_file(dir.path()); }, Status::invalid_argument, {"not a regular file"});
}

TEST(JsonFile, SyntaxErrorWithLineAndColumn) {
  ScratchDir dir;
  write_bytes(dir / "config.json", "{\n  \"a\": 1,\n  \"b\": tru\n}\n");
  expect_error([&] { read_json_file(dir / "config.json"); }, Status::corrupt,
               {"config.json", "invalid JSON: line 3, column 11", "invalid literal"});
  write_bytes(dir / "config.json", "{\"a\": 1");
  expect_error([&] { read_json_file(dir / "config.json"); }, Status::corrupt, {"config.json", "line 1", "end of input"});
  write_bytes(dir / "config.json", "{\"x\": 1e400}");
  expect_error([&] { read_json_file(dir / "config.json"); }, Status::corrupt, {"config.json", "number overflow"});
  write_bytes(dir / "config.json", "");
  expect_error([&] { read_json_file(dir / "config.json"); }, Status::corrupt, {"config.json", "line 1, column 1"});
  write_bytes(dir / "config.json", "{\"\xc3\x28\": 1}");
  std::string m = expect_error([&] { read_json_file(dir / "config.json"); }, Status::corrupt, {"config.json", "UTF-8"});
  for (char c : m) EXPECT_LT(static_cast<unsigned char>(c), 0x80u) << "message bytes stay ASCII";
}

}  // namespace
