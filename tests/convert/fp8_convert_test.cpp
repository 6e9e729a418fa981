// An FP8 checkpoint converts and runs exactly as a checkpoint holding its dequantized values.
// The qwen3_moe fixture's projections (attention, the dense MLP, every expert) re-encoded here
// as F8_E4M3 in blocks of [24, 40] (partial blocks on both edges of every matrix) by the
// test's own quantizer and decoder, the other tensors bf16, as DeepSeek-V3 ships: the
// default convert gives the same dense tensors and bf16 expert records, byte for byte, as the
// bf16 checkpoint of bf16(dequantized) values, `--dense f32` the same dense tensors and expert
// files of every kind as the checkpoint holding the f32 dequantized values, and `sluice convert` + `sluice logits`
// and the direct run of the FP8 directory the same logits as those checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "tests/format/format_test_util.h"
#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_util.h"
#include "convert/convert.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/pack.h"
#include "format/safetensors.h"
#include "models/registry.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;

namespace {

constexpr int64_t kBlockRows = 24, kBlockCols = 40;

float e4m3_value(uint8_t v) {  // float8_e4m3fn by definition (finite codes only here)
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -mag : mag;
}

// Round to nearest e4m3fn, ties to the even code, clamped to +-448 (what torch's cast of a
// clamped value does).
uint8_t e4m3_code(float x) {
  const uint8_t sign = x < 0 ? 0x80 : 0;
  const float a = std::min(std::fabs(x), 448.0f);
  uint8_t best = 0;
  for (uint8_t c = 1; c <= 0x7e; ++c) {
    const float d = std::fabs(e4m3_value(c) - a), db = std::fabs(e4m3_value(best) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(sign | best);
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;      // [ceil(rows / 24), ceil(cols / 40)]
  std::vector<float> dequantized; // code value * block scale, in f32
};

// DeepSeek-V3's recipe: scale = amax / 448 a block (1 for an all-zero block), q = w / scale.
Quantized quantize_blocks(const std::vector<float>& w, int64_t rows, int64_t cols) {
  const int64_t sr = (rows + kBlockRows - 1) / kBlockRows, sc = (cols + kBlockCols - 1) / kBlockCols;
  Quantized q;
  q.scales.assign(static_cast<size_t>(sr * sc), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& s = q.scales[static_cast<size_t>((r / kBlockRows) * sc + c / kBlockCols)];
      s = std::max(s, std::fabs(w[static_cast<size_t>(r * cols + c)]));
    }
  for (float& s : q.scales) s = s > 0 ? s / 448.0f : 1.0f;
  q.codes.resize(w.size());
  q.dequantized.resize(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const float s = q.scales[static_cast<size_t>((r / kBlockRows) * sc + c / kBlockCols)];
      q.codes[i] = e4m3_code(w[i] / s);
      q.dequantized[i] = e4m3_value(q.codes[i]) * s;
    }
  return q;
}

// The three checkpoints: "fp8" (projections FP8 + scales, the rest bf16), "deq-bf16"
// (everything bf16, projections bf16(dequantized)), "deq-f32" (projections f32 dequantized,
// the rest bf16). Made once per test process.
struct Fp8Checkpoints {
  fs::path fp8, deq_bf16, deq_f32;
  int64_t n_fp8 = 0;
};

const Fp8Checkpoints& checkpoints() {
  static const Fp8Checkpoints made = [] {
    Fp8Checkpoints out;
    out.fp8 = pack_test_dir("fp8-ck");
    out.deq_bf16 = pack_test_dir("fp8-deq-bf16");
    out.deq_f32 = pack_test_dir("fp8-deq-f32");
    Checkpoint ck = Checkpoint::open(fixture_dir("qwen3_moe"));
    // Owned storage for every tensor written (kept until the files are written).
    std::vector<std::shared_ptr<std::vector<uint8_t>>> keep;
    auto owned = [&](DType dt, std::vector<int64_t> shape, const void* src, size_t bytes) {
      auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + bytes);
      keep.push_back(buf);
      Tensor t;
      t.dtype = dt;
      for (int64_t d : shape) t.shape[t.ndim++] = d;
      t.data = buf->data();
      return t;
    };
    auto bf16_of = [&](const std::vector<float>& v, std::vector<int64_t> shape) {
      std::vector<uint16_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
      return owned(DType::bf16, shape, b.data(), b.size() * 2);
    };
    std::vector<std::pair<std::string, Tensor>> fp8, deq_bf16, deq_f32;
    for (const std::string& name : ck.names()) {
      const Tensor t = ck.get(name);
      std::vector<float> v(static_cast<size_t>(t.numel()));
      dtype_row_to_f32(t.data, t.dtype, t.numel(), v.data());
      std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
      const bool is_fp8 = t.ndim == 2 && name.ends_with("_proj.weight");
      if (!is_fp8) {
        const Tensor b = bf16_of(v, shape);
        fp8.emplace_back(name, b);
        deq_bf16.emplace_back(name, b);
        deq_f32.emplace_back(name, b);
        continue;
      }
      ++out.n_fp8;
      const Quantized q = quantize_blocks(v, shape[0], shape[1]);
      fp8.emplace_back(name, owned(DType::f8_e4m3, shape, q.codes.data(), q.codes.size()));
      fp8.emplace_back(name + "_scale_inv",
                       owned(DType::f32, {(shape[0] + kBlockRows - 1) / kBlockRows, (shape[1] + kBlockCols - 1) / kBlockCols},
                             q.scales.data(), q.scales.size() * 4));
      deq_bf16.emplace_back(name, bf16_of(q.dequantized, shape));
      deq_f32.emplace_back(name, owned(DType::f32, shape, q.dequantized.data(), q.dequantized.size() * 4));
    }
    nlohmann::json config = read_json_file(fixture_dir("qwen3_moe") / "config.json");
    config["dtype"] = "bfloat16";
    for (const auto& [dir, tensors] : {std::pair{out.fp8, &fp8}, {out.deq_bf16, &deq_bf16}, {out.deq_f32, &deq_f32}}) {
      write_safetensors(dir / "model.safetensors", *tensors);
      for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
        fs::copy_file(fixture_dir("qwen3_moe") / f, dir / f, fs::copy_options::overwrite_existing);
      nlohmann::json c = config;
      if (dir == out.fp8)
        c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                    {"weight_block_size", {kBlockRows, kBlockCols}}};
      std::ofstream(dir / "config.json") << c.dump(2);
    }
    return out;
  }();
  return made;
}

ConvertOptions options(std::vector<DType> kinds, std::optional<DType> dense = std::nullopt) {
  ConvertOptions o;
  o.kinds = std::move(kinds);
  o.dense_dtype = dense;
  return o;
}

LoadOptions kind(DType k) {
  LoadOptions lo;
  lo.expert_kind = k;
  return lo;
}

// The dense tensors of two packs: the same names, dtypes, shapes and bytes (dense.bin's order
// follows each checkpoint's file layout, so the files themselves may differ).
void expect_same_dense(const fs::path& a, const fs::path& b) {
  std::shared_ptr<Pack> pa = Pack::open(a), pb = Pack::open(b);
  ASSERT_EQ(pa->dense_names(), pb->dense_names());
  for (const std::string& name : pa->dense_names()) {
    const Tensor x = pa->dense(name), y = pb->dense(name);
    EXPECT_EQ(x.dtype, y.dtype) << name;
    EXPECT_EQ(x.shape_str(), y.shape_str()) << name;
    EXPECT_TRUE(x.nbytes() == y.nbytes() && std::memcmp(x.data, y.data, x.nbytes()) == 0) << name;
  }
}

void expect_same_file(const fs::path& a, const fs::path& b) {
  const std::string x = read_bytes(a), y = read_bytes(b);
  EXPECT_FALSE(x.empty()) << a;
  EXPECT_TRUE(x == y) << a << " and " << b << " differ (" << x.size() << " and " << y.size() << " bytes)";
}

TEST(Fp8Convert, DefaultPackEqualsTheBf16CheckpointOfTheDequantizedValues) {
  const Fp8Checkpoints& c = checkpoints();
  ASSERT_EQ(c.n_fp8, 3 * 4 + 3 + 2 * 8 * 3);  // attention in 3 layers, the dense MLP, 2 MoE layers of 8 experts
  const fs::path parent = pack_test_dir("fp8-default");
  const ConvertSummary a = convert_checkpoint(c.fp8, parent / "a", options({DType::bf16}));
  const ConvertSummary b = convert_checkpoint(c.deq_bf16, parent / "b", options({DType::bf16}));
  EXPECT_EQ(a.dense_dtype, DType::bf16);  // a bf16 model quantized: dense bf16 as for its bf16 checkpoint
  EXPECT_EQ(b.dense_dtype, DType::bf16);
  expect_same_dense(parent / "a", parent / "b");
  expect_same_file(parent / "a" / "experts.bf16.bin", parent / "b" / "experts.bf16.bin");
  const std::vector<int32_t> ids = full_ids("qwen3_moe");
  const std::vector<float> pack_a = teacher_forced(parent / "a", ids, kind(DType::bf16));
  EXPECT_EQ(pack_a, teacher_forced(parent / "b", ids, kind(DType::bf16)));
  // The direct run of the FP8 directory holds the same bf16 weights as the pack and as the
  // bf16 checkpoint.
  const std::vector<float> direct = teacher_forced(c.fp8, ids);
  EXPECT_EQ(direct, teacher_forced(c.deq_bf16, ids));
  EXPECT_EQ(direct, pack_a);
}

TEST(Fp8Convert, DenseF32PackEqualsTheF32CheckpointOfTheDequantizedValues) {
  const Fp8Checkpoints& c = checkpoints();
  const fs::path parent = pack_test_dir("fp8-f32");
  const std::vector<DType> kinds = {DType::bf16, DType::q8, DType::q4, DType::q2};
  const ConvertSummary a = convert_checkpoint(c.fp8, parent / "a", options(kinds, DType::f32));
  const ConvertSummary b = convert_checkpoint(c.deq_f32, parent / "b", options(kinds));
  EXPECT_EQ(a.dense_dtype, DType::f32);
  EXPECT_EQ(b.dense_dtype, DType::f32);  // bf16 and f32 tensors: f32
  expect_same_dense(parent / "a", parent / "b");
  for (const char* f : {"experts.bf16.bin", "experts.int8.bin", "experts.q4.bin", "experts.q2.bin"})
    expect_same_file(parent / "a" / f, parent / "b" / f);
  const std::vector<int32_t> ids = full_ids("qwen3_moe");
  for (DType k : kinds) EXPECT_EQ(teacher_forced(parent / "a", ids, kind(k)), teacher_forced(parent / "b", ids, kind(k)));
}

// The command line: `sluice convert` of the FP8 directory and `sluice logits` of its pack
// give the same .npy as the same commands on the bf16 checkpoint of the dequantized values.
TEST(Fp8Convert, CommandLineLogitsEqual) {
  const Fp8Checkpoints& c = checkpoints();
  const fs::path parent = pack_test_dir("fp8-cli");
  const std::string ids = join_ids(full_ids("qwen3_moe"));
  std::vector<std::string> npys;
  for (const auto& [name, dir] : {std::pair{"fp8", c.fp8}, {"deq", c.deq_bf16}}) {
    const fs::path io = parent / (std::string(name) + "-io");
    fs::create_directories(io);
    const std::string pack = (parent / name).string();
    CliRun conv = run_cli({"convert", dir.string(), pack, "--kinds", "bf16,q4", "-q"}, io);
    ASSERT_EQ(conv.status, 0) << conv.err;
    const std::string npy = (parent / (std::string(name) + ".npy")).string();
    CliRun l = run_cli({"logits", "--model", pack, "--expert-kind", "bf16", "--tokens", ids, "--out", npy}, io);
    ASSERT_EQ(l.status, 0) << l.err;
    npys.push_back(npy);
  }
  expect_same_file(npys[0], npys[1]);
}

// DeepSeek-V3's FP8 fixture (tools/make_fixtures.py: 32 x 32 blocks, partial edge blocks)
// converts to torch's dequantized values: with --dense f32 every dense FP8 weight of the pack
// is fp8_dequantized.safetensors' f32 tensor bit for bit, and every expert's bf16 record rows
// are those values rounded to bf16. Runs once the deepseek_v3 family is registered.
TEST(Fp8Convert, DeepseekFixtureConvertsToTorchsValues) {
  const fs::path src = fixture_dir("deepseek_v3_fp8");
  try {
    find_family(read_json_file(src / "config.json"));
  } catch (const Error& e) {
    GTEST_SKIP() << "no deepseek_v3 family in this build: " << e.what();
  }
  const fs::path out = pack_test_dir("fp8-deepseek") / "pack";
  convert_checkpoint(src, out, options({DType::bf16}, DType::f32));
  std::shared_ptr<Pack> pack = Pack::open(out);
  const PackKindInfo& bf16 = pack->kind(DType::bf16);
  auto want_file = SafetensorsFile::open(src / "fp8_dequantized.safetensors");
  int n_dense = 0, n_expert = 0;
  for (const SafetensorsEntry& e : want_file->entries()) {
    SCOPED_TRACE(e.name);
    const Tensor want = want_file->tensor(e.name);
    const size_t at = e.name.find(".experts.");
    if (at == std::string::npos) {
      const Tensor got = pack->dense(e.name);
      ASSERT_EQ(got.dtype, DType::f32);
      ASSERT_EQ(got.numel(), want.numel());
      EXPECT_EQ(std::memcmp(got.data, want.data, want.nbytes()), 0);
      ++n_dense;
      continue;
    }
    // "<prefix>experts.<e>.<proj>.weight": the record's block of that projection.
    const std::string prefix = e.name.substr(0, at + 9), rest = e.name.substr(at + 9);
    const int64_t expert = std::stoll(rest.substr(0, rest.find('.')));
    const std::string proj = rest.substr(rest.find('.') + 1);
    const PackBlock& blk = proj == "gate_proj.weight" ? bf16.gate : proj == "up_proj.weight" ? bf16.up : bf16.down;
    const int64_t layer = pack->moe_layer_of_prefix(prefix);
    ASSERT_GE(layer, 0);
    const auto record = pack->mapped_record(DType::bf16, pack->record_id(layer, expert));
    const auto* rows = reinterpret_cast<const uint16_t*>(record.data() + blk.offset);
    ASSERT_EQ(blk.rows * blk.cols, want.numel());
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(rows[i], f32_to_bf16(want.ptr<float>()[i])) << i;
    ++n_expert;
  }
  EXPECT_GT(n_dense, 0);
  EXPECT_GT(n_expert, 0);
}

}  // namespace
