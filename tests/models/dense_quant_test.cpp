// Quantized dense weights (`convert --dense int8|q4`, format version 3), on bf16 fixtures of
// each kind of model (a decoder, a Gated DeltaNet hybrid, a QSA + hyper-connection hybrid):
//  - exactly which tensors are quantized: the matrices the family takes with take_matrix
//    (projections, router, embeddings, output head), never norms, biases, conv or recurrent-
//    state parameters; their bytes are core/quant's quantize_row of the checkpoint rows, and
//    the CPU get_rows of them is core/quant's dequantize_row, bit for bit;
//  - the run from the pack is bit-identical to a run of the checkpoint whose quantized tensors
//    hold their dequantized f32 values (so the pack, the loader and the quantized matmul and
//    get_rows are exact; only the weights differ);
//  - what the weights cost: the logits' RMS error relative to the bf16 run stays within a
//    bound derived from the weights' own relative RMS quantization error (below), on the
//    fixtures whose routing does not flip under small perturbations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "convert/convert.h"
#include "core/quant.h"
#include "tests/models/fixture_util.h"
#include "format/checkpoint.h"
#include "format/pack.h"
#include "format/safetensors.h"
#include "models/load.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The roles --dense quantizes, by checkpoint name.
bool is_matrix_role(const std::string& name) {
  return ends_with(name, "_proj.weight") || name.find(".in_proj_") != std::string::npos || ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight") ||
         ends_with(name, ".gate.weight") || ends_with(name, "shared_expert_gate.weight");
}

// The rows of a quantized [rows, cols] tensor as f32, by core/quant's dequantizer.
std::vector<float> dequantized(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t r = 0; r < t.rows(); ++r)
    dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + r * quant_row_bytes(t.dtype, t.cols()),
                   static_cast<const uint8_t*>(t.scales) + r * quant_scale_row_bytes(t.dtype, t.cols()), t.cols(),
                   out.data() + r * t.cols());
  return out;
}

double sq_sum(std::span<const float> a) {
  double s = 0;
  for (float v : a) s += static_cast<double>(v) * v;
  return s;
}

double sq_diff(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

class DenseQuant : public ::testing::TestWithParam<DensePackCase> {};

TEST_P(DenseQuant, QuantizesTheMatricesExactlyAndCostsWhatTheirErrorPredicts) {
  const auto [fixture, q] = GetParam();
  ConvertSummary s;
  const fs::path pack_dir = dense_pack(GetParam(), DType::bf16, &s);
  ASSERT_EQ(s.dense_quant, q);
  EXPECT_EQ(s.dense_dtype, DType::bf16);  // the fixtures are bf16: the kept tensors too
  EXPECT_TRUE(verify_pack(pack_dir).ok);

  std::shared_ptr<Pack> pack = Pack::open(pack_dir);
  const PackManifest& m = pack->manifest();
  EXPECT_EQ(m.version, 3);
  EXPECT_EQ(m.dense_matrix_dtype(), q);
  Checkpoint ck = Checkpoint::open(fixture_dir(fixture));
  auto backend = make_cpu_backend();
  std::map<std::string, std::shared_ptr<std::vector<float>>> values;  // the quantized tensors, dequantized
  double err_sq = 0, w_sq = 0;  // over every quantized weight
  int n_quantized = 0;
  for (const PackDenseTensor& d : m.dense) {
    SCOPED_TRACE(d.name);
    const Tensor t = pack->dense(d.name);
    if (!dtype_is_quantized(d.dtype)) {
      // Norms, biases, conv taps, A_log / dt_bias, hyper-connection mixes: as stored.
      EXPECT_FALSE(is_matrix_role(d.name) && dense_quantizable_shape(d.shape) && !ends_with(d.name, "in_proj_qkvz.weight") &&
                   !ends_with(d.name, "in_proj_ba.weight"))
          << "a matrix left unquantized";
      if (dtype_is_float(d.dtype)) {
        EXPECT_EQ(d.dtype, DType::bf16);
      }
      continue;
    }
    ++n_quantized;
    EXPECT_EQ(d.dtype, q);
    EXPECT_TRUE(is_matrix_role(d.name)) << "quantized a tensor that is not a matrix role";
    // The bytes: quantize_row of the checkpoint's rows.
    const Tensor src = ck.get(d.name);
    const int64_t rows = t.rows(), cols = t.cols();
    std::vector<float> row(static_cast<size_t>(cols));
    std::vector<uint8_t> data(static_cast<size_t>(quant_row_bytes(q, cols))), scales(static_cast<size_t>(quant_scale_row_bytes(q, cols)));
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      dtype_row_to_f32(static_cast<const uint8_t*>(src.data) + r * cols * dtype_size(src.dtype), src.dtype, cols, row.data());
      ASSERT_TRUE(quantize_row(q, row.data(), cols, data.data(), scales.data()));
      bad += std::memcmp(data.data(), static_cast<const uint8_t*>(t.data) + r * data.size(), data.size()) != 0 ||
             std::memcmp(scales.data(), static_cast<const uint8_t*>(t.scales) + r * scales.size(), scales.size()) != 0;
    }
    EXPECT_EQ(bad, 0) << "rows whose bytes are not quantize_row's";
    // get_rows of every row is dequantize_row, bit for bit.
    auto want = std::make_shared<std::vector<float>>(dequantized(t));
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) ids[static_cast<size_t>(r)] = static_cast<int32_t>(rows - 1 - r);  // reversed
    Tensor got = backend->alloc(DType::f32, {rows, cols});
    backend->get_rows(backend->upload(t), ids, got);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(std::memcmp(got.ptr<float>() + r * cols, want->data() + (rows - 1 - r) * cols, cols * sizeof(float)), 0) << "row " << r;
    for (int64_t r = 0; r < rows; ++r) {
      dtype_row_to_f32(static_cast<const uint8_t*>(src.data) + r * cols * dtype_size(src.dtype), src.dtype, cols, row.data());
      err_sq += sq_diff(row, std::span<const float>(want->data() + r * cols, cols));
      w_sq += sq_sum(row);
    }
    values[d.name] = want;
  }
  // The decoder and hybrid roles are all there: embeddings, output head (or tied), router,
  // attention.
  EXPECT_GE(n_quantized, 6);

  // Exact: the pack run equals the checkpoint of its values.
  const fs::path values_dir = pack_test_dir(fixture + "-dense-values-" + std::string(dense_dtype_name(q)));
  fs::copy_file(fixture_dir(fixture) / "config.json", values_dir / "config.json", fs::copy_options::overwrite_existing);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : ck.names()) {
    if (name.rfind("model.visual.", 0) == 0) continue;  // the vision tower (5-D; the pack leaves it out)
    auto it = values.find(name);
    const Tensor src = ck.get(name);
    tensors.emplace_back(name, it == values.end() ? src : Tensor(DType::f32, {src.shape[0], src.shape[1]}, it->second->data()));
  }
  write_safetensors(values_dir / "model.safetensors", tensors);
  const std::vector<int32_t> ids = full_ids(fixture);
  const std::vector<float> from_pack = teacher_forced(pack_dir, ids, {DType::bf16});
  const std::vector<float> from_values = teacher_forced(values_dir, ids);
  ASSERT_EQ(from_pack.size(), from_values.size());
  EXPECT_EQ(std::memcmp(from_pack.data(), from_values.data(), from_pack.size() * sizeof(float)), 0);

  // What it costs. With a relative RMS weight error eps (measured above over every quantized
  // weight), each of the n quantized matrices perturbs its output by about eps relative, and
  // independent perturbations add in quadrature along the residual stream: the logits move
  // by about sqrt(n_layers_path) x eps. The path through a token is every quantized matrix of
  // one layer stack, at most all n of them, so the bound is sqrt(n) x eps, with a factor 2 of
  // headroom for the nonlinearities (softmax, SiLU, routing) between them.
  const std::vector<float> reference = teacher_forced(fixture_dir(fixture), ids);
  const double eps = std::sqrt(err_sq / w_sq);
  const double logit_err = std::sqrt(sq_diff(from_pack, reference) / sq_sum(reference));
  const double bound = 2 * std::sqrt(static_cast<double>(n_quantized)) * eps;
  std::printf("%s --dense %s: %d matrices, weight error %.3g, logit error %.3g (bound %.3g)\n", fixture.c_str(),
              std::string(dense_dtype_name(q)).c_str(), n_quantized, eps, logit_err, bound);
  EXPECT_GT(logit_err, 0);
  // qwen3_5_moe's routing flips under small perturbations (quality_test.cpp: one int8 flip
  // of its experts gives a KL of 0.036), which no weight-error bound covers: reported only,
  // as the quality test does (its int8 logit error, 0.20, is 3x the bound; q4 is within).
  const auto bounded = quality_bounded_fixtures();
  if (std::find(bounded.begin(), bounded.end(), fixture) != bounded.end()) {
    EXPECT_LE(logit_err, bound);
  }
  // int8's error per weight is about 1/127 of the row's absmax, q4's 1/8 of the group's.
  EXPECT_LE(eps, q == DType::q8 ? 0.01 : 0.15);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DenseQuant,
                         ::testing::Values(DensePackCase{"olmoe", DType::q8}, DensePackCase{"olmoe", DType::q4},
                                           DensePackCase{"qwen3_5_moe", DType::q8}, DensePackCase{"qwen3_5_moe", DType::q4},
                                           DensePackCase{"qwen4_exp_qsa", DType::q4}),
                         [](const auto& info) {
                           return info.param.fixture + "_" + std::string(dense_dtype_name(info.param.dense));
                         });

}  // namespace
