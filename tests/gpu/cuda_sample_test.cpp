// Sampling on the device (backends/cuda/sample.cu) against the CPU rule (core/sampling.h):
// greedy exactly; for sampled rows every id the device draws is in the CPU's kept set, and
// the two agree on the token for nearly every uniform number (they differ only where a sum's
// rounding moves a boundary between two tokens: the device adds in a tree, the CPU in order);
// a row with NaN or +inf gives -1; padded ids (>= n_valid) are never drawn; writes stay inside ids.
// Every sampled rule is checked on both paths (many blocks a row, one block), and the draws'
// frequencies against the rule's distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/sample.h"
#include "core/sampling.h"

using namespace sluice;

namespace {

struct Case {
  int64_t vocab, n_valid;
  SampleRule rule;
};

// Backend::sample, or with one_block the one-block kernel of sample.cu, which draws the rows
// past kSampleMaxRows: launch_sample without the many-block kernels' scratch.
void sample(Backend& gpu, const Tensor& logits, int64_t n_valid, const SampleRule& rule, const Tensor& uniform,
            const Tensor& ids, bool one_block) {
  if (!one_block) return gpu.sample(logits, n_valid, rule, uniform, ids);
  cuda::SampleParams p;
  p.logits = logits.ptr<float>();
  p.uniform = uniform.ptr<int64_t>();
  p.ids = ids.ptr<int32_t>();
  p.n = logits.rows();
  p.vocab = logits.cols();
  p.n_valid = n_valid;
  p.temperature = rule.temperature;
  p.top_k = rule.top_k;
  p.top_p = rule.top_p;
  cuda::launch_sample(p, dynamic_cast<CudaBackend&>(gpu).stream());
}

// Each case twice: over many blocks a row (Backend::sample) and in the one-block kernel.
TEST(CudaSample, SameKeptSetsAndNearlyAlwaysTheSameTokenAsTheCpu) {
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 3.0f);
  const int64_t n = 64;  // rows, each its own draw
  for (const bool one_block : {false, true})
  for (const Case c : {Case{151936, 151669, {0.0f, 0, 1.0f}}, Case{151936, 151669, {1.0f, 0, 1.0f}},
                       Case{151936, 151936, {0.7f, 40, 1.0f}}, Case{151936, 151669, {1.0f, 0, 0.9f}},
                       Case{151936, 151936, {0.8f, 20, 0.95f}}, Case{1000, 997, {1.0f, 1, 1.0f}},
                       Case{7, 7, {2.0f, 0, 0.3f}}, Case{1025, 1025, {1.0f, 1000, 0.99f}},
                       Case{4096, 4096, {1.0f, 0, 1.0f}}, Case{1025, 1001, {0.0f, 0, 1.0f}},
                       Case{7, 7, {0.0f, 0, 1.0f}}, Case{4099, 4099, {0.0f, 0, 1.0f}},
                       // By temperature alone: fewer ids than blocks, a top-k at or past n_valid,
                       // a high and a low temperature.
                       Case{7, 7, {1.0f, 0, 1.0f}}, Case{1025, 1001, {0.5f, 1001, 1.0f}},
                       Case{300, 300, {3.0f, 0, 1.0f}}, Case{151936, 151669, {0.3f, 0, 1.0f}},
                       // Top-k and top-p over many blocks: fewer ids than blocks, k of 1 and
                       // n_valid - 1, a top_p below one unit, top-p alone at a high temperature.
                       Case{7, 7, {1.0f, 3, 0.5f}}, Case{1025, 1001, {1.0f, 1000, 1.0f}},
                       Case{151936, 151669, {1.0f, 1, 1.0f}}, Case{4096, 4096, {1.0f, 0, 1e-13f}},
                       Case{151936, 151669, {4.0f, 0, 0.5f}}, Case{151936, 151669, {0.6f, 200, 0.99f}}}) {
    SCOPED_TRACE(one_block ? "one block" : "many blocks");
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
    sample(*gpu, tl, c.n_valid, c.rule, tu, ti_all.slice_rows(0, n), one_block);
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

// The draws' frequencies: n uniform numbers spread evenly over [0, 1) ((i + 1/2) / n), so
// that token j is drawn by as many of them as its share of [0, 1) holds, n p_j to within one
// (and the rounding of the sums the draw walks). p_j is the rule's distribution computed here in
// double from the CPU's kept set: exp((l_j - max) / T) over the kept tokens, normalized. 48
// tokens spread over the vocabulary carry the mass (the rest far below), with ties at the
// top-k and top-p thresholds, so that which of equal tokens are kept (lowest ids first) shows.
TEST(CudaSample, DrawsFollowTheRulesDistribution) {
  auto gpu = make_cuda_backend(0);
  const int64_t V = 8192, n_valid = 8190, rows = 1024, rounds = 4, n = rows * rounds;
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.2f);
  std::vector<float> row(static_cast<size_t>(V), -60.0f);
  std::vector<int64_t> live;
  for (int64_t j = 0; j < 48; ++j) live.push_back(j * 170 + 3);  // over every block's slice
  for (const int64_t id : live) row[id] = g(rng);
  // Ties: four more tokens at the 6th largest value (five tokens there: a top-k of 7 keeps two
  // of them, of 9 four), and two more at the 31st.
  std::vector<int64_t> by_value = live;
  std::sort(by_value.begin(), by_value.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  for (int rank = 20; rank < 24; ++rank) row[by_value[rank]] = row[by_value[5]];
  for (int rank = 36; rank < 38; ++rank) row[by_value[rank]] = row[by_value[30]];
  std::vector<float> logits;
  for (int64_t r = 0; r < rows; ++r) logits.insert(logits.end(), row.begin(), row.end());
  Tensor tl = gpu->alloc(DType::f32, {rows, V}), tu = gpu->alloc(DType::i64, {rows}), ti = gpu->alloc(DType::i32, {rows});
  gpu->from_host(tl, logits.data());
  const std::span<const float> valid = std::span<const float>(row).first(n_valid);
  const float top = *std::max_element(valid.begin(), valid.end());
  for (const bool one_block : {false, true})
  for (const SampleRule rule : {SampleRule{1.0f, 0, 1.0f}, SampleRule{0.7f, 7, 1.0f}, SampleRule{1.0f, 0, 0.8f},
                                SampleRule{0.8f, 20, 0.9f}, SampleRule{1.5f, 9, 1.0f}, SampleRule{2.0f, 0, 0.97f}}) {
    SCOPED_TRACE(std::string(one_block ? "one block" : "many blocks") + ", temperature " + std::to_string(rule.temperature) +
                 ", top_k " + std::to_string(rule.top_k) + ", top_p " + std::to_string(rule.top_p));
    SampleScratch sc;
    const std::vector<uint8_t> kept = sample_kept(valid, rule, sc);
    std::vector<double> p(static_cast<size_t>(n_valid), 0.0);
    double z = 0.0;
    for (int64_t j = 0; j < n_valid; ++j)
      if (kept[j]) z += p[j] = std::exp((static_cast<double>(row[j]) - top) / rule.temperature);
    std::vector<int64_t> count(static_cast<size_t>(n_valid), 0);
    for (int64_t round = 0; round < rounds; ++round) {
      std::vector<int64_t> draws(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r)
        draws[r] = static_cast<int64_t>((static_cast<double>(round * rows + r) + 0.5) / n * 0x1p53);
      gpu->from_host(tu, draws.data());
      sample(*gpu, tl, n_valid, rule, tu, ti, one_block);
      std::vector<int32_t> got(static_cast<size_t>(rows));
      gpu->to_host(ti, got.data());
      for (const int32_t id : got) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, n_valid);
        ++count[id];
      }
    }
    int64_t kept_n = 0;
    for (int64_t j = 0; j < n_valid; ++j) {
      kept_n += kept[j];
      if (!kept[j]) {
        EXPECT_EQ(count[j], 0) << "token " << j << " is outside the kept set";
        continue;
      }
      EXPECT_NEAR(static_cast<double>(count[j]), n * p[j] / z, 2.0) << "token " << j << " (logit " << row[j] << ")";
    }
    EXPECT_GE(kept_n, 1);
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
