// FP8 checkpoints: the two formats decoded exactly, DeepSeek-V3's FP8 fixture (32 x 32 blocks
// with partial edge blocks, written by tools/make_fixtures.py) dequantized bit for bit as
// torch's `q.float() * scale` (fp8_dequantized.safetensors) through both readers (Checkpoint's
// mapping and the converter's pread rows), and hostile FP8 checkpoints refused with one line
// that names the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "tests/models/fixture_util.h"
#include "core/zero_pages.h"
#include "format/checkpoint.h"
#include "format/checkpoint_reader.h"
#include "tests/format/format_test_util.h"
#include "format/json_file.h"
#include "format/safetensors.h"
#include "models/weight_source.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;

namespace {

// float8_e4m3fn by its definition: bias 7, 3 mantissa bits, subnormals below exponent 1,
// S.1111.111 NaN, no infinity.
float e4m3_by_definition(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -mag : mag;
}

// float8_e5m2: bias 15, 2 mantissa bits, IEEE infinities and NaNs.
float e5m2_by_definition(uint8_t v) {
  const int s = v >> 7, e = (v >> 2) & 31, m = v & 3;
  float mag;
  if (e == 31) mag = m ? std::nanf("") : INFINITY;
  else mag = e == 0 ? std::ldexp(static_cast<float>(m) / 4.0f, -14) : std::ldexp(1.0f + m / 4.0f, e - 15);
  return s ? -mag : mag;
}

bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

std::vector<float> values_f32(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  dtype_row_to_f32(t.data, t.dtype, t.numel(), out.data());
  return out;
}

TEST(Fp8, FormatsDecodeExactly) {
  for (int v = 0; v < 256; ++v) {
    EXPECT_TRUE(same_bits(f8_e4m3_to_f32(static_cast<uint8_t>(v)), e4m3_by_definition(static_cast<uint8_t>(v)))) << v;
    EXPECT_TRUE(same_bits(f8_e5m2_to_f32(static_cast<uint8_t>(v)), e5m2_by_definition(static_cast<uint8_t>(v)))) << v;
  }
  EXPECT_EQ(f8_e4m3_to_f32(0x7e), 448.0f);     // the largest finite e4m3fn
  EXPECT_EQ(f8_e4m3_to_f32(0x01), 0x1p-9f);    // the smallest subnormal
  EXPECT_EQ(f8_e5m2_to_f32(0x7b), 57344.0f);   // the largest finite e5m2
}

// Every FP8 weight of the fixture, read both ways, equals torch's dequantization bit for bit;
// the scale tensors are no tensors of their own; get() hands out bf16 (the fixture's other
// tensors are bf16) rounded from those values.
TEST(Fp8, DeepseekFixtureDequantizesAsTorch) {
  Checkpoint ck = Checkpoint::open(fixture_dir("deepseek_v3_fp8"));
  auto want_file = SafetensorsFile::open(fixture_dir("deepseek_v3_fp8") / "fp8_dequantized.safetensors");
  EXPECT_EQ(ck.fp8_dtype(), DType::bf16);
  size_t n_fp8 = 0;
  for (const std::string& name : ck.names()) {
    EXPECT_EQ(name.find("_scale_inv"), std::string::npos) << name;
    if (ck.fp8(name)) ++n_fp8;
  }
  EXPECT_EQ(n_fp8, want_file->entries().size());
  CheckpointReader reader(ck);
  std::vector<uint8_t> scratch;
  for (const SafetensorsEntry& e : want_file->entries()) {
    SCOPED_TRACE(e.name);
    ASSERT_NE(ck.fp8(e.name), nullptr);
    EXPECT_EQ(ck.fp8(e.name)->config.block_rows, 32);
    EXPECT_EQ(ck.entry(e.name).dtype, DType::f8_e4m3);
    const std::vector<float> want = values_f32(want_file->tensor(e.name));
    const std::vector<float> got = values_f32(ck.dequantized(e.name, DType::f32));
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
    // The converter's reader, in pieces of 7 rows: every piece but a few crosses a block edge.
    const int64_t rows = e.shape[0], cols = e.shape[1];
    std::vector<float> rows_read(static_cast<size_t>(rows * cols));
    for (int64_t r0 = 0; r0 < rows; r0 += 7)
      reader.read_rows_f32(e.name, r0, std::min<int64_t>(7, rows - r0), rows_read.data() + r0 * cols, scratch);
    EXPECT_EQ(std::memcmp(rows_read.data(), want.data(), want.size() * 4), 0);
    const Tensor b = ck.get(e.name);
    ASSERT_EQ(b.dtype, DType::bf16);
    ASSERT_EQ(b.numel(), rows * cols);
    for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(b.ptr<uint16_t>()[i], f32_to_bf16(want[static_cast<size_t>(i)])) << i;
  }
  EXPECT_TRUE(ck.unconsumed().size() < ck.names().size());
  // A dry run hands out the dequantized dtype and shape without values (zero pages).
  CheckpointSource dry(Checkpoint::open(fixture_dir("deepseek_v3_fp8")), true);
  const Tensor z = dry.get("model.layers.0.self_attn.kv_b_proj.weight");
  EXPECT_EQ(z.dtype, DType::bf16);
  EXPECT_EQ(z.shape_str(), "[128, 48]");
  EXPECT_EQ(z.ptr<uint16_t>()[128 * 48 - 1], 0);
}

// A little FP8 checkpoint written by hand: weight "w.weight" [rows, cols] of `codes`, a scale
// tensor of `scale_shape` holding `scales`, and a config with `quant` as quantization_config
// (null: none; the string "no config": no config.json at all).
struct Fp8Case {
  DType format = DType::f8_e4m3;
  std::vector<int64_t> shape = {5, 6};
  std::vector<int64_t> scale_shape = {3, 2};
  std::vector<float> scales = {1, 2, 0.5f, 4, 8, 0.25f};
  DType scale_dtype = DType::f32;
  bool with_scale = true;
  nlohmann::json quant = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {2, 4}}};
  bool with_config = true;
};

std::vector<uint8_t> case_codes(const Fp8Case& c) {
  int64_t n = 1;
  for (int64_t d : c.shape) n *= d;
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) codes[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 37 + 11) % 0x7e);
  return codes;
}

void write_case(const fs::path& dir, const Fp8Case& c) {
  std::vector<uint8_t> codes = case_codes(c);
  std::vector<float> scales = c.scales;
  std::vector<uint16_t> scales16(scales.size());
  for (size_t i = 0; i < scales.size(); ++i) scales16[i] = f32_to_bf16(scales[i]);
  Tensor w;
  w.dtype = c.format;
  for (int64_t d : c.shape) w.shape[w.ndim++] = d;
  w.data = codes.data();
  Tensor s;
  s.dtype = c.scale_dtype;
  if (c.scale_shape.empty()) s.shape[s.ndim++] = 1;
  for (int64_t d : c.scale_shape) s.shape[s.ndim++] = d;
  s.data = c.scale_dtype == DType::f32 ? static_cast<void*>(scales.data()) : static_cast<void*>(scales16.data());
  std::vector<std::pair<std::string, Tensor>> tensors = {{"w.weight", w}};
  if (c.with_scale) tensors.emplace_back("w.weight_scale_inv", s);
  write_safetensors(dir / "model.safetensors", tensors);
  if (c.with_config) {
    nlohmann::json config = {{"model_type", "test"}};
    if (!c.quant.is_null()) config["quantization_config"] = c.quant;
    std::ofstream(dir / "config.json") << config.dump();
  }
}

TEST(Fp8, HandWrittenBlocksAndFormats) {
  // E4M3 in blocks of [2, 4] over [5, 6]: blocks partial on both edges.
  {
    ScratchDir d;
    Fp8Case c;
    write_case(d.path(), c);
    Checkpoint ck = Checkpoint::open(d.path());
    EXPECT_EQ(ck.fp8_dtype(), DType::bf16);  // no other float tensor says otherwise
    const std::vector<uint8_t> codes = case_codes(c);
    const std::vector<float> got = values_f32(ck.dequantized("w.weight", DType::f32));
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t j = 0; j < 6; ++j) {
        const float want = e4m3_by_definition(codes[static_cast<size_t>(r * 6 + j)]) * c.scales[static_cast<size_t>((r / 2) * 2 + j / 4)];
        EXPECT_TRUE(same_bits(got[static_cast<size_t>(r * 6 + j)], want)) << r << "," << j;
      }
  }
  // E5M2 with one bf16 scale for the whole matrix (weight_block_size null).
  {
    ScratchDir d;
    Fp8Case c;
    c.format = DType::f8_e5m2;
    c.scale_shape = {};
    c.scales = {3.0f};
    c.scale_dtype = DType::bf16;
    c.quant["weight_block_size"] = nullptr;
    write_case(d.path(), c);
    Checkpoint ck = Checkpoint::open(d.path());
    const std::vector<uint8_t> codes = case_codes(c);
    const std::vector<float> got = values_f32(ck.dequantized("w.weight", DType::f32));
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], e5m2_by_definition(codes[i]) * 3.0f)) << i;
  }
}

TEST(Fp8, HostileCheckpointsAreRefused) {
  struct Bad {
    const char* what;
    std::function<void(Fp8Case&)> edit;
    Status status;
    std::vector<std::string> fragments;
  };
  const std::vector<Bad> bad = {
      {"no config.json", [](Fp8Case& c) { c.with_config = false; }, Status::unsupported, {"w.weight", "F8_E4M3", "config.json"}},
      {"no quantization_config", [](Fp8Case& c) { c.quant = nullptr; }, Status::unsupported,
       {"w.weight", "no quantization_config"}},
      {"another method", [](Fp8Case& c) { c.quant["quant_method"] = "gptq"; }, Status::unsupported, {"quant_method 'gptq'"}},
      {"static activations", [](Fp8Case& c) { c.quant["activation_scheme"] = "static"; }, Status::unsupported,
       {"activation_scheme", "static"}},
      {"zero block", [](Fp8Case& c) { c.quant["weight_block_size"] = {0, 4}; }, Status::corrupt, {"weight_block_size"}},
      {"one-number block", [](Fp8Case& c) { c.quant["weight_block_size"] = {128}; }, Status::corrupt, {"weight_block_size"}},
      {"text block", [](Fp8Case& c) { c.quant["weight_block_size"] = "128x128"; }, Status::corrupt, {"weight_block_size"}},
      {"missing scale", [](Fp8Case& c) { c.with_scale = false; }, Status::corrupt, {"w.weight", "no scale tensor", "w.weight_scale_inv"}},
      {"scale of the wrong shape", [](Fp8Case& c) { c.scale_shape = {2, 3}; }, Status::corrupt,
       {"w.weight_scale_inv", "[2, 3]", "expected [3, 2]", "blocks of [2, 4]"}},
      {"integer scale", [](Fp8Case& c) {
         c.scale_dtype = DType::i32;
       }, Status::corrupt, {"w.weight_scale_inv", "I32"}},
      {"three dimensions", [](Fp8Case& c) { c.shape = {2, 5, 6}; }, Status::unsupported, {"w.weight", "3 dimensions"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    ScratchDir d;
    Fp8Case c;
    b.edit(c);
    if (c.scale_dtype == DType::i32) {  // the same bits, read as integers
      c.scales.assign(c.scales.size(), 0.0f);
    }
    write_case(d.path(), c);
    const std::string msg = expect_error([&] { Checkpoint::open(d.path()); }, b.status, b.fragments);
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
  // A scale that is not finite: found when the block is dequantized, naming the block.
  ScratchDir d;
  Fp8Case c;
  c.scales[3] = INFINITY;  // block (1, 1)
  write_case(d.path(), c);
  Checkpoint ck = Checkpoint::open(d.path());
  expect_error([&] { ck.dequantized("w.weight", DType::f32); }, Status::corrupt, {"w.weight", "block (1, 1)", "inf"});
  CheckpointReader reader(ck);
  std::vector<float> out(12);
  std::vector<uint8_t> scratch;
  EXPECT_NO_THROW(reader.read_rows_f32("w.weight", 0, 2, out.data(), scratch));  // block row 0 is fine
  expect_error([&] { reader.read_rows_f32("w.weight", 2, 2, out.data(), scratch); }, Status::corrupt, {"block (1, 1)"});
}

}  // namespace
