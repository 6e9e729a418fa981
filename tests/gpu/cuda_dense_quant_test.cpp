// Quantized dense weights on the GPU (`convert --dense int8|q4`): the CUDA get_rows of a
// q8 / q4 table equals the CPU's bit for bit (both dequantize by core/quant.h's exact
// formulas), and packs of a decoder and two hybrid fixtures converted with each choice give
// on the CUDA backend the logits the CPU backend gives from the same pack, within the
// tolerances of the existing parity tests (cuda_pack_test.cpp: 1e-3 max-abs for the decoder
// families, f32 activations with reordered sums; cuda_parity_test.cpp: 1e-4 for the hybrids),
// over a teacher-forced prompt and over token-by-token decode, and the same greedy tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "convert/convert.h"
#include "core/quant.h"
#include "engine/generator.h"
#include "format/pack.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

// A [rows, cols] table of random rows quantized to q, as a host tensor over `bytes`.
Tensor quantized_table(DType q, int64_t rows, int64_t cols, std::vector<uint8_t>& bytes) {
  const int64_t rb = quant_row_bytes(q, cols), sb = quant_scale_row_bytes(q, cols);
  bytes.assign(static_cast<size_t>(rows * (rb + sb)), 0);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = nd(rng);
    EXPECT_TRUE(quantize_row(q, row.data(), cols, bytes.data() + r * rb, bytes.data() + rows * rb + r * sb));
  }
  Tensor t(q, {rows, cols}, bytes.data());
  t.scales = bytes.data() + rows * rb;
  return t;
}

TEST(CudaDenseQuant, GetRowsEqualsTheCpuBitForBit) {
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  for (DType q : {DType::q8, DType::q4, DType::q2}) {
    for (int64_t cols : {64, 96, 2048, 40}) {  // 40: a partial q4 group (the scalar path)
      SCOPED_TRACE(std::string(dtype_name(q)) + " cols " + std::to_string(cols));
      std::vector<uint8_t> bytes;
      const int64_t rows = 301;
      Tensor host = quantized_table(q, rows, cols, bytes);
      const std::vector<int32_t> ids = {0, 300, 7, 7, 150, 299, 1};
      const int64_t n = static_cast<int64_t>(ids.size());
      Tensor oc = cpu->alloc(DType::f32, {n, cols});
      cpu->get_rows(host, ids, oc);
      Tensor table = gpu->upload(host);
      Tensor og = gpu->alloc(DType::f32, {n, cols});
      gpu->get_rows(table, ids, og);
      std::vector<float> got(static_cast<size_t>(n * cols));
      gpu->to_host(og, got.data());
      EXPECT_EQ(std::memcmp(got.data(), oc.data, got.size() * sizeof(float)), 0);
      // get_rows_at (the captured decode step's form).
      Tensor dev_ids = gpu->alloc(DType::i32, {n});
      gpu->from_host(dev_ids, ids.data());
      gpu->fill(og, 0.0f);
      gpu->get_rows_at(table, dev_ids, og);
      gpu->to_host(og, got.data());
      EXPECT_EQ(std::memcmp(got.data(), oc.data, got.size() * sizeof(float)), 0);
    }
  }
}

class CudaDenseQuantPack : public ::testing::TestWithParam<DensePackCase> {};

TEST_P(CudaDenseQuantPack, MatchesTheCpu) {
  const auto [fixture, q] = GetParam();
  const fs::path dir = dense_pack(GetParam(), DType::q4);
  ASSERT_EQ(Pack::open(dir)->manifest().dense_matrix_dtype(), q);
  const bool hybrid = fixture.rfind("qwen3_moe", 0) != 0 && fixture != "olmoe" && fixture != "mixtral";
  const float tolerance = hybrid ? 1e-4f : 1e-3f;

  FixtureReference ref = read_reference(fixture);
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  LoadedModel mc = load_model(dir, *cpu), mg = load_model(dir, *gpu);
  const int64_t n = static_cast<int64_t>(ref.prompt_ids.size()), V = mc.model->info().n_vocab;
  std::vector<float> lc(n * V), lg(n * V);
  auto sc = mc.model->new_state(n + 8), sg = mg.model->new_state(n + 8);
  mc.model->forward(ref.prompt_ids, *sc, lc, true);
  mg.model->forward(ref.prompt_ids, *sg, lg, true);
  float diff = max_abs_diff(lg, lc);
  // Decode: the continuation token by token (get_rows_at, the matvec path).
  std::vector<float> rc(V), rg(V);
  float decode_diff = 0;
  for (size_t i = 0; i < 8 && i < ref.continuation_ids.size(); ++i) {
    const std::vector<int32_t> one = {ref.continuation_ids[i]};
    mc.model->forward(one, *sc, rc, false);
    mg.model->forward(one, *sg, rg, false);
    decode_diff = std::max(decode_diff, max_abs_diff(rg, rc));
  }
  std::printf("cuda --dense %s %s: max |gpu - cpu| prefill %.3g, decode %.3g\n", std::string(dense_dtype_name(q)).c_str(),
              fixture.c_str(), diff, decode_diff);
  EXPECT_LE(diff, tolerance);
  EXPECT_LE(decode_diff, tolerance);
  EXPECT_EQ(greedy(*mg.model, ref.prompt_ids, 8), greedy(*mc.model, ref.prompt_ids, 8));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDenseQuantPack,
                         ::testing::Values(DensePackCase{"olmoe", DType::q8}, DensePackCase{"olmoe", DType::q4},
                                           DensePackCase{"qwen3_moe", DType::q8}, DensePackCase{"qwen3_moe", DType::q4},
                                           DensePackCase{"qwen3_5_moe", DType::q8}, DensePackCase{"qwen3_5_moe", DType::q4},
                                           DensePackCase{"qwen4_exp_qsa", DType::q4}),
                         [](const auto& info) {
                           return info.param.fixture + "_" + std::string(dense_dtype_name(info.param.dense));
                         });

}  // namespace
