// CPU op tests for the hybrid families' ops (backend.h, "hybrid families"): each against a
// naive double-precision reference written here, at odd sizes, with sentinel guards around
// the outputs; plus the properties the model code relies on: the gated delta rule's chunked
// and recurrent forms agree (and agree when split across calls through the state), the conv
// carries its state exactly, and QSA's selection and indexed attention are what they claim.
//
// Tolerance: normalized squared error below 1e-10 for single-pass f32 ops (see
// cpu_ops_test.cpp for the reasoning). The delta rule chains ~n sequential updates and the
// chunked form a triangular solve: 1e-9 there.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/thread_pool.h"

using namespace sluice;

namespace {

constexpr double kTol = 1e-10;
constexpr double kTolDelta = 1e-9;
constexpr uint32_t kSentinelBits = 0x7fa5a5a5u;
constexpr int64_t kGuard = 19;

std::vector<float> rnd(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
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

double nse(const std::vector<float>& got, const std::vector<float>& want) {
  return nse(got, std::vector<double>(want.begin(), want.end()));
}

// An f32 output with sentinel guards on both sides (optionally initialized).
struct Guarded {
  std::vector<float> buf;
  Tensor t;
  int64_t n = 1;
  Guarded(std::initializer_list<int64_t> shape, const std::vector<float>* init = nullptr) {
    for (int64_t d : shape) n *= d;
    buf.assign(static_cast<size_t>(n + 2 * kGuard), std::bit_cast<float>(kSentinelBits));
    if (init) std::memcpy(buf.data() + kGuard, init->data(), static_cast<size_t>(n) * sizeof(float));
    t = Tensor(DType::f32, shape, buf.data() + kGuard);
  }
  std::vector<float> values() const { return {buf.begin() + kGuard, buf.begin() + kGuard + n}; }
  bool intact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (std::bit_cast<uint32_t>(buf[i]) != kSentinelBits || std::bit_cast<uint32_t>(buf[kGuard + n + i]) != kSentinelBits)
        return false;
    return true;
  }
};

Tensor view(std::vector<float>& v, std::initializer_list<int64_t> shape) { return Tensor(DType::f32, shape, v.data()); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

class HybridOps : public ::testing::Test {
 protected:
  ThreadPool pool1{1};
  ThreadPool pool2{2};
  CpuBackend be1{&pool1};
  CpuBackend be{&pool2};
  std::mt19937 rng{4321};
};

TEST_F(HybridOps, CopyColsMovesExactlyTheRange) {
  const int64_t rows = 7, sc = 13, dc = 11;
  std::vector<float> src = rnd(rng, rows * sc), init = rnd(rng, rows * dc);
  Guarded dst({rows, dc}, &init);
  be.copy_cols(view(src, {rows, sc}), 3, dst.t, 2, 5);
  std::vector<float> got = dst.values();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dc; ++c)
      EXPECT_EQ(got[r * dc + c], c >= 2 && c < 7 ? src[r * sc + 3 + c - 2] : init[r * dc + c]);
  EXPECT_TRUE(dst.intact());
  EXPECT_THROW(be.copy_cols(view(src, {rows, sc}), 10, dst.t, 0, 5), Error);
}

TEST_F(HybridOps, ActivateAndMulMatchReference) {
  for (int64_t n : {1, 7, 8, 37}) {
    for (Activation act : {Activation::sigmoid, Activation::silu}) {
      std::vector<float> x = rnd(rng, n, -6, 6);
      Guarded y({n}, &x);
      be.activate(y.t, act, 3.0f, 2.0f);
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i) {
        double v = static_cast<double>(x[i]) / 3.0;
        want[i] = 2.0 * (act == Activation::sigmoid ? sigmoid(v) : v * sigmoid(v));
      }
      EXPECT_LT(nse(y.values(), want), kTol) << n;
      EXPECT_TRUE(y.intact());
    }
    std::vector<float> a = rnd(rng, n * 3), b = rnd(rng, n * 3), s = rnd(rng, n);
    Guarded x({n, 3}, &a);
    be.mul(x.t, view(b, {n, 3}));
    Guarded x2({n, 3}, &a);
    be.mul(x2.t, view(s, {n, 1}));
    for (int64_t i = 0; i < n * 3; ++i) {
      EXPECT_EQ(x.values()[i], a[i] * b[i]);
      EXPECT_EQ(x2.values()[i], a[i] * s[i / 3]);
    }
    EXPECT_TRUE(x.intact() && x2.intact());
  }
}

TEST_F(HybridOps, RmsNormGroupsMatchesReference) {
  for (int64_t group : {1, 5, 8, 19})
    for (int64_t n_group : {1, 3}) {
      const int64_t rows = 5, c = group * n_group;
      std::vector<float> x = rnd(rng, rows * c), w = rnd(rng, c, 0.5f, 1.5f);
      Guarded y({rows, c});
      be.rms_norm_groups(view(x, {rows, c}), view(w, {c}), 1e-6f, group, y.t);
      std::vector<double> want(rows * c);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < n_group; ++g) {
          double ss = 0;
          for (int64_t i = 0; i < group; ++i) ss += double(x[r * c + g * group + i]) * x[r * c + g * group + i];
          double inv = 1.0 / std::sqrt(ss / group + 1e-6);
          for (int64_t i = 0; i < group; ++i) {
            int64_t e = r * c + g * group + i;
            want[e] = x[e] * inv * w[g * group + i];
          }
        }
      EXPECT_LT(nse(y.values(), want), kTol) << group << "x" << n_group;
      EXPECT_TRUE(y.intact());
      // group == c is rms_norm, bit for bit.
      if (n_group == 1) {
        Guarded y2({rows, c});
        be.rms_norm(view(x, {rows, c}), view(w, {c}), 1e-6f, y2.t);
        EXPECT_EQ(y.values(), y2.values());
      }
    }
}

// out[t] = act(sum_j w[j] xx[S + t - (K - 1 - j) D]) with xx = [state; x].
std::vector<double> ref_conv(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& state,
                             int64_t n, int64_t c, int64_t K, int64_t D, bool silu) {
  const int64_t S = (K - 1) * D;
  std::vector<double> out(n * c);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t ch = 0; ch < c; ++ch) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        int64_t u = S + t - (K - 1 - j) * D;
        double xv = u < S ? state[u * c + ch] : x[(u - S) * c + ch];
        acc += double(w[ch * K + j]) * xv;
      }
      out[t * c + ch] = silu ? acc * sigmoid(acc) : acc;
    }
  return out;
}

TEST_F(HybridOps, CausalConvMatchesReferenceAndCarriesItsState) {
  for (int64_t D : {1, 3})
    for (int64_t K : {1, 3, 4})
      for (int64_t c : {5, 19})
        for (int64_t n : {1, 2, 9}) {
          const int64_t S = (K - 1) * D;
          std::vector<float> x = rnd(rng, n * c), w = rnd(rng, c * K), st0 = rnd(rng, S * c);
          std::vector<float> state = st0;
          Guarded out({n, c});
          be.causal_conv1d(view(x, {n, c}), view(w, {c, K}), view(state, {S, c}), out.t, D, true);
          SCOPED_TRACE(testing::Message() << "D=" << D << " K=" << K << " c=" << c << " n=" << n);
          EXPECT_LT(nse(out.values(), ref_conv(x, w, st0, n, c, K, D, true)), kTol);
          EXPECT_TRUE(out.intact());
          // The new state: the last S rows of [state; x].
          std::vector<float> xx = st0;
          xx.insert(xx.end(), x.begin(), x.end());
          EXPECT_EQ(state, std::vector<float>(xx.end() - S * c, xx.end()));
          // Token by token through the state gives the same bits.
          std::vector<float> st1 = st0, step(n * c);
          for (int64_t t = 0; t < n; ++t)
            be1.causal_conv1d(Tensor(DType::f32, {1, c}, x.data() + t * c), view(w, {c, K}), view(st1, {S, c}),
                              Tensor(DType::f32, {1, c}, step.data() + t * c), D, true);
          EXPECT_EQ(step, out.values());
          EXPECT_EQ(st1, state);
        }
}

TEST_F(HybridOps, DeltaNetGatesMatchReference) {
  const int64_t n = 6, H = 5;
  std::vector<float> a = rnd(rng, n * H, -30, 30), b = rnd(rng, n * H, -5, 5), A_log = rnd(rng, H, -2, 2),
                     dt = rnd(rng, H);
  Guarded g({n, H}), beta({n, H});
  be.delta_net_gates(view(a, {n, H}), view(b, {n, H}), view(A_log, {H}), view(dt, {H}), g.t, beta.t);
  std::vector<double> gw(n * H), bw(n * H);
  for (int64_t i = 0; i < n * H; ++i) {
    double x = double(a[i]) + dt[i % H];
    double sp = x > 20 ? x : std::log1p(std::exp(x));
    gw[i] = -std::exp(double(A_log[i % H])) * sp;
    bw[i] = sigmoid(b[i]);
  }
  EXPECT_LT(nse(g.values(), gw), kTol);
  EXPECT_LT(nse(beta.values(), bw), kTol);
  EXPECT_TRUE(g.intact() && beta.intact());
}

// The recurrent gated delta rule in double.
struct DeltaCase {
  int64_t n, hk, hv, dk, dv;
  std::vector<float> q, k, v, g, beta, state;
};

DeltaCase make_delta(std::mt19937& rng, int64_t n, int64_t hk, int64_t hv, int64_t dk, int64_t dv, float g_lo) {
  DeltaCase c{n, hk, hv, dk, dv, rnd(rng, n * hk * dk), rnd(rng, n * hk * dk), rnd(rng, n * hv * dv),
              rnd(rng, n * hv, g_lo, 0.0f), rnd(rng, n * hv, 0.0f, 1.0f), rnd(rng, hv * dk * dv, -0.5f, 0.5f)};
  return c;
}

void ref_delta(const DeltaCase& c, std::vector<double>& out, std::vector<double>& S) {
  S.assign(c.state.begin(), c.state.end());
  out.assign(c.n * c.hv * c.dv, 0.0);
  for (int64_t h = 0; h < c.hv; ++h) {
    const int64_t kh = h / (c.hv / c.hk);
    double* s = S.data() + h * c.dk * c.dv;
    for (int64_t t = 0; t < c.n; ++t) {
      std::vector<double> q(c.dk), k(c.dk);
      double qs = 0, ks = 0;
      for (int64_t i = 0; i < c.dk; ++i) {
        q[i] = c.q[(t * c.hk + kh) * c.dk + i];
        k[i] = c.k[(t * c.hk + kh) * c.dk + i];
        qs += q[i] * q[i];
        ks += k[i] * k[i];
      }
      for (int64_t i = 0; i < c.dk; ++i) {
        q[i] = q[i] / std::sqrt(qs + 1e-6) / std::sqrt(double(c.dk));
        k[i] = k[i] / std::sqrt(ks + 1e-6);
      }
      const double decay = std::exp(double(c.g[t * c.hv + h])), b = c.beta[t * c.hv + h];
      for (int64_t e = 0; e < c.dk * c.dv; ++e) s[e] *= decay;
      for (int64_t j = 0; j < c.dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < c.dk; ++i) kv += s[i * c.dv + j] * k[i];
        double delta = (c.v[(t * c.hv + h) * c.dv + j] - kv) * b;
        for (int64_t i = 0; i < c.dk; ++i) s[i * c.dv + j] += k[i] * delta;
      }
      for (int64_t j = 0; j < c.dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < c.dk; ++i) o += s[i * c.dv + j] * q[i];
        out[(t * c.hv + h) * c.dv + j] = o;
      }
    }
  }
}

TEST_F(HybridOps, GatedDeltaRuleChunkedAndRecurrentMatchReference) {
  struct Shape { int64_t n, hk, hv, dk, dv, chunk; float g_lo; };
  for (const Shape s : {Shape{1, 1, 1, 8, 8, 64, -1}, Shape{9, 2, 4, 7, 5, 4, -1}, Shape{70, 2, 2, 16, 9, 64, -1},
                        Shape{70, 1, 3, 13, 11, 16, -1}, Shape{40, 2, 4, 16, 8, 64, -12}}) {
    DeltaCase c = make_delta(rng, s.n, s.hk, s.hv, s.dk, s.dv, s.g_lo);
    std::vector<double> want_out, want_state;
    ref_delta(c, want_out, want_state);
    for (int64_t chunk : {int64_t{0}, s.chunk}) {
      std::vector<float> state = c.state;
      Guarded out({s.n, s.hv, s.dv});
      DeltaRuleParams p;
      p.chunk_size = chunk;
      be.gated_delta_rule(view(c.q, {s.n, s.hk, s.dk}), view(c.k, {s.n, s.hk, s.dk}), view(c.v, {s.n, s.hv, s.dv}),
                          view(c.g, {s.n, s.hv}), view(c.beta, {s.n, s.hv}), view(state, {s.hv, s.dk, s.dv}), out.t, p);
      SCOPED_TRACE(testing::Message() << "n=" << s.n << " hk=" << s.hk << " hv=" << s.hv << " chunk=" << chunk
                                      << " g_lo=" << s.g_lo);
      EXPECT_LT(nse(out.values(), want_out), kTolDelta);
      EXPECT_LT(nse(state, want_state), kTolDelta);
      EXPECT_TRUE(out.intact());
    }
  }
}

// A prefill split across calls (chunked, then recurrent single tokens, then chunked) through
// the state gives what one pass gives, to rounding: the engine's chunked prefill and decode.
TEST_F(HybridOps, GatedDeltaRuleSplitAcrossCallsMatchesOnePass) {
  const int64_t n = 23, hk = 2, hv = 4, dk = 8, dv = 6;
  DeltaCase c = make_delta(rng, n, hk, hv, dk, dv, -1);
  std::vector<float> state_all = c.state, out_all(n * hv * dv);
  DeltaRuleParams chunked;
  chunked.chunk_size = 8;
  be.gated_delta_rule(view(c.q, {n, hk, dk}), view(c.k, {n, hk, dk}), view(c.v, {n, hv, dv}), view(c.g, {n, hv}),
                      view(c.beta, {n, hv}), view(state_all, {hv, dk, dv}), view(out_all, {n, hv, dv}), chunked);
  std::vector<float> state = c.state, out(n * hv * dv);
  int64_t t = 0;
  for (int64_t len : {5, 1, 1, 10, 1, 5}) {
    DeltaRuleParams p;
    p.chunk_size = len > 1 ? 8 : 0;
    be.gated_delta_rule(Tensor(DType::f32, {len, hk, dk}, c.q.data() + t * hk * dk),
                        Tensor(DType::f32, {len, hk, dk}, c.k.data() + t * hk * dk),
                        Tensor(DType::f32, {len, hv, dv}, c.v.data() + t * hv * dv),
                        Tensor(DType::f32, {len, hv}, c.g.data() + t * hv),
                        Tensor(DType::f32, {len, hv}, c.beta.data() + t * hv), view(state, {hv, dk, dv}),
                        Tensor(DType::f32, {len, hv, dv}, out.data() + t * hv * dv), p);
    t += len;
  }
  ASSERT_EQ(t, n);
  EXPECT_LT(nse(out, out_all), kTolDelta);
  EXPECT_LT(nse(state, state_all), kTolDelta);
}

TEST_F(HybridOps, HyperMixInjectAndPleGateMatchReference) {
  for (int64_t ns : {2, 3, 4})
    for (int64_t c : {5, 16}) {
      const int64_t n = 3;
      std::vector<float> xn = rnd(rng, n * ns * c), lg = rnd(rng, n * ns * c, -4, 4);
      Guarded mixed({n, c});
      be.hyper_mix(view(xn, {n, ns * c}), view(lg, {n, ns * c}), mixed.t);
      std::vector<double> want(n * c, 0.0);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < c; ++i) {
          for (int64_t s = 0; s < ns; ++s) want[r * c + i] += sigmoid(lg[(r * ns + s) * c + i]) * xn[(r * ns + s) * c + i];
          want[r * c + i] /= ns;
        }
      EXPECT_LT(nse(mixed.values(), want), kTol);

      std::vector<float> x0 = rnd(rng, n * ns * c), y = rnd(rng, n * c), w = rnd(rng, n * ns, 0, 2);
      Guarded x({n, ns * c}, &x0);
      be.hyper_inject(x.t, view(y, {n, c}), view(w, {n, ns}));
      std::vector<float> got = x.values();
      for (int64_t r = 0; r < n; ++r)
        for (int64_t s = 0; s < ns; ++s)
          for (int64_t i = 0; i < c; ++i) {
            const float p = y[r * c + i] * w[r * ns + s];
            EXPECT_EQ(got[(r * ns + s) * c + i], x0[(r * ns + s) * c + i] + p);
          }

      std::vector<float> key = rnd(rng, n * ns * c), query = rnd(rng, n * ns * c), value = rnd(rng, n * c);
      query[0] = 0;  // some products exactly zero do not matter; a zero score is covered below
      Guarded gated({n, ns * c});
      be.ple_gate(view(key, {n, ns * c}), view(query, {n, ns * c}), view(value, {n, c}), gated.t);
      std::vector<double> gw(n * ns * c);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t s = 0; s < ns; ++s) {
          double a = 0;
          for (int64_t i = 0; i < c; ++i) a += double(key[(r * ns + s) * c + i]) * query[(r * ns + s) * c + i];
          a /= std::sqrt(double(c));
          a = std::sqrt(std::max(std::fabs(a), 1e-6)) * (a > 0 ? 1 : a < 0 ? -1 : 0);
          for (int64_t i = 0; i < c; ++i) gw[(r * ns + s) * c + i] = sigmoid(a) * value[r * c + i];
        }
      EXPECT_LT(nse(gated.values(), gw), kTol);
      EXPECT_TRUE(mixed.intact() && x.intact() && gated.intact());
    }
  // A zero score: sign(0) = 0, so the gate is sigmoid(0) = 1/2.
  std::vector<float> key(4, 0.0f), query(4, 1.0f), value{2.0f, -4.0f};
  std::vector<float> out(4);
  be.ple_gate(view(key, {1, 4}), view(query, {1, 4}), view(value, {1, 2}), view(out, {1, 4}));
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f, 1.0f, -2.0f}));
}

TEST_F(HybridOps, MeanRowsMatchesReference) {
  const int64_t m = 4, group = 3, c = 9;
  std::vector<float> src = rnd(rng, m * group * c);
  Guarded dst({m, c});
  be.mean_rows(view(src, {m * group, c}), group, dst.t);
  std::vector<double> want(m * c, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t col = 0; col < c; ++col) {
      for (int64_t j = 0; j < group; ++j) want[i * c + col] += src[(i * group + j) * c + col];
      want[i * c + col] /= group;
    }
  EXPECT_LT(nse(dst.values(), want), kTol);
  EXPECT_TRUE(dst.intact());
}

// Kept tokens: the block_topk best complete blocks (reference scores in double, data drawn so
// that no two scores are within rounding of each other), plus the tail; ascending; -1 after.
TEST_F(HybridOps, QsaSelectKeepsTheTopBlocksAndTheTail) {
  const int64_t n_head = 3, d = 7, c = 4, topk = 2, n_past = 5, n = 22;
  const int64_t n_blocks = (n_past + n) / c, width = topk * c + c - 1;
  std::vector<float> q = rnd(rng, n * n_head * d), bk = rnd(rng, n_blocks * d);
  std::vector<int32_t> idx(n * width, 7777);
  QsaParams p;
  p.n_past = n_past;
  p.compress_ratio = c;
  p.block_topk = topk;
  be.qsa_select(view(q, {n, n_head, d}), view(bk, {n_blocks, d}), Tensor(DType::i32, {n, width}, idx.data()), p);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = n_past + i, m = (pos + 1) / c;
    std::vector<std::pair<double, int64_t>> sc;
    for (int64_t b = 0; b < m; ++b) {
      double s = 0;
      for (int64_t h = 0; h < n_head; ++h) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += double(q[(i * n_head + h) * d + e]) * bk[b * d + e];
        s += std::max(0.0, dot);
      }
      sc.push_back({-s / std::sqrt(double(d)), b});
    }
    std::sort(sc.begin(), sc.end());
    std::vector<int32_t> want;
    for (int64_t j = 0; j < std::min(topk, m); ++j)
      for (int64_t t = 0; t < c; ++t) want.push_back(static_cast<int32_t>(sc[j].second * c + t));
    for (int64_t t = m * c; t <= pos; ++t) want.push_back(static_cast<int32_t>(t));
    std::sort(want.begin(), want.end());
    want.resize(width, -1);
    EXPECT_EQ(std::vector<int32_t>(idx.begin() + i * width, idx.begin() + (i + 1) * width), want) << "query " << i;
  }
}

// attention_indexed over exactly the causal positions is causal attention; over a subset it
// matches a double reference.
TEST_F(HybridOps, AttentionIndexedMatchesReference) {
  const int64_t n = 6, n_past = 4, n_head = 4, n_kv = 2, d = 11, n_ctx = n_past + n;
  std::vector<float> q = rnd(rng, n * n_head * d), k = rnd(rng, n_ctx * n_kv * d), v = rnd(rng, n_ctx * n_kv * d);
  const int64_t width = n_ctx + 2;
  std::vector<int32_t> all(n * width, -1), some(n * width, -1);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j <= n_past + i; ++j) all[i * width + j] = static_cast<int32_t>(j);
    int64_t m = 0;
    for (int64_t j = 0; j <= n_past + i; j += 2) some[i * width + 1 + m++] = static_cast<int32_t>(j);
  }
  const float scale = 0.3f;
  Guarded full({n, n_head, d}), causal({n, n_head, d}), sparse({n, n_head, d});
  be.attention_indexed(view(q, {n, n_head, d}), view(k, {n_ctx, n_kv, d}), view(v, {n_ctx, n_kv, d}),
                       Tensor(DType::i32, {n, width}, all.data()), full.t, scale);
  AttentionParams ap;
  ap.n_past = n_past;
  ap.scale = scale;
  be.attention(view(q, {n, n_head, d}), view(k, {n_ctx, n_kv, d}), view(v, {n_ctx, n_kv, d}), causal.t, ap);
  EXPECT_LT(nse(full.values(), causal.values()), kTol);
  be.attention_indexed(view(q, {n, n_head, d}), view(k, {n_ctx, n_kv, d}), view(v, {n_ctx, n_kv, d}),
                       Tensor(DType::i32, {n, width}, some.data()), sparse.t, scale);
  std::vector<double> want(n * n_head * d, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t g = h / (n_head / n_kv);
      std::vector<double> s;
      std::vector<int64_t> pos;
      for (int64_t j = 0; j <= n_past + i; j += 2) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += double(q[(i * n_head + h) * d + e]) * k[(j * n_kv + g) * d + e];
        s.push_back(dot * scale);
        pos.push_back(j);
      }
      double mx = *std::max_element(s.begin(), s.end()), sum = 0;
      for (double& x : s) sum += x = std::exp(x - mx);
      for (size_t j = 0; j < s.size(); ++j)
        for (int64_t e = 0; e < d; ++e) want[(i * n_head + h) * d + e] += s[j] / sum * v[(pos[j] * n_kv + g) * d + e];
    }
  EXPECT_LT(nse(sparse.values(), want), kTol);
  EXPECT_TRUE(full.intact() && causal.intact() && sparse.intact());
}

}  // namespace
