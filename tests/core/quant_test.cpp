// Quantized kinds (core/quant.h): golden bit layouts, error bounds of the quantizers, round
// half to even, partial last groups, refusal of non-finite rows; and the CPU matmul with
// quantized weights against a double reference over the dequantized weights, at odd sizes
// with sentinel guards, bit for bit equal to the f32 matmul of the dequantized weights
// whatever the batch size or thread count.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/quant.h"
#include "core/thread_pool.h"

using namespace sluice;

namespace {

constexpr DType kQuantDTypes[] = {DType::q8, DType::q4, DType::q2, DType::mxfp4};
constexpr uint32_t kSentinelBits = 0x7fa5a5a5u;
constexpr int64_t kGuard = 19;

// A quantized [rows, cols] weight with its bytes and the dequantized f32 values.
struct QWeight {
  DType dtype;
  int64_t rows, cols;
  std::vector<uint8_t> data, scales;
  std::vector<float> deq;  // dequantize_row of every row
  Tensor t;

  QWeight(DType dt, int64_t r, int64_t c, const std::vector<float>& w) : dtype(dt), rows(r), cols(c) {
    // Guard bytes after both buffers catch reads past the last row.
    data.assign(static_cast<size_t>(r * quant_row_bytes(dt, c) + 64), 0xEE);
    scales.assign(static_cast<size_t>(r * quant_scale_row_bytes(dt, c) + 64), 0xEE);
    deq.resize(static_cast<size_t>(r * c));
    for (int64_t i = 0; i < r; ++i) {
      EXPECT_TRUE(quantize_row(dt, w.data() + i * c, c, data.data() + i * quant_row_bytes(dt, c),
                               scales.data() + i * quant_scale_row_bytes(dt, c)));
      dequantize_row(dt, data.data() + i * quant_row_bytes(dt, c), scales.data() + i * quant_scale_row_bytes(dt, c), c,
                     deq.data() + i * c);
    }
    t = Tensor(dt, {r, c}, data.data());
    t.scales = scales.data();
  }
};

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

uint16_t f16_at(const std::vector<uint8_t>& b, size_t off) {
  uint16_t h;
  std::memcpy(&h, b.data() + off, 2);
  return h;
}

// ---- layouts ----

TEST(Quant, Q8GoldenLayoutAndRounding) {
  // absmax 127 gives scale 1 exactly; halves round to even.
  std::vector<float> w = {127.0f, -127.0f, 2.5f, 3.5f, -2.5f, 0.49f, 0.0f};
  std::vector<uint8_t> data(7), scales(4);
  ASSERT_TRUE(quantize_row(DType::q8, w.data(), 7, data.data(), scales.data()));
  float scale;
  std::memcpy(&scale, scales.data(), 4);
  EXPECT_EQ(scale, 1.0f);
  std::vector<int8_t> q(7);
  std::memcpy(q.data(), data.data(), 7);
  EXPECT_EQ(q, (std::vector<int8_t>{127, -127, 2, 4, -2, 0, 0}));
  std::vector<float> back(7);
  dequantize_row(DType::q8, data.data(), scales.data(), 7, back.data());
  EXPECT_EQ(back, (std::vector<float>{127, -127, 2, 4, -2, 0, 0}));
}

TEST(Quant, Q4GoldenLayout) {
  // Group of 32: the largest magnitude is -8 (element 1), so d = -8 / -8 = 1 and q = w + 8.
  std::vector<float> w(32, 0.0f);
  w[0] = 1.0f;
  w[1] = -8.0f;
  w[2] = 7.0f;
  w[3] = 2.5f;   // tie: rne(2.5) = 2 -> q 10
  w[31] = -3.0f;
  std::vector<uint8_t> data(16), scales(2);
  ASSERT_TRUE(quantize_row(DType::q4, w.data(), 32, data.data(), scales.data()));
  EXPECT_EQ(f16_to_f32(f16_at(scales, 0)), 1.0f);
  EXPECT_EQ(data[0], 9 | (0 << 4));   // elements 0 (low nibble) and 1 (high nibble)
  EXPECT_EQ(data[1], 15 | (10 << 4));  // elements 2 and 3
  EXPECT_EQ(data[2], 8 | (8 << 4));    // zeros
  EXPECT_EQ(data[15], 8 | (5 << 4));   // elements 30 and 31
  // A positive extreme: d = 4 / -8 = -0.5; 4 -> q 0, -3.5 -> 15.
  std::vector<float> v(32, 0.0f);
  v[0] = 4.0f;
  v[1] = -3.5f;
  ASSERT_TRUE(quantize_row(DType::q4, v.data(), 32, data.data(), scales.data()));
  EXPECT_EQ(f16_to_f32(f16_at(scales, 0)), -0.5f);
  EXPECT_EQ(data[0], 0 | (15 << 4));
  std::vector<float> back(32);
  dequantize_row(DType::q4, data.data(), scales.data(), 32, back.data());
  EXPECT_EQ(back[0], 4.0f);
  EXPECT_EQ(back[1], -3.5f);
  EXPECT_EQ(back[2], 0.0f);
}

TEST(Quant, Q2GoldenLayout) {
  // min -1, max 2: scale 1, q = w + 1; bytes hold elements 4j..4j+3 from bit 0 up.
  std::vector<float> w = {-1, 0, 1, 2, 2, 1, 0, -1, 0.5f, 1.5f, -1, -1, -1, -1, -1, 2};
  std::vector<uint8_t> data(4), scales(4);
  ASSERT_TRUE(quantize_row(DType::q2, w.data(), 16, data.data(), scales.data()));
  EXPECT_EQ(f16_to_f32(f16_at(scales, 0)), 1.0f);   // scale
  EXPECT_EQ(f16_to_f32(f16_at(scales, 2)), -1.0f);  // min
  EXPECT_EQ(data[0], 0 | (1 << 2) | (2 << 4) | (3 << 6));
  EXPECT_EQ(data[1], 3 | (2 << 2) | (1 << 4) | (0 << 6));
  EXPECT_EQ(data[2], 2 | (2 << 2) | (0 << 4) | (0 << 6));  // 0.5 + 1 = 1.5 -> 2, 1.5 + 1 = 2.5 -> 2 (ties to even)
  EXPECT_EQ(data[3], 0 | (0 << 2) | (0 << 4) | (3 << 6));
}

// mxfp4 (gpt-oss's layout): every code's value at scale exponents 127, 130 and 0, the NaN
// exponent; a group whose values lie on the e2m1 grid times 8 comes back exactly, codes in
// nibble order; the ties of the grid go to the even magnitude index, beyond 6 saturates,
// -0 keeps its sign bit.
TEST(Quant, Mxfp4GoldenLayoutAndRounding) {
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  std::vector<uint8_t> data(16), scales(1);
  for (int j = 0; j < 16; ++j) data[j] = static_cast<uint8_t>(j | ((15 - j) << 4));  // codes j, 15 - j
  std::vector<float> back(32);
  for (int s : {127, 130, 0}) {
    scales[0] = static_cast<uint8_t>(s);
    dequantize_row(DType::mxfp4, data.data(), scales.data(), 32, back.data());
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(back[2 * j], std::ldexp(e2m1[j], s - 127)) << "s " << s << " code " << j;
      EXPECT_EQ(back[2 * j + 1], std::ldexp(e2m1[15 - j], s - 127)) << "s " << s << " code " << 15 - j;
    }
    EXPECT_EQ(std::signbit(back[16]), true);  // code 8: -0
  }
  scales[0] = 255;
  dequantize_row(DType::mxfp4, data.data(), scales.data(), 32, back.data());
  EXPECT_TRUE(std::isnan(back[3]));

  // On the grid times 8: amax 48 = 1.5 * 2^5, so s = 5 - 2 + 127 = 130 and w / 8 are codes.
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[i] = 8 * e2m1[i % 16];
  std::vector<uint8_t> q(16), sc(1);
  ASSERT_TRUE(quantize_row(DType::mxfp4, w.data(), 32, q.data(), sc.data()));
  EXPECT_EQ(sc[0], 130);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q[j], ((2 * j) % 16) | (((2 * j + 1) % 16) << 4)) << j;
  dequantize_row(DType::mxfp4, q.data(), sc.data(), 32, back.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(back[i], w[i]) << i;

  // Ties and saturation at scale 1 (amax 7: floor(log2 7) = 2, s = 127).
  const std::vector<std::pair<float, int>> cases = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4},
                                                    {3.5f, 6},  {5.0f, 6},  {7.0f, 7},  {-2.5f, 12}, {-0.0f, 8},
                                                    {0.3f, 1},  {5.1f, 7}};
  std::vector<float> t(32, 0.0f);
  for (size_t i = 0; i < cases.size(); ++i) t[i] = cases[i].first;
  ASSERT_TRUE(quantize_row(DType::mxfp4, t.data(), 32, q.data(), sc.data()));
  EXPECT_EQ(sc[0], 127);
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ((q[i / 2] >> (4 * (i % 2))) & 15, cases[i].second) << "w " << cases[i].first;
}

// The last group of a row may be partial: its missing elements are stored as zero bits,
// and nothing past the row's bytes is written.
TEST(Quant, PartialLastGroupsArePaddedWithZeroBits) {
  std::mt19937 rng(3);
  for (DType dt : {DType::q4, DType::q2, DType::mxfp4})
    for (int64_t cols : {1, 7, 24, 33, 40, 48}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " cols=" << cols);
      std::vector<float> w = random_floats(rng, cols, 0.1f, 1.0f);  // positive: no q is 0 in a full slot for q4
      std::vector<uint8_t> data(static_cast<size_t>(quant_row_bytes(dt, cols)) + 8, 0xEE);
      std::vector<uint8_t> scales(static_cast<size_t>(quant_scale_row_bytes(dt, cols)) + 8, 0xEE);
      ASSERT_TRUE(quantize_row(dt, w.data(), cols, data.data(), scales.data()));
      const int bits = dt == DType::q2 ? 2 : 4;
      const int64_t n_slots = quant_row_bytes(dt, cols) * 8 / bits;
      for (int64_t i = cols; i < n_slots; ++i)
        EXPECT_EQ((data[static_cast<size_t>(i * bits / 8)] >> (i * bits % 8)) & ((1 << bits) - 1), 0) << "slot " << i;
      for (size_t i = static_cast<size_t>(quant_row_bytes(dt, cols)); i < data.size(); ++i) EXPECT_EQ(data[i], 0xEE);
      for (size_t i = static_cast<size_t>(quant_scale_row_bytes(dt, cols)); i < scales.size(); ++i) EXPECT_EQ(scales[i], 0xEE);
      std::vector<float> back(static_cast<size_t>(cols) + 8, 12345.0f);
      dequantize_row(dt, data.data(), scales.data(), cols, back.data());
      for (size_t i = static_cast<size_t>(cols); i < back.size(); ++i) EXPECT_EQ(back[i], 12345.0f);
    }
}

// ---- error bounds ----

// Per element: q8 within half a step (absmax / 254); q4 within half a step |d| / 2, except
// the far end opposite the extreme, which may clamp by one more step; q2 within half a
// step plus the f16 rounding of min and scale.
TEST(Quant, ErrorWithinHalfAStep) {
  std::mt19937 rng(11);
  for (int64_t cols : {16, 32, 40, 100, 4096}) {
    std::vector<float> w = random_floats(rng, cols, -0.3f, 0.3f);
    w[0] = 0.05f;
    for (DType dt : kQuantDTypes) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " cols=" << cols);
      QWeight q(dt, 1, cols, w);
      const int64_t group = dt == DType::q4 ? kQ4Group : dt == DType::q2 ? kQ2Group : dt == DType::mxfp4 ? kMxfp4Group : cols;
      for (int64_t g0 = 0; g0 < cols; g0 += group) {
        const int64_t g1 = std::min(cols, g0 + group);
        float lo = w[g0], hi = w[g0], amax = 0;
        for (int64_t i = g0; i < g1; ++i) {
          lo = std::min(lo, w[i]);
          hi = std::max(hi, w[i]);
          amax = std::max(amax, std::fabs(w[i]));
        }
        // mxfp4: the grid's widest step is 2 x 2^(floor(log2 amax) - 2) (between 4 and 6 units),
        // half of it, or the saturation of values in (6, 8) units: at most 2^(floor(log2 amax) - 1).
        const double mx_bound = amax > 0 ? std::ldexp(1.0, std::ilogb(amax) - 1) : 0.0;
        double bound = dt == DType::q8 ? amax / 254.0 * 1.0001 : dt == DType::q4 ? amax / 8.0 * 1.001 : dt == DType::mxfp4 ? mx_bound : (hi - lo) / 6.0 * 1.01 + 1e-3 * std::max(std::fabs(lo), std::fabs(hi));
        for (int64_t i = g0; i < g1; ++i) EXPECT_LE(std::fabs(q.deq[i] - w[i]), bound) << "element " << i;
      }
    }
  }
}

TEST(Quant, DeterministicAndRejectsNonFinite) {
  std::mt19937 rng(5);
  std::vector<float> w = random_floats(rng, 77);
  for (DType dt : kQuantDTypes) {
    QWeight a(dt, 1, 77, w), b(dt, 1, 77, w);
    EXPECT_EQ(a.data, b.data);
    EXPECT_EQ(a.scales, b.scales);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> v = w;
      v[40] = bad;
      std::vector<uint8_t> data(static_cast<size_t>(quant_row_bytes(dt, 77))), scales(static_cast<size_t>(quant_scale_row_bytes(dt, 77)));
      EXPECT_FALSE(quantize_row(dt, v.data(), 77, data.data(), scales.data())) << dtype_name(dt);
    }
  }
  // A q4 scale that overflows f16: |w| / 8 > 65504.
  std::vector<float> huge(32, 1e6f);
  std::vector<uint8_t> data(16), scales(2);
  EXPECT_FALSE(quantize_row(DType::q4, huge.data(), 32, data.data(), scales.data()));
  // All zeros: scale 0, values 0.
  std::vector<float> zeros(40, 0.0f), back(40, 1.0f);
  for (DType dt : kQuantDTypes) {
    QWeight z(dt, 1, 40, zeros);
    for (float v : z.deq) EXPECT_EQ(v, 0.0f) << dtype_name(dt);
  }
}

// ---- matmul ----

std::vector<double> ref_matmul(const std::vector<float>& x, const std::vector<float>& w, int64_t n, int64_t m, int64_t k) {
  std::vector<double> y(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += static_cast<double>(x[i * k + l]) * w[j * k + l];
      y[i * m + j] = s;
    }
  return y;
}

double nse(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den > 0 ? num / den : num;
}

class QuantMatmul : public ::testing::Test {
 protected:
  ThreadPool pool1{1};
  ThreadPool pool2{2};
  CpuBackend be1{&pool1};
  CpuBackend be{&pool2};
  std::mt19937 rng{99};
};

// Against a double reference over the dequantized weights (so only the kernel's f32
// rounding is measured: the same 1e-10 normalized squared error as the f32 op tests), with
// sentinels on both sides of y. k covers partial groups (24, 40, 48 occur in the fixtures).
TEST_F(QuantMatmul, MatchesReferenceAtOddSizes) {
  for (DType dt : kQuantDTypes)
    for (int64_t k : {1, 7, 16, 24, 40, 48, 63, 129})
      for (int64_t m : {1, 5, 33})
        for (int64_t n : {1, 2, 3, 4, 5, 7, 17, 70}) {
          SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n << " m=" << m << " k=" << k);
          QWeight w(dt, m, k, random_floats(rng, m * k));
          std::vector<float> x = random_floats(rng, n * k);
          std::vector<float> buf(static_cast<size_t>(n * m + 2 * kGuard), std::bit_cast<float>(kSentinelBits));
          be.matmul(Tensor(DType::f32, {n, k}, x.data()), w.t, Tensor(DType::f32, {n, m}, buf.data() + kGuard));
          std::vector<float> y(buf.begin() + kGuard, buf.begin() + kGuard + n * m);
          EXPECT_LT(nse(y, ref_matmul(x, w.deq, n, m, k)), 1e-10);
          for (int64_t i = 0; i < kGuard; ++i) {
            EXPECT_EQ(std::bit_cast<uint32_t>(buf[i]), kSentinelBits);
            EXPECT_EQ(std::bit_cast<uint32_t>(buf[kGuard + n * m + i]), kSentinelBits);
          }
        }
}

// The result of a row equals the f32 matmul over the dequantized weights bit for bit,
// whatever the batch size (1..4, 7, all) or thread count: the reproducibility contract, and
// why a checkpoint holding the dequantized values reproduces a pack run exactly.
TEST_F(QuantMatmul, BitwiseEqualToF32OverDequantizedWeights) {
  for (DType dt : kQuantDTypes)
    for (int64_t k : {40, 129, 2100}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " k=" << k);
      const int64_t m = 203, n = 70;
      QWeight w(dt, m, k, random_floats(rng, m * k));
      Tensor wf(DType::f32, {m, k}, w.deq.data());
      std::vector<float> x = random_floats(rng, n * k);
      std::vector<float> want(static_cast<size_t>(n * m)), got(static_cast<size_t>(n * m));
      be.matmul(Tensor(DType::f32, {n, k}, x.data()), wf, Tensor(DType::f32, {n, m}, want.data()));
      be1.matmul(Tensor(DType::f32, {n, k}, x.data()), w.t, Tensor(DType::f32, {n, m}, got.data()));
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << "all rows, 1 thread";
      for (int64_t nb : {1, 2, 3, 4, 7}) {
        std::fill(got.begin(), got.end(), 0.0f);
        for (int64_t i = 0; i < n; i += nb) {
          const int64_t cnt = std::min(nb, n - i);
          CpuBackend& b = (i / nb) % 2 ? be1 : be;
          Tensor xi(DType::f32, {cnt, k}, x.data() + i * k), yi(DType::f32, {cnt, m}, got.data() + i * m);
          b.matmul(xi, w.t, yi);
        }
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << "batch " << nb;
      }
    }
}

TEST_F(QuantMatmul, RejectsBadShapesAndMissingScales) {
  QWeight w(DType::q4, 8, 40, random_floats(rng, 8 * 40));
  std::vector<float> x(3 * 40), y(3 * 8);
  EXPECT_THROW(be.matmul(Tensor(DType::f32, {3, 41}, x.data()), w.t, Tensor(DType::f32, {3, 8}, y.data())), Error);
  EXPECT_THROW(be.matmul(Tensor(DType::f32, {3, 40}, x.data()), w.t, Tensor(DType::f32, {3, 7}, y.data())), Error);
  Tensor no_scales = w.t;
  no_scales.scales = nullptr;
  EXPECT_THROW(be.matmul(Tensor(DType::f32, {3, 40}, x.data()), no_scales, Tensor(DType::f32, {3, 8}, y.data())), Error);
}

}  // namespace
