// Sampling on the device (backends/cuda/sample.cu) against the CPU rule (core/sampling.h):
// greedy exactly; for sampled rows every id the device draws is in the CPU's kept set, and
// the two agree on the token for nearly every uniform number (they differ only where a sum's
// rounding moves a boundary between two tokens: the device adds in a tree, the CPU in order);
// a row with NaN or +inf gives -1; padded ids (>= n_valid) are never drawn; writes stay inside ids.
// Rows drawn by temperature alone are checked on both paths (many blocks a row, one block).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/backend.h"
#include "core/sampling.h"
#include "scoped_env.h"

using namespace sluice;

namespace {

struct Case {
  int64_t vocab, n_valid;
  SampleRule rule;
};

// Each case twice: rows drawn by temperature alone over many blocks a row (the default) and
// in the one-block kernel (SLUICE_CUDA_SAMPLE_BLOCKS=0); the other rules take one path.
TEST(CudaSample, SameKeptSetsAndNearlyAlwaysTheSameTokenAsTheCpu) {
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 3.0f);
  const int64_t n = 64;  // rows, each its own draw
  for (const char* blocks : {static_cast<const char*>(nullptr), "0"})
  for (const Case c : {Case{151936, 151669, {0.0f, 0, 1.0f}}, Case{151936, 151669, {1.0f, 0, 1.0f}},
                       Case{151936, 151936, {0.7f, 40, 1.0f}}, Case{151936, 151669, {1.0f, 0, 0.9f}},
                       Case{151936, 151936, {0.8f, 20, 0.95f}}, Case{1000, 997, {1.0f, 1, 1.0f}},
                       Case{7, 7, {2.0f, 0, 0.3f}}, Case{1025, 1025, {1.0f, 1000, 0.99f}},
                       Case{4096, 4096, {1.0f, 0, 1.0f}}, Case{1025, 1001, {0.0f, 0, 1.0f}},
                       Case{7, 7, {0.0f, 0, 1.0f}}, Case{4099, 4099, {0.0f, 0, 1.0f}},
                       // By temperature alone: fewer ids than blocks, a top-k at or past n_valid,
                       // a high and a low temperature.
                       Case{7, 7, {1.0f, 0, 1.0f}}, Case{1025, 1001, {0.5f, 1001, 1.0f}},
                       Case{300, 300, {3.0f, 0, 1.0f}}, Case{151936, 151669, {0.3f, 0, 1.0f}}}) {
    const ScopedEnv sample_blocks("SLUICE_CUDA_SAMPLE_BLOCKS", blocks);
    SCOPED_TRACE(blocks ? "one block" : "many blocks");
    std::vector<float> logits(static_cast<size_t>(n * c.vocab));
    for (auto& x : logits) x = g(rng);
    // Ties at the top and in the middle: several rows share a value at many ids.
    for (int64_t r = 0; r < n; r += 3)
      for (int64_t i = 0; i < c.n_valid; i += 5) logits[r * c.vocab + i] = 6.0f;
    // Ties at the maximum, far apart (in different blocks of the greedy reduction).
    for (int64_t r = 1; r < n; r += 6)
      for (int64_t i = c.n_valid / 3; i < c.n_valid; i += 997) logits[r * c.vocab + i] = 50.0f;
    std::vector<int64_t> draws(static_cast<size_t>(n));
    for (auto& d : draws) d = static_cast<int64_t>(rng() >> 11) & ((int64_t{1} << 53) - 1);
    Tensor tl = gpu->alloc(DType::f32, {n, c.vocab}), tu = gpu->alloc(DType::i64, {n});
    Tensor ti_all = gpu->alloc(DType::i32, {n + 16});  // sentinels after the n ids
    std::vector<int32_t> init(static_cast<size_t>(n + 16), 7777);
    gpu->from_host(tl, logits.data());
    gpu->from_host(tu, draws.data());
    gpu->from_host(ti_all, init.data());
    gpu->sample(tl, c.n_valid, c.rule, tu, ti_all.slice_rows(0, n));
    std::vector<int32_t> got(static_cast<size_t>(n + 16));
    gpu->to_host(ti_all, got.data());
    for (int64_t j = n; j < n + 16; ++j) EXPECT_EQ(got[j], 7777) << "a write past ids";

    int64_t same = 0;
    SampleScratch sc;
    for (int64_t r = 0; r < n; ++r) {
      const std::span<const float> row = std::span<const float>(logits).subspan(r * c.vocab, c.n_valid);
      const int32_t want = sample_row(row, c.rule, static_cast<double>(draws[r]) * 0x1p-53, sc);
      ASSERT_GE(got[r], 0) << "row " << r;
      ASSERT_LT(got[r], c.n_valid) << "row " << r;
      same += got[r] == want;
      if (c.rule.temperature == 0.0f) {
        EXPECT_EQ(got[r], want) << "greedy, row " << r;
        continue;
      }
      EXPECT_TRUE(sample_kept(row, c.rule, sc)[static_cast<size_t>(got[r])])
          << "vocab " << c.vocab << " row " << r << ": the device drew " << got[r] << ", outside the CPU's kept set";
    }
    // Boundary disagreements need a uniform number within ~1e-6 of a boundary: rare.
    EXPECT_GE(same, n - 2) << "vocab " << c.vocab << " top_k " << c.rule.top_k << " top_p " << c.rule.top_p;
  }
}

TEST(CudaSample, NanRowsAreMinusOneAndOtherRowsAreUntouched) {
  auto gpu = make_cuda_backend(0);
  const int64_t V = 300;
  std::vector<float> logits(2 * V, 0.0f);
  logits[10] = NAN;
  logits[V + 20] = 5.0f;
  logits.resize(3 * V, 1.0f);
  logits[2 * V + 299] = INFINITY;  // in the last slice of the greedy reduction
  std::vector<int64_t> draws = {0, 0, 0};
  Tensor tl = gpu->alloc(DType::f32, {3, V}), tu = gpu->alloc(DType::i64, {3}), ti = gpu->alloc(DType::i32, {3});
  gpu->from_host(tl, logits.data());
  gpu->from_host(tu, draws.data());
  for (const SampleRule rule : {SampleRule{}, SampleRule{1.0f, 5, 0.9f}, SampleRule{1.0f, 0, 1.0f}}) {
    gpu->sample(tl, V, rule, tu, ti);
    std::vector<int32_t> got(3);
    gpu->to_host(ti, got.data());
    EXPECT_EQ(got[0], -1);
    // Temperature alone keeps every id: the draw 0 takes the first (weight e^-5, not 0).
    EXPECT_EQ(got[1], rule.top_k == 0 && rule.temperature > 0.0f ? 0 : 20);
    EXPECT_EQ(got[2], -1);
  }
}

}  // namespace
