// CPU backend op tests: every op against a naive double-precision reference written here, at
// odd sizes, with sentinel guards after (and before) each output to catch out-of-bounds
// writes; plus the reproducibility contract (matmul and attention give the same bits for a
// row whatever the batch size, the thread count or the path; moe_combine adds in rank order).
//
// Tolerance: normalized squared error ||a - b||^2 / ||b||^2 below 1e-10 for the f32 ops.
// An f32 result carries a relative error of about sqrt(terms) * 2^-24 (under 1e-6 for the
// sizes here), which is an NSE near 1e-12; a single wrong, missing or misplaced element
// among the at most 40000 outputs here gives 1e-5 or more. So 1e-10 leaves a 100x margin on
// one side and is still 10^5 times tighter than any indexing bug on the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tests/backends/attention_test_util.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/simd.h"
#include "core/thread_pool.h"

using namespace sluice;
using sluice::test::attention_params;

namespace {

constexpr double kTolF32 = 1e-10;  // see the file comment
constexpr uint32_t kSentinelBits = 0x7fa5a5a5u;  // a NaN payload no kernel produces
constexpr int64_t kGuard = 19;  // guard floats on each side: more than one 8-lane block, odd

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

double nse(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den > 0 ? num / den : num;
}

// An f32 output tensor with sentinel guards on both sides.
struct Guarded {
  std::vector<float> buf;
  Tensor t;
  int64_t n = 0;

  Guarded(std::initializer_list<int64_t> shape, const std::vector<float>* init = nullptr) {
    n = 1;
    for (int64_t d : shape) n *= d;
    buf.assign(static_cast<size_t>(n + 2 * kGuard), std::bit_cast<float>(kSentinelBits));
    if (init) std::memcpy(buf.data() + kGuard, init->data(), static_cast<size_t>(n) * sizeof(float));
    t = Tensor(DType::f32, shape, buf.data() + kGuard);
  }
  std::vector<float> values() const { return {buf.begin() + kGuard, buf.begin() + kGuard + n}; }
  bool guards_intact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (std::bit_cast<uint32_t>(buf[i]) != kSentinelBits ||
          std::bit_cast<uint32_t>(buf[kGuard + n + i]) != kSentinelBits)
        return false;
    return true;
  }
};

// A weight-dtype table [rows, cols] with random values; `exact` holds the values the dtype
// actually stores, so the references measure kernel error only.
struct Weights {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  std::vector<double> exact;
  Tensor t;

  Weights(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) : dtype(dt) {
    std::vector<float> v = random_floats(rng, rows * cols);
    exact.resize(v.size());
    if (dt == DType::f32) {
      f32 = v;
      for (size_t i = 0; i < v.size(); ++i) exact[i] = v[i];
      t = Tensor(dt, {rows, cols}, f32.data());
    } else {
      half.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        half[i] = dt == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        exact[i] = dt == DType::bf16 ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
      }
      t = Tensor(dt, {rows, cols}, half.data());
    }
  }
};

Tensor view(std::vector<float>& v, std::initializer_list<int64_t> shape) { return Tensor(DType::f32, shape, v.data()); }

const DType kWeightDTypes[] = {DType::f32, DType::bf16, DType::f16};

std::vector<double> ref_matmul(const std::vector<float>& x, const std::vector<double>& w, int64_t n, int64_t m,
                               int64_t k) {
  std::vector<double> y(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += static_cast<double>(x[i * k + l]) * w[j * k + l];
      y[i * m + j] = s;
    }
  return y;
}

class CpuOps : public ::testing::Test {
 protected:
  ThreadPool pool1{1};
  ThreadPool pool2{2};
  CpuBackend be1{&pool1};
  CpuBackend be{&pool2};  // two threads: the default for the op tests
  std::mt19937 rng{1234};
};

// ---- memory ----

TEST_F(CpuOps, MemoryAllocCopyFill) {
  Tensor a = be.alloc(DType::f32, {3, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 64, 0u);
  EXPECT_EQ(a.shape_str(), "[3, 5]");
  std::vector<float> src = random_floats(rng, 15), back(15);
  be.from_host(a, src.data());
  be.to_host(a, back.data());
  EXPECT_EQ(src, back);
  Tensor b = be.alloc(DType::f32, {15});
  be.copy(a, b);
  be.to_host(b, back.data());
  EXPECT_EQ(src, back);
  Guarded g({7});
  be.fill(g.t, 2.5f);
  for (float v : g.values()) EXPECT_EQ(v, 2.5f);
  EXPECT_TRUE(g.guards_intact());
  EXPECT_EQ(be.upload(a).data, a.data);  // the CPU backend uses host weights in place
  EXPECT_FALSE(be.alloc(DType::bf16, {0}).empty());
  EXPECT_THROW(be.copy(a, be.alloc(DType::f32, {14})), Error);
  EXPECT_EQ(make_cpu_backend()->name(), "cpu");
}

// ---- matmul ----

TEST_F(CpuOps, MatmulMatchesReference) {
  for (DType dt : kWeightDTypes)
    for (int64_t k : {0, 1, 7, 8, 63, 129})
      for (int64_t m : {1, 5, 33})
        for (int64_t n : {1, 2, 3, 4, 5, 7, 17}) {
          Weights w(dt, m, k, rng);
          std::vector<float> x = random_floats(rng, n * k);
          Guarded y({n, m});
          be.matmul(view(x, {n, k}), w.t, y.t);
          SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n << " m=" << m << " k=" << k);
          EXPECT_LT(nse(y.values(), ref_matmul(x, w.exact, n, m, k)), kTolF32);
          EXPECT_TRUE(y.guards_intact());
        }
}

// Each output element equals cpu::dot of its rows bit for bit, whatever n (decode path for
// n <= 4, blocked path above), the thread count, or the block the row falls in.
TEST_F(CpuOps, MatmulBitwiseIndependentOfBatchAndThreads) {
  for (DType dt : kWeightDTypes)
    for (int64_t k : {7, 129, 2100}) {  // 2100: several column blocks and a k tail
      const int64_t m = 203, n = 70;     // n > 64: two row blocks; m: partial tiles at the end
      Weights w(dt, m, k, rng);
      std::vector<float> x = random_floats(rng, n * k);
      std::vector<float> y_all(static_cast<size_t>(n * m)), y_one(static_cast<size_t>(n * m));
      be.matmul(view(x, {n, k}), w.t, view(y_all, {n, m}));
      std::vector<float> y_t1(static_cast<size_t>(n * m));
      be1.matmul(view(x, {n, k}), w.t, view(y_t1, {n, m}));
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " k=" << k);
      EXPECT_EQ(0, std::memcmp(y_all.data(), y_t1.data(), y_all.size() * sizeof(float))) << "1 vs 2 threads";
      // Rows in batches of 1, 2, 3, 4 (decode path) and 7 (blocked path), two thread counts.
      for (int64_t nb : {1, 2, 3, 4, 7}) {
        for (int64_t i = 0; i < n; i += nb) {
          int64_t cnt = std::min(nb, n - i);
          CpuBackend& b = (i / nb) % 2 ? be1 : be;
          b.matmul(Tensor(DType::f32, {cnt, k}, x.data() + i * k), w.t,
                   Tensor(DType::f32, {cnt, m}, y_one.data() + i * m));
        }
        EXPECT_EQ(0, std::memcmp(y_all.data(), y_one.data(), y_all.size() * sizeof(float))) << "batch " << nb;
      }
      // The canonical dot product, element by element.
      int mismatches = 0;
      for (int64_t i = 0; i < n; i += 13)
        for (int64_t j = 0; j < m; ++j) {
          float d = 0;
          if (dt == DType::f32) d = cpu::dot<DType::f32>(x.data() + i * k, w.f32.data() + j * k, k);
          else if (dt == DType::bf16) d = cpu::dot<DType::bf16>(x.data() + i * k, w.half.data() + j * k, k);
          else d = cpu::dot<DType::f16>(x.data() + i * k, w.half.data() + j * k, k);
          mismatches += std::bit_cast<uint32_t>(d) != std::bit_cast<uint32_t>(y_all[i * m + j]);
        }
      EXPECT_EQ(mismatches, 0);
    }
}

TEST_F(CpuOps, MatmulRejectsBadShapes) {
  std::vector<float> x(12), w(12), y(12);
  EXPECT_THROW(be.matmul(view(x, {3, 4}), view(w, {4, 3}), view(y, {3, 4})), Error);  // k mismatch
  EXPECT_THROW(be.matmul(view(x, {3, 4}), view(w, {3, 4}), view(y, {4, 3})), Error);  // n mismatch
  std::vector<float> w16(16);
  EXPECT_THROW(be.matmul(view(x, {3, 4}), view(w16, {4, 4}), view(x, {3, 4})), Error);  // y aliases x
  try {
    be.matmul(view(x, {3, 4}), view(w, {4, 3}), view(y, {3, 4}));
    ADD_FAILURE() << "k mismatch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::internal);
    EXPECT_NE(std::string(e.what()).find("[4, 3]"), std::string::npos) << e.what();
  }
}

// ---- rms_norm ----

TEST_F(CpuOps, RmsNormMatchesReference) {
  const float eps = 1e-6f;
  for (int64_t rows : {1, 3, 17})
    for (int64_t c : {1, 7, 63, 129})
      for (int variant = 0; variant < 4; ++variant) {  // f32, bf16, f16 weight; no weight
        std::vector<float> x = random_floats(rng, rows * c, -3.0f, 3.0f);
        Weights w(variant < 3 ? kWeightDTypes[variant] : DType::f32, 1, c, rng);
        Tensor wt = variant < 3 ? w.t.reshape({c}) : Tensor();
        Guarded y({rows, c});
        be.rms_norm(view(x, {rows, c}), wt, eps, y.t);
        std::vector<double> want(static_cast<size_t>(rows * c));
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int64_t i = 0; i < c; ++i) ss += static_cast<double>(x[r * c + i]) * x[r * c + i];
          double inv = 1.0 / std::sqrt(ss / c + eps);
          for (int64_t i = 0; i < c; ++i) want[r * c + i] = x[r * c + i] * inv * (variant < 3 ? w.exact[i] : 1.0);
        }
        SCOPED_TRACE(testing::Message() << "rows=" << rows << " c=" << c << " variant=" << variant);
        EXPECT_LT(nse(y.values(), want), kTolF32);
        EXPECT_TRUE(y.guards_intact());
        // In place gives the same bits.
        be.rms_norm(view(x, {rows, c}), wt, eps, view(x, {rows, c}));
        EXPECT_EQ(x, y.values());
      }
}

// ---- rope ----

TEST_F(CpuOps, RopeMatchesReference) {
  const int64_t n = 3, n_head = 5;
  for (bool interleaved : {false, true})
    for (auto [head_dim, rot_dim] : {std::pair<int64_t, int64_t>{8, 8}, {14, 14}, {64, 64}, {70, 22}, {40, 16}, {6, 0}}) {
      std::vector<float> x = random_floats(rng, n * n_head * head_dim);
      std::vector<float> cs(static_cast<size_t>(n * rot_dim / 2)), sn(cs.size());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < rot_dim / 2; ++i) {
          double theta = (7 + t) * std::pow(10000.0, -2.0 * i / std::max<int64_t>(1, rot_dim));
          cs[t * rot_dim / 2 + i] = static_cast<float>(std::cos(theta));
          sn[t * rot_dim / 2 + i] = static_cast<float>(std::sin(theta));
        }
      std::vector<double> want(x.begin(), x.end());
      const int64_t half = rot_dim / 2;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < n_head; ++h) {
          const float* xh = x.data() + (t * n_head + h) * head_dim;
          double* wh = want.data() + (t * n_head + h) * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
            double c = cs[t * half + i], s = sn[t * half + i];
            wh[ia] = xh[ia] * c - static_cast<double>(xh[ib]) * s;
            wh[ib] = xh[ib] * c + static_cast<double>(xh[ia]) * s;
          }
        }
      Guarded g({n, n_head, head_dim}, &x);
      be.rope(g.t, Tensor(DType::f32, {n, half}, cs.data()), Tensor(DType::f32, {n, half}, sn.data()), rot_dim,
              interleaved);
      SCOPED_TRACE(testing::Message() << "interleaved=" << interleaved << " head_dim=" << head_dim
                                      << " rot_dim=" << rot_dim);
      std::vector<float> got = g.values();
      EXPECT_LT(nse(got, want), kTolF32);
      EXPECT_TRUE(g.guards_intact());
      int touched_beyond_rot = 0;  // dims from rot_dim on: untouched, bit for bit
      for (int64_t u = 0; u < n * n_head; ++u)
        for (int64_t i = rot_dim; i < head_dim; ++i)
          touched_beyond_rot += std::bit_cast<uint32_t>(got[u * head_dim + i]) !=
                                std::bit_cast<uint32_t>(x[u * head_dim + i]);
      EXPECT_EQ(touched_beyond_rot, 0);
    }
}

// ---- attention ----

struct AttnCase {
  int64_t n, n_past, n_head, n_kv_head, d, window, n_ctx_extra;
};

// sinks: [n_head] (gpt-oss), or empty: head h's denominator gains exp(sink - max), the max
// taken over the scores and the sink.
std::vector<double> ref_attention(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const AttnCase& c, float scale,
                                  const std::vector<float>& sinks = {}) {
  std::vector<double> out(static_cast<size_t>(c.n * c.n_head * c.d));
  for (int64_t i = 0; i < c.n; ++i)
    for (int64_t h = 0; h < c.n_head; ++h) {
      int64_t g = h / (c.n_head / c.n_kv_head), p = c.n_past + i;
      int64_t j0 = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
      std::vector<double> s;
      double mx = -INFINITY;
      for (int64_t j = j0; j <= p; ++j) {
        double dot = 0;
        for (int64_t l = 0; l < c.d; ++l)
          dot += static_cast<double>(q[(i * c.n_head + h) * c.d + l]) * k[(j * c.n_kv_head + g) * c.d + l];
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      if (!sinks.empty()) mx = std::max(mx, static_cast<double>(sinks[h]));
      double sum = sinks.empty() ? 0.0 : std::exp(sinks[h] - mx);
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t l = 0; l < c.d; ++l) {
        double o = 0;
        for (int64_t j = j0; j <= p; ++j) o += s[j - j0] / sum * v[(j * c.n_kv_head + g) * c.d + l];
        out[(i * c.n_head + h) * c.d + l] = o;
      }
    }
  return out;
}

TEST_F(CpuOps, AttentionMatchesReference) {
  const AttnCase cases[] = {
      {1, 0, 4, 4, 8, 0, 0},    // first token
      {3, 5, 6, 2, 7, 0, 2},    // GQA 3:1, n_past > 0, odd head dim, longer cache than used
      {17, 0, 4, 1, 63, 0, 0},  // multi-query, prefill
      {5, 11, 8, 2, 40, 4, 3},  // sliding window shorter than the context
      {17, 3, 4, 2, 33, 6, 1},  // sliding window inside a prefill
      {2, 30, 2, 1, 128, 100, 0},  // window longer than the context: full causal
  };
  for (const AttnCase& c : cases) {
    int64_t n_ctx = c.n_past + c.n + c.n_ctx_extra;
    std::vector<float> q = random_floats(rng, c.n * c.n_head * c.d, -2.0f, 2.0f);
    std::vector<float> k = random_floats(rng, n_ctx * c.n_kv_head * c.d, -2.0f, 2.0f);
    std::vector<float> v = random_floats(rng, n_ctx * c.n_kv_head * c.d);
    // Positions past n_past + n must be invisible: poison them.
    for (size_t i = static_cast<size_t>((c.n_past + c.n) * c.n_kv_head * c.d); i < k.size(); ++i) k[i] = v[i] = 1e30f;
    AttentionParams params = attention_params(c.n_past, 1.0f / std::sqrt(static_cast<float>(c.d)), c.window);
    Guarded out({c.n, c.n_head, c.d});
    be.attention(view(q, {c.n, c.n_head, c.d}), view(k, {n_ctx, c.n_kv_head, c.d}), view(v, {n_ctx, c.n_kv_head, c.d}),
                 out.t, params);
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " n_past=" << c.n_past << " heads=" << c.n_head << "/"
                                    << c.n_kv_head << " d=" << c.d << " window=" << c.window);
    EXPECT_LT(nse(out.values(), ref_attention(q, k, v, c, params.scale)), kTolF32);
    EXPECT_TRUE(out.guards_intact());
  }
}

// gpt-oss's attention sinks: every case above with a sink per head (small, large enough to
// take most of the mass, and one above every score), against the double reference; sinks of
// -inf change no bit; bf16 sinks are read as their values.
TEST_F(CpuOps, AttentionSinksMatchReference) {
  const AttnCase cases[] = {
      {1, 0, 4, 4, 8, 0, 0}, {3, 5, 6, 2, 7, 0, 2}, {17, 0, 4, 1, 63, 0, 0}, {5, 11, 8, 2, 40, 4, 3}, {17, 3, 4, 2, 33, 6, 1},
  };
  for (const AttnCase& c : cases) {
    const int64_t n_ctx = c.n_past + c.n + c.n_ctx_extra;
    std::vector<float> q = random_floats(rng, c.n * c.n_head * c.d, -2.0f, 2.0f);
    std::vector<float> k = random_floats(rng, n_ctx * c.n_kv_head * c.d, -2.0f, 2.0f);
    std::vector<float> v = random_floats(rng, n_ctx * c.n_kv_head * c.d);
    std::vector<float> sinks = random_floats(rng, c.n_head, -1.0f, 1.0f);
    sinks[0] = 30.0f;  // above every score: the sink is the max
    if (c.n_head > 1) sinks[1] = 3.0f;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " n_past=" << c.n_past << " heads=" << c.n_head << "/"
                                    << c.n_kv_head << " d=" << c.d << " window=" << c.window);
    AttentionParams params = attention_params(c.n_past, scale, c.window, view(sinks, {c.n_head}));
    Guarded out({c.n, c.n_head, c.d});
    const Tensor qt = view(q, {c.n, c.n_head, c.d}), kt = view(k, {n_ctx, c.n_kv_head, c.d}),
                 vt = view(v, {n_ctx, c.n_kv_head, c.d});
    be.attention(qt, kt, vt, out.t, params);
    EXPECT_LT(nse(out.values(), ref_attention(q, k, v, c, scale, sinks)), kTolF32);
    EXPECT_TRUE(out.guards_intact());
    // The sinks change the result (else the comparison above would not test them).
    Guarded plain({c.n, c.n_head, c.d});
    be.attention(qt, kt, vt, plain.t, attention_params(c.n_past, scale, c.window));
    EXPECT_GT(nse(out.values(), ref_attention(q, k, v, c, scale)), 1e-4);
    // -inf sinks: the bits of attention without sinks.
    std::vector<float> none(static_cast<size_t>(c.n_head), -INFINITY);
    Guarded same({c.n, c.n_head, c.d});
    be.attention(qt, kt, vt, same.t, attention_params(c.n_past, scale, c.window, view(none, {c.n_head})));
    EXPECT_EQ(0, std::memcmp(same.values().data(), plain.values().data(), plain.values().size() * sizeof(float)));
    // bf16 sinks: as the f32 sinks of their values.
    std::vector<uint16_t> sinks16(sinks.size());
    std::vector<float> sinks_rounded(sinks.size());
    for (size_t i = 0; i < sinks.size(); ++i) sinks_rounded[i] = bf16_to_f32(sinks16[i] = f32_to_bf16(sinks[i]));
    Guarded a({c.n, c.n_head, c.d}), b({c.n, c.n_head, c.d});
    be.attention(qt, kt, vt, a.t, attention_params(c.n_past, scale, c.window, Tensor(DType::bf16, {c.n_head}, sinks16.data())));
    be.attention(qt, kt, vt, b.t, attention_params(c.n_past, scale, c.window, view(sinks_rounded, {c.n_head})));
    EXPECT_EQ(0, std::memcmp(a.values().data(), b.values().data(), a.values().size() * sizeof(float)));
  }
}

// A bf16 KV cache is read as its exact f32 values: attention over bf16 caches gives the bits
// attention over f32 caches holding the same rounded values gives, for every case above.
TEST_F(CpuOps, AttentionBf16CacheEqualsRoundedF32Bitwise) {
  const AttnCase cases[] = {
      {1, 0, 4, 4, 8, 0, 0}, {3, 5, 6, 2, 7, 0, 2}, {17, 0, 4, 1, 63, 0, 0},
      {5, 11, 8, 2, 40, 4, 3}, {17, 3, 4, 2, 33, 6, 1}, {2, 30, 2, 1, 128, 100, 0},
  };
  for (const AttnCase& c : cases) {
    const int64_t n_ctx = c.n_past + c.n + c.n_ctx_extra, kv_n = n_ctx * c.n_kv_head * c.d;
    std::vector<float> q = random_floats(rng, c.n * c.n_head * c.d, -2.0f, 2.0f);
    std::vector<float> k = random_floats(rng, kv_n, -2.0f, 2.0f), v = random_floats(rng, kv_n);
    std::vector<uint16_t> kb(static_cast<size_t>(kv_n)), vb(static_cast<size_t>(kv_n));
    for (size_t i = 0; i < kb.size(); ++i) {
      kb[i] = f32_to_bf16(k[i]);
      vb[i] = f32_to_bf16(v[i]);
      k[i] = bf16_to_f32(kb[i]);
      v[i] = bf16_to_f32(vb[i]);
    }
    AttentionParams params = attention_params(c.n_past, 1.0f / std::sqrt(static_cast<float>(c.d)), c.window);
    std::vector<float> want(q.size()), got(q.size());
    be.attention(view(q, {c.n, c.n_head, c.d}), view(k, {n_ctx, c.n_kv_head, c.d}), view(v, {n_ctx, c.n_kv_head, c.d}),
                 view(want, {c.n, c.n_head, c.d}), params);
    be.attention(view(q, {c.n, c.n_head, c.d}), Tensor(DType::bf16, {n_ctx, c.n_kv_head, c.d}, kb.data()),
                 Tensor(DType::bf16, {n_ctx, c.n_kv_head, c.d}, vb.data()), view(got, {c.n, c.n_head, c.d}), params);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), q.size() * sizeof(float)))
        << "n=" << c.n << " n_past=" << c.n_past << " heads=" << c.n_head << "/" << c.n_kv_head << " d=" << c.d
        << " window=" << c.window;
  }
}

// attention_inputs into bf16 caches writes each k and v element rounded to nearest even, at
// n_past + i or at the listed positions, and nothing else of the caches.
TEST_F(CpuOps, AttentionInputsIntoBf16Caches) {
  const int64_t n = 3, nh = 4, nkv = 2, d = 16, n_ctx = 9, n_past = 2;
  for (bool at_positions : {false, true}) {
    std::vector<float> q = random_floats(rng, n * nh * d), k = random_floats(rng, n * nkv * d),
                       v = random_floats(rng, n * nkv * d);
    std::vector<float> cos(static_cast<size_t>(n * d / 2), 1.0f), sin(static_cast<size_t>(n * d / 2), 0.0f);
    std::vector<uint16_t> kc(static_cast<size_t>(n_ctx * nkv * d), 0x7777), vc(kc);
    std::vector<int32_t> pos = {6, 1, 4};
    const std::vector<float> k_in = k;
    be.attention_inputs(view(q, {n, nh, d}), view(k, {n, nkv, d}), view(v, {n, nkv, d}), Tensor{}, Tensor{}, 1e-6f,
                        view(cos, {n, d / 2}), view(sin, {n, d / 2}), d, false,
                        Tensor(DType::bf16, {n_ctx, nkv, d}, kc.data()),
                        Tensor(DType::bf16, {n_ctx, nkv, d}, vc.data()),
                        n_past, at_positions ? Tensor(DType::i32, {n}, pos.data()) : Tensor{});
    for (int64_t row = 0; row < n_ctx; ++row) {
      int64_t i = -1;
      for (int64_t t = 0; t < n; ++t)
        if ((at_positions ? pos[static_cast<size_t>(t)] : n_past + t) == row) i = t;
      for (int64_t e = 0; e < nkv * d; ++e) {
        const size_t c = static_cast<size_t>(row * nkv * d + e);
        const uint16_t want_k = i < 0 ? 0x7777 : f32_to_bf16(k[static_cast<size_t>(i * nkv * d + e)]);
        const uint16_t want_v = i < 0 ? 0x7777 : f32_to_bf16(v[static_cast<size_t>(i * nkv * d + e)]);
        ASSERT_EQ(kc[c], want_k) << "row " << row << " element " << e << " positions " << at_positions;
        ASSERT_EQ(vc[c], want_v) << "row " << row << " element " << e << " positions " << at_positions;
      }
    }
    EXPECT_EQ(0, std::memcmp(k.data(), k_in.data(), k.size() * sizeof(float)));  // identity rope, no norm
  }
}

// The backend refuses a KV dtype it cannot hold, in one line.
TEST_F(CpuOps, KvDtypeSettings) {
  EXPECT_EQ(be.kv_dtype(), DType::f32);
  CpuBackend b{&pool1};
  b.set_kv_dtype(DType::bf16);
  EXPECT_EQ(b.kv_dtype(), DType::bf16);
  EXPECT_THROW(b.set_kv_dtype(DType::f16), Error);
}

// The four-key score kernel is the canonical dot product, bit for bit, whatever the length.
TEST_F(CpuOps, Dot4EqualsDot) {
  for (int64_t d : {1, 7, 8, 36, 129}) {
    std::vector<float> q = random_floats(rng, d), k = random_floats(rng, 4 * (d + 3));
    float out[4];
    cpu::dot4(q.data(), k.data(), d + 3, d, out);
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(std::bit_cast<uint32_t>(out[r]),
                std::bit_cast<uint32_t>(cpu::dot<DType::f32>(q.data(), k.data() + r * (d + 3), d)))
          << "d=" << d << " r=" << r;
  }
}

// A batched prefill of n rows gives the same bits as n single-row decode steps.
TEST_F(CpuOps, AttentionPrefillEqualsDecodeBitwise) {
  const int64_t n = 9, n_past = 4, n_head = 6, n_kv = 2, d = 36, n_ctx = n_past + n;
  for (int64_t window : {0, 5}) {
    std::vector<float> q = random_floats(rng, n * n_head * d), k = random_floats(rng, n_ctx * n_kv * d),
                       v = random_floats(rng, n_ctx * n_kv * d);
    std::vector<float> batched(q.size()), stepped(q.size());
    AttentionParams params = attention_params(n_past, 0.125f, window);
    be.attention(view(q, {n, n_head, d}), view(k, {n_ctx, n_kv, d}), view(v, {n_ctx, n_kv, d}),
                 view(batched, {n, n_head, d}), params);
    for (int64_t i = 0; i < n; ++i) {
      AttentionParams p = params;
      p.n_past = n_past + i;
      (i % 2 ? be1 : be).attention(Tensor(DType::f32, {1, n_head, d}, q.data() + i * n_head * d),
                                   view(k, {n_past + i + 1, n_kv, d}), view(v, {n_past + i + 1, n_kv, d}),
                                   Tensor(DType::f32, {1, n_head, d}, stepped.data() + i * n_head * d), p);
    }
    EXPECT_EQ(0, std::memcmp(batched.data(), stepped.data(), q.size() * sizeof(float))) << "window " << window;
  }
}

// ---- elementwise ----

TEST_F(CpuOps, Exp8Accuracy) {
  // Relative error within 4 ulp (2^-21) over the whole finite range, and the edges.
  double worst = 0;
  for (float x = -103.0f; x < 88.7f; x += 0.0137f) {
    alignas(32) float in[8], out[8];
    for (int l = 0; l < 8; ++l) in[l] = x + l * 0.0013f;
    _mm256_store_ps(out, cpu::exp8(_mm256_load_ps(in)));
    for (int l = 0; l < 8; ++l) {
      double want = std::exp(static_cast<double>(in[l]));
      if (want < 1.2e-38 || want > 3.4e38) continue;  // subnormal or overflowing results: below
      worst = std::max(worst, std::fabs(out[l] - want) / want);
    }
  }
  EXPECT_LT(worst, std::ldexp(1.0, -21));
  alignas(32) float in[8] = {-INFINITY, INFINITY, NAN, -200.0f, 200.0f, 0.0f, -100.0f, 88.7f}, out[8];
  _mm256_store_ps(out, cpu::exp8(_mm256_load_ps(in)));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], INFINITY);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], INFINITY);
  EXPECT_EQ(out[5], 1.0f);
  EXPECT_NEAR(out[6], std::exp(-100.0), std::ldexp(1.0, -149));  // subnormal: within one step
  EXPECT_NEAR(out[7] / std::exp(static_cast<double>(in[7])), 1.0, std::ldexp(1.0, -21));
}

TEST_F(CpuOps, SwigluMatchesReference) {
  for (int64_t numel : {1, 7, 63, 387, 40000}) {  // 40000: split across threads
    std::vector<float> g = random_floats(rng, numel, -10.0f, 10.0f), u = random_floats(rng, numel);
    if (numel > 4) g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f, g[3] = -90.0f;
    std::vector<double> want(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i) want[i] = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    Guarded out({numel});
    be.swiglu(view(g, {numel}), view(u, {numel}), out.t);
    SCOPED_TRACE(numel);
    EXPECT_LT(nse(out.values(), want), kTolF32);
    EXPECT_TRUE(out.guards_intact());
    for (float v : out.values()) EXPECT_TRUE(std::isfinite(v));
    be.swiglu(view(g, {numel}), view(u, {numel}), view(g, {numel}));  // out aliases gate
    EXPECT_EQ(g, out.values());
  }
}

// gpt-oss's clamped SwiGLU against a double reference: values on both sides of the limit,
// exactly at it, huge ones, and NaN (which stays NaN).
TEST_F(CpuOps, SwigluClampedMatchesReference) {
  const float alpha = 1.702f, limit = 7.0f;
  for (int64_t numel : {1, 7, 63, 387, 40000}) {
    std::vector<float> g = random_floats(rng, numel, -12.0f, 12.0f), u = random_floats(rng, numel, -12.0f, 12.0f);
    if (numel > 6) g[0] = 7.0f, u[0] = -7.0f, g[1] = 1e30f, u[1] = -1e30f, g[2] = -200.0f, g[3] = 6.999f, u[4] = 7.001f;
    std::vector<double> want(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i) {
      const double gc = std::min<double>(g[i], limit), uc = std::clamp<double>(u[i], -limit, limit);
      want[i] = (uc + 1.0) * (gc / (1.0 + std::exp(-alpha * gc)));
    }
    Guarded out({numel});
    be.swiglu_clamped(view(g, {numel}), view(u, {numel}), out.t, alpha, limit);
    SCOPED_TRACE(numel);
    EXPECT_LT(nse(out.values(), want), kTolF32);
    EXPECT_TRUE(out.guards_intact());
    be.swiglu_clamped(view(g, {numel}), view(u, {numel}), view(u, {numel}), alpha, limit);  // out aliases up
    EXPECT_EQ(u, out.values());
  }
  std::vector<float> g = {NAN, 1.0f, 2.0f}, u = {1.0f, NAN, 50.0f}, out(3);
  be.swiglu_clamped(view(g, {3}), view(u, {3}), view(out, {3}), alpha, limit);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_FLOAT_EQ(out[2], 8.0f * (2.0f / (1.0f + std::exp(-alpha * 2.0f))));
}

TEST_F(CpuOps, AddAndAddBias) {
  for (int64_t rows : {1, 3, 17})
    for (int64_t c : {1, 7, 63, 129}) {
      std::vector<float> x = random_floats(rng, rows * c), y = random_floats(rng, rows * c);
      Guarded gx({rows, c}, &x);
      be.add(gx.t, view(y, {rows, c}));
      std::vector<float> got = gx.values();
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], x[i] + y[i]);  // one rounding: exact
      EXPECT_TRUE(gx.guards_intact());
      for (DType dt : kWeightDTypes) {
        Weights b(dt, 1, c, rng);
        Guarded gy({rows, c}, &x);
        be.add_bias(gy.t, b.t.reshape({c}));
        std::vector<float> got_b = gy.values();
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < c; ++i)
            ASSERT_EQ(got_b[r * c + i], x[r * c + i] + static_cast<float>(b.exact[i])) << dtype_name(dt);
        EXPECT_TRUE(gy.guards_intact());
      }
    }
  std::vector<float> a(6), b(5);
  EXPECT_THROW(be.add(view(a, {6}), view(b, {5})), Error);
}

// ---- rows ----

TEST_F(CpuOps, GetRowsAllDTypes) {
  for (DType dt : kWeightDTypes)
    for (int64_t c : {1, 7, 63, 129}) {
      const int64_t n_rows = 11;
      Weights table(dt, n_rows, c, rng);
      std::vector<int32_t> ids = {3, 0, 10, 3, 7};
      Guarded out({static_cast<int64_t>(ids.size()), c});
      be.get_rows(table.t, ids, out.t);
      std::vector<float> got = out.values();
      for (size_t i = 0; i < ids.size(); ++i)
        for (int64_t l = 0; l < c; ++l)
          ASSERT_EQ(got[i * c + l], static_cast<float>(table.exact[ids[i] * c + l])) << dtype_name(dt);
      EXPECT_TRUE(out.guards_intact());
      std::vector<int32_t> bad = {0, 11};
      try {
        be.get_rows(table.t, bad, Tensor(DType::f32, {2, c}, got.data()));
        ADD_FAILURE() << "id 11 of 11 rows accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::invalid_argument);
      }
    }
}

TEST_F(CpuOps, GatherAndScatterRows) {
  const int64_t rows = 9, c = 13;
  std::vector<float> src = random_floats(rng, rows * c);
  std::vector<int32_t> idx = {8, 2, 2, 0};
  Guarded gathered({4, c});
  be.gather_rows(view(src, {rows, c}), idx, gathered.t);
  std::vector<float> got = gathered.values();
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t l = 0; l < c; ++l) ASSERT_EQ(got[i * c + l], src[idx[i] * c + l]);
  EXPECT_TRUE(gathered.guards_intact());

  std::vector<float> dst0 = random_floats(rng, rows * c);
  Guarded dst({rows, c}, &dst0);
  std::vector<int32_t> sidx = {4, 1, 7, 4};  // 4 twice: the last write wins
  std::vector<float> rows4 = random_floats(rng, 4 * c);
  be.scatter_rows(view(rows4, {4, c}), sidx, dst.t);
  std::vector<float> want = dst0;
  for (size_t i = 0; i < sidx.size(); ++i)
    std::memcpy(want.data() + sidx[i] * c, rows4.data() + i * c, c * sizeof(float));
  EXPECT_EQ(dst.values(), want);
  EXPECT_TRUE(dst.guards_intact());
  std::vector<int32_t> bad = {9};
  EXPECT_THROW(be.gather_rows(view(src, {rows, c}), bad, Tensor(DType::f32, {1, c}, got.data())), Error);
}

// moe_combine: acc = +0; acc = fma(w[t*k + r], e[t*k + r], acc) for r = 0..k-1, exactly.
TEST_F(CpuOps, MoeCombineRankOrder) {
  for (int64_t c : {1, 7, 63, 129})
    for (int64_t k : {1, 2, 8}) {
      const int64_t n = 5;
      std::vector<float> e = random_floats(rng, n * k * c, -4.0f, 4.0f);
      std::vector<float> w = random_floats(rng, n * k, 0.0f, 1.0f);
      Guarded out({n, c});
      be.moe_combine(view(e, {n * k, c}), w, k, out.t);
      std::vector<float> got = out.values();
      std::vector<double> want(static_cast<size_t>(n * c));
      int not_exact = 0;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t l = 0; l < c; ++l) {
          float acc = 0.0f;
          double ref = 0;
          for (int64_t r = 0; r < k; ++r) {
            acc = std::fma(w[t * k + r], e[(t * k + r) * c + l], acc);
            ref += static_cast<double>(w[t * k + r]) * e[(t * k + r) * c + l];
          }
          not_exact += std::bit_cast<uint32_t>(acc) != std::bit_cast<uint32_t>(got[t * c + l]);
          want[t * c + l] = ref;
        }
      SCOPED_TRACE(testing::Message() << "c=" << c << " k=" << k);
      EXPECT_EQ(not_exact, 0);
      EXPECT_LT(nse(got, want), kTolF32);
      EXPECT_TRUE(out.guards_intact());
    }
  // Order is observable: 1e8 - 1e8 + 1 = 1 in rank order, while any order that adds the 1
  // before one of the big terms loses it (1e8 + 1 rounds to 1e8).
  std::vector<float> e = {1e8f, -1e8f, 1.0f, 1.0f, 1e8f, -1e8f};
  std::vector<float> w = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> out(2);
  be.moe_combine(view(e, {6, 1}), w, 3, view(out, {2, 1}));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 0.0f);
}

}  // namespace
