// CUDA ops of the hybrid families (backend.h, "hybrid families") against the CPU reference:
// random inputs at odd sizes (rows, channels and head dims that are not multiples of 8 or 32,
// one more than a warp), sentinels on both sides of every device output to catch
// out-of-bounds writes, and every in-place state (conv, delta rule) compared too.
//
// Tolerances: f32 ops within 1e-6 normalized squared error (the bound; reordered f32
// sums and expf against the CPU's exp8 give ~1e-13). Pure data movement (copy_cols, the conv
// state) and mul's single rounding must be bit-identical, and qsa_select must choose exactly
// the CPU's token indices (its scores are computed in the CPU's order; ties included).
// hyper_inject is held to the f32 bound, not to equality: the CPU's x + y w is two roundings
// in its source, but GCC in C++ mode contracts it into one fma (-ffp-contract=fast is its
// default outside ISO C; objdump shows vfmadd in cpu/hyper.cpp.o), so its last bit depends on
// the host compiler; the CUDA kernel rounds the product on its own, as PyTorch does. The delta rule's CUDA kernel is the recurrent form for every
// chunk size; each chunk size is compared with the CPU's matching form within the same 1e-6
// (cuda/delta_net.cu says why that holds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"

using namespace sluice;

namespace {

constexpr double kMaxNse = 1e-6;
constexpr uint32_t kSentinelBits = 0x7fa5a5a5u;  // a NaN payload no kernel produces
constexpr int64_t kGuard = 37;                   // sentinel elements on each side of a device output

struct Pair {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
};

std::vector<float> rnd(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

int64_t numel(std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A 4-byte tensor (f32 or i32) on the device with kGuard sentinel words on each side.
struct DevGuarded {
  Backend* be;
  Tensor whole, t;
  int64_t n;
  DevGuarded(Backend& b, DType dt, std::initializer_list<int64_t> shape, const void* init = nullptr) : be(&b) {
    n = numel(shape);
    whole = b.alloc(dt, {n + 2 * kGuard});
    std::vector<uint32_t> words(static_cast<size_t>(n + 2 * kGuard), kSentinelBits);
    if (init) std::memcpy(words.data() + kGuard, init, static_cast<size_t>(n) * 4);
    else std::fill(words.begin() + kGuard, words.begin() + kGuard + n, 0u);
    b.from_host(whole, words.data());
    t = Tensor(dt, shape, static_cast<char*>(whole.data) + kGuard * 4, whole.storage);
  }
  std::vector<uint32_t> words() const {
    std::vector<uint32_t> w(static_cast<size_t>(n + 2 * kGuard));
    be->to_host(whole, w.data());
    return w;
  }
  std::vector<float> values() const {
    std::vector<uint32_t> w = words();
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), w.data() + kGuard, static_cast<size_t>(n) * 4);
    return v;
  }
  std::vector<int32_t> ints() const {
    std::vector<uint32_t> w = words();
    std::vector<int32_t> v(static_cast<size_t>(n));
    std::memcpy(v.data(), w.data() + kGuard, static_cast<size_t>(n) * 4);
    return v;
  }
  bool intact() const {
    std::vector<uint32_t> w = words();
    for (int64_t i = 0; i < kGuard; ++i)
      if (w[i] != kSentinelBits || w[kGuard + n + i] != kSentinelBits) return false;
    return true;
  }
};

DevGuarded dev(Backend& b, std::initializer_list<int64_t> shape, const std::vector<float>* init = nullptr) {
  return DevGuarded(b, DType::f32, shape, init ? init->data() : nullptr);
}

// A host-backed CPU tensor holding `v` (the CPU backend's memory is host memory).
Tensor host(std::vector<float>& v, std::initializer_list<int64_t> shape) { return Tensor(DType::f32, shape, v.data()); }

double nse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return num / std::max(den, 1e-30);
}

// GPU output `g` against the CPU values: NSE within kMaxNse, guards intact.
void expect_close(const DevGuarded& g, const std::vector<float>& want, const std::string& what) {
  EXPECT_LE(nse(g.values(), want), kMaxNse) << what;
  EXPECT_TRUE(g.intact()) << what << ": a write outside the output";
}
void expect_equal(const DevGuarded& g, const std::vector<float>& want, const std::string& what) {
  EXPECT_EQ(g.values(), want) << what;
  EXPECT_TRUE(g.intact()) << what << ": a write outside the output";
}

// Gemma 4's gelu_tanh and tanh (the logit softcap: tanh(x / cap) * cap). Each element within
// a few ulps of the CPU's std::tanh: NSE as the others, and an absolute bound of 1e-6 per
// element of magnitude <= 1 after the softcap's scaling.
TEST(CudaHybridOps, GeluTanhAndTanh) {
  Pair p;
  std::mt19937 rng(3);
  for (int64_t n : {1, 7, 37, 1000})
    for (Activation act : {Activation::gelu_tanh, Activation::tanh})
      for (auto [div, mul] : {std::pair{1.0f, 1.0f}, {30.0f, 30.0f}}) {
        std::vector<float> x = rnd(rng, n, -40, 40), want = x;
        p.cpu->activate(host(want, {n}), act, div, mul);
        DevGuarded g = dev(*p.gpu, {n}, &x);
        p.gpu->activate(g.t, act, div, mul);
        expect_close(g, want, "activate " + std::to_string(static_cast<int>(act)) + " n=" + std::to_string(n));
        const std::vector<float> got = g.values();
        for (int64_t i = 0; i < n; ++i)
          EXPECT_LE(std::fabs(got[i] - want[i]), 1e-6f * std::max(1.0f, std::fabs(want[i]))) << "element " << i;
      }
}

TEST(CudaHybridOps, CopyCols) {
  Pair p;
  std::mt19937 rng(1);
  for (auto [rows, sc, dc, s0, d0, nc] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>{7, 13, 11, 3, 2, 5},
                                          {1, 64, 64, 0, 0, 64}, {33, 200, 97, 100, 1, 96}, {5, 9, 9, 4, 0, 0}}) {
    std::vector<float> src = rnd(rng, rows * sc), init = rnd(rng, rows * dc), want = init;
    p.cpu->copy_cols(host(src, {rows, sc}), s0, host(want, {rows, dc}), d0, nc);
    DevGuarded gs = dev(*p.gpu, {rows, sc}, &src), gd = dev(*p.gpu, {rows, dc}, &init);
    p.gpu->copy_cols(gs.t, s0, gd.t, d0, nc);
    expect_equal(gd, want, "copy_cols rows=" + std::to_string(rows));
  }
  DevGuarded a = dev(*p.gpu, {4, 8}), b = dev(*p.gpu, {4, 8});
  EXPECT_THROW(p.gpu->copy_cols(a.t, 5, b.t, 0, 4), Error);
}

TEST(CudaHybridOps, ActivateAndMul) {
  Pair p;
  std::mt19937 rng(2);
  for (int64_t n : {1, 7, 37, 1000})
    for (Activation act : {Activation::sigmoid, Activation::silu})
      for (auto [div, mul] : {std::pair{1.0f, 1.0f}, {3.0f, 2.0f}}) {
        std::vector<float> x = rnd(rng, n, -12, 12), want = x;
        p.cpu->activate(host(want, {n}), act, div, mul);
        DevGuarded g = dev(*p.gpu, {n}, &x);
        p.gpu->activate(g.t, act, div, mul);
        expect_close(g, want, "activate n=" + std::to_string(n));
      }
  for (int64_t rows : {1, 5, 70}) {
    const int64_t c = 19;
    std::vector<float> x = rnd(rng, rows * c), y = rnd(rng, rows * c), s = rnd(rng, rows);
    std::vector<float> w1 = x, w2 = x;
    p.cpu->mul(host(w1, {rows, c}), host(y, {rows, c}));
    p.cpu->mul(host(w2, {rows, c}), host(s, {rows, 1}));
    DevGuarded g1 = dev(*p.gpu, {rows, c}, &x), g2 = dev(*p.gpu, {rows, c}, &x);
    DevGuarded gy = dev(*p.gpu, {rows, c}, &y), gs = dev(*p.gpu, {rows, 1}, &s);
    p.gpu->mul(g1.t, gy.t);
    p.gpu->mul(g2.t, gs.t);
    expect_equal(g1, w1, "mul elementwise");
    expect_equal(g2, w2, "mul per row");
  }
}

TEST(CudaHybridOps, RmsNormGroups) {
  Pair p;
  std::mt19937 rng(3);
  for (int64_t group : {1, 5, 19, 64, 300})
    for (int64_t n_group : {1, 3, 4})
      for (bool weighted : {true, false})
        for (bool in_place : {false, true}) {
          const int64_t rows = 5, c = group * n_group;
          std::vector<float> x = rnd(rng, rows * c, -3, 3), w = rnd(rng, c, 0.5f, 1.5f), want(rows * c);
          Tensor wc = weighted ? host(w, {c}) : Tensor{};
          p.cpu->rms_norm_groups(host(x, {rows, c}), wc, 1e-6f, group, host(want, {rows, c}));
          DevGuarded gx = dev(*p.gpu, {rows, c}, &x), gy = dev(*p.gpu, {rows, c});
          Tensor wg = weighted ? p.gpu->upload(wc) : Tensor{};
          p.gpu->rms_norm_groups(gx.t, wg, 1e-6f, group, in_place ? gx.t : gy.t);
          expect_close(in_place ? gx : gy, want,
                       "rms_norm_groups group=" + std::to_string(group) + " x" + std::to_string(n_group));
        }
}

TEST(CudaHybridOps, CausalConv1dAndItsState) {
  Pair p;
  std::mt19937 rng(4);
  for (int64_t D : {1, 3})
    for (int64_t K : {1, 3, 4})
      for (int64_t c : {5, 19, 130})
        for (int64_t n : {1, 2, 9, 40})
          for (bool silu : {true, false}) {
            const int64_t S = (K - 1) * D;
            std::vector<float> x = rnd(rng, n * c), w = rnd(rng, c * K), st0 = rnd(rng, S * c);
            std::vector<float> want(n * c), want_state = st0;
            p.cpu->causal_conv1d(host(x, {n, c}), host(w, {c, K}), host(want_state, {S, c}), host(want, {n, c}), D,
                                 silu);
            const std::string what = "conv D=" + std::to_string(D) + " K=" + std::to_string(K) +
                                     " c=" + std::to_string(c) + " n=" + std::to_string(n);
            DevGuarded gx = dev(*p.gpu, {n, c}, &x), gw = dev(*p.gpu, {c, K}, &w), gst = dev(*p.gpu, {S, c}, &st0);
            DevGuarded go = dev(*p.gpu, {n, c});
            p.gpu->causal_conv1d(gx.t, gw.t, gst.t, go.t, D, silu);
            expect_close(go, want, what);
            expect_equal(gst, want_state, what + " state");
            // Token by token through the state: the same outputs and state.
            if (n > 1 && S > 0) {
              DevGuarded st1 = dev(*p.gpu, {S, c}, &st0), step = dev(*p.gpu, {n, c});
              for (int64_t t = 0; t < n; ++t)
                p.gpu->causal_conv1d(gx.t.slice_rows(t, 1), gw.t, st1.t, step.t.slice_rows(t, 1), D, silu);
              expect_close(step, want, what + " token by token");
              expect_equal(st1, want_state, what + " token by token state");
            }
          }
}

TEST(CudaHybridOps, DeltaNetGates) {
  Pair p;
  std::mt19937 rng(5);
  for (auto [n, H] : {std::pair<int64_t, int64_t>{6, 5}, {1, 32}, {67, 3}}) {
    std::vector<float> a = rnd(rng, n * H, -30, 30), b = rnd(rng, n * H, -8, 8), A_log = rnd(rng, H, -2, 2),
                       dt = rnd(rng, H), g(n * H), beta(n * H);
    p.cpu->delta_net_gates(host(a, {n, H}), host(b, {n, H}), host(A_log, {H}), host(dt, {H}), host(g, {n, H}),
                           host(beta, {n, H}));
    DevGuarded ga = dev(*p.gpu, {n, H}, &a), gb = dev(*p.gpu, {n, H}, &b), gl = dev(*p.gpu, {H}, &A_log),
               gd = dev(*p.gpu, {H}, &dt), gg = dev(*p.gpu, {n, H}), gbeta = dev(*p.gpu, {n, H});
    p.gpu->delta_net_gates(ga.t, gb.t, gl.t, gd.t, gg.t, gbeta.t);
    expect_close(gg, g, "delta_net_gates g");
    expect_close(gbeta, beta, "delta_net_gates beta");
  }
}

struct DeltaShape {
  int64_t n, hk, hv, dk, dv, chunk;
  float g_lo;  // log decays drawn from [g_lo, 0]
};

TEST(CudaHybridOps, GatedDeltaRuleBothFormsAgainstTheCpu) {
  Pair p;
  std::mt19937 rng(6);
  for (const DeltaShape s : {DeltaShape{1, 1, 1, 8, 8, 64, -1}, DeltaShape{9, 2, 4, 7, 5, 4, -1},
                             DeltaShape{70, 2, 2, 16, 9, 64, -1}, DeltaShape{70, 1, 3, 13, 33, 16, -1},
                             DeltaShape{40, 2, 4, 16, 8, 64, -12}, DeltaShape{1, 2, 4, 128, 128, 64, -1},
                             DeltaShape{37, 2, 4, 128, 128, 64, -0.5f}, DeltaShape{5, 1, 2, 100, 65, 64, -1},
                             DeltaShape{3, 1, 1, 200, 40, 64, -1}}) {
    std::vector<float> q = rnd(rng, s.n * s.hk * s.dk), k = rnd(rng, s.n * s.hk * s.dk),
                       v = rnd(rng, s.n * s.hv * s.dv), g = rnd(rng, s.n * s.hv, s.g_lo, 0.0f),
                       beta = rnd(rng, s.n * s.hv, 0.0f, 1.0f), st0 = rnd(rng, s.hv * s.dk * s.dv, -0.5f, 0.5f);
    for (int64_t chunk : {int64_t{0}, s.chunk}) {
      std::vector<float> want(s.n * s.hv * s.dv), want_state = st0;
      DeltaRuleParams params;
      params.chunk_size = chunk;
      p.cpu->gated_delta_rule(host(q, {s.n, s.hk, s.dk}), host(k, {s.n, s.hk, s.dk}), host(v, {s.n, s.hv, s.dv}),
                              host(g, {s.n, s.hv}), host(beta, {s.n, s.hv}), host(want_state, {s.hv, s.dk, s.dv}),
                              host(want, {s.n, s.hv, s.dv}), params);
      DevGuarded gq = dev(*p.gpu, {s.n, s.hk, s.dk}, &q), gk = dev(*p.gpu, {s.n, s.hk, s.dk}, &k),
                 gv = dev(*p.gpu, {s.n, s.hv, s.dv}, &v), gg = dev(*p.gpu, {s.n, s.hv}, &g),
                 gb = dev(*p.gpu, {s.n, s.hv}, &beta), gs = dev(*p.gpu, {s.hv, s.dk, s.dv}, &st0),
                 go = dev(*p.gpu, {s.n, s.hv, s.dv});
      p.gpu->gated_delta_rule(gq.t, gk.t, gv.t, gg.t, gb.t, gs.t, go.t, params);
      const std::string what = "delta rule n=" + std::to_string(s.n) + " dk=" + std::to_string(s.dk) +
                               " dv=" + std::to_string(s.dv) + " chunk=" + std::to_string(chunk);
      expect_close(go, want, what);
      expect_close(gs, want_state, what + " state");
    }
  }
}

// Prefill split across calls through the state (chunked, single tokens, chunked), as the
// engine runs it, against the CPU doing the same calls.
TEST(CudaHybridOps, GatedDeltaRuleSplitAcrossCalls) {
  Pair p;
  std::mt19937 rng(7);
  const int64_t n = 23, hk = 2, hv = 4, dk = 64, dv = 40;
  std::vector<float> q = rnd(rng, n * hk * dk), k = rnd(rng, n * hk * dk), v = rnd(rng, n * hv * dv),
                     g = rnd(rng, n * hv, -1, 0), beta = rnd(rng, n * hv, 0, 1), st0 = rnd(rng, hv * dk * dv);
  std::vector<float> want(n * hv * dv), want_state = st0;
  DevGuarded gq = dev(*p.gpu, {n, hk, dk}, &q), gk = dev(*p.gpu, {n, hk, dk}, &k), gv = dev(*p.gpu, {n, hv, dv}, &v),
             gg = dev(*p.gpu, {n, hv}, &g), gb = dev(*p.gpu, {n, hv}, &beta), gs = dev(*p.gpu, {hv, dk, dv}, &st0),
             go = dev(*p.gpu, {n, hv, dv});
  int64_t t = 0;
  for (int64_t len : {5, 1, 1, 10, 1, 5}) {
    DeltaRuleParams params;
    params.chunk_size = len > 1 ? 8 : 0;
    p.cpu->gated_delta_rule(Tensor(DType::f32, {len, hk, dk}, q.data() + t * hk * dk),
                            Tensor(DType::f32, {len, hk, dk}, k.data() + t * hk * dk),
                            Tensor(DType::f32, {len, hv, dv}, v.data() + t * hv * dv),
                            Tensor(DType::f32, {len, hv}, g.data() + t * hv),
                            Tensor(DType::f32, {len, hv}, beta.data() + t * hv), host(want_state, {hv, dk, dv}),
                            Tensor(DType::f32, {len, hv, dv}, want.data() + t * hv * dv), params);
    auto rows = [&](const DevGuarded& d, int64_t per_row, std::initializer_list<int64_t> shape) {
      Tensor r = d.t.reshape({n, per_row}).slice_rows(t, len);
      return r.reshape(shape);
    };
    p.gpu->gated_delta_rule(rows(gq, hk * dk, {len, hk, dk}), rows(gk, hk * dk, {len, hk, dk}),
                            rows(gv, hv * dv, {len, hv, dv}), rows(gg, hv, {len, hv}), rows(gb, hv, {len, hv}), gs.t,
                            rows(go, hv * dv, {len, hv, dv}), params);
    t += len;
  }
  ASSERT_EQ(t, n);
  expect_close(go, want, "delta rule split");
  expect_close(gs, want_state, "delta rule split state");
}

TEST(CudaHybridOps, HyperMixInjectAndPleGate) {
  Pair p;
  std::mt19937 rng(8);
  for (int64_t ns : {2, 3, 4})
    for (int64_t c : {5, 16, 67}) {
      const int64_t n = 3;
      std::vector<float> xn = rnd(rng, n * ns * c), lg = rnd(rng, n * ns * c, -4, 4), mixed(n * c);
      p.cpu->hyper_mix(host(xn, {n, ns * c}), host(lg, {n, ns * c}), host(mixed, {n, c}));
      DevGuarded gxn = dev(*p.gpu, {n, ns * c}, &xn), glg = dev(*p.gpu, {n, ns * c}, &lg), gm = dev(*p.gpu, {n, c});
      p.gpu->hyper_mix(gxn.t, glg.t, gm.t);
      const std::string what = " ns=" + std::to_string(ns) + " c=" + std::to_string(c);
      expect_close(gm, mixed, "hyper_mix" + what);

      std::vector<float> x0 = rnd(rng, n * ns * c), y = rnd(rng, n * c), w = rnd(rng, n * ns, 0, 2), x = x0;
      p.cpu->hyper_inject(host(x, {n, ns * c}), host(y, {n, c}), host(w, {n, ns}));
      DevGuarded gx = dev(*p.gpu, {n, ns * c}, &x0), gy = dev(*p.gpu, {n, c}, &y), gw = dev(*p.gpu, {n, ns}, &w);
      p.gpu->hyper_inject(gx.t, gy.t, gw.t);
      expect_close(gx, x, "hyper_inject" + what);

      std::vector<float> key = rnd(rng, n * ns * c), query = rnd(rng, n * ns * c), value = rnd(rng, n * c),
                         gated(n * ns * c);
      p.cpu->ple_gate(host(key, {n, ns * c}), host(query, {n, ns * c}), host(value, {n, c}), host(gated, {n, ns * c}));
      DevGuarded gk = dev(*p.gpu, {n, ns * c}, &key), gq = dev(*p.gpu, {n, ns * c}, &query),
                 gv = dev(*p.gpu, {n, c}, &value), gout = dev(*p.gpu, {n, ns * c});
      p.gpu->ple_gate(gk.t, gq.t, gv.t, gout.t);
      expect_close(gout, gated, "ple_gate" + what);
    }
  // A zero score: sign(0) = 0, so the gate is sigmoid(0) = 1/2, exactly.
  std::vector<float> key(4, 0.0f), query(4, 1.0f), value{2.0f, -4.0f};
  DevGuarded gk = dev(*p.gpu, {1, 4}, &key), gq = dev(*p.gpu, {1, 4}, &query), gv = dev(*p.gpu, {1, 2}, &value),
             gout = dev(*p.gpu, {1, 4});
  p.gpu->ple_gate(gk.t, gq.t, gv.t, gout.t);
  expect_equal(gout, {1.0f, -2.0f, 1.0f, -2.0f}, "ple_gate zero score");
}

TEST(CudaHybridOps, MeanRows) {
  Pair p;
  std::mt19937 rng(9);
  for (auto [m, group, c] : {std::tuple<int64_t, int64_t, int64_t>{4, 3, 9}, {1, 4, 16}, {33, 4, 130}}) {
    std::vector<float> src = rnd(rng, m * group * c), want(m * c);
    p.cpu->mean_rows(host(src, {m * group, c}), group, host(want, {m, c}));
    DevGuarded gs = dev(*p.gpu, {m * group, c}, &src), gd = dev(*p.gpu, {m, c});
    p.gpu->mean_rows(gs.t, group, gd.t);
    expect_close(gd, want, "mean_rows m=" + std::to_string(m));
  }
}

struct QsaCase {
  int64_t n_head, d, c, topk, n_past, n;
  int ties;  // 0 random; 1 identical block keys (every score ties); 2 half the keys negated copies (zero scores tie)
};

// Runs qsa_select on both backends; returns the GPU's indices after checking them against the CPU's.
std::vector<int32_t> check_qsa(Pair& p, std::mt19937& rng, const QsaCase& s) {
  const int64_t n_blocks = std::max<int64_t>(1, (s.n_past + s.n) / s.c), width = s.topk * s.c + s.c - 1;
  std::vector<float> q = rnd(rng, s.n * s.n_head * s.d), bk = rnd(rng, n_blocks * s.d);
  if (s.ties == 1)
    for (int64_t b = 1; b < n_blocks; ++b) std::copy(bk.begin(), bk.begin() + s.d, bk.begin() + b * s.d);
  if (s.ties == 2) {
    // q all positive, every other block key negative: those blocks score exactly +0.
    for (auto& x : q) x = std::fabs(x);
    for (int64_t b = 0; b < n_blocks; b += 2)
      for (int64_t e = 0; e < s.d; ++e) bk[b * s.d + e] = -std::fabs(bk[b * s.d + e]);
  }
  QsaParams params;
  params.n_past = s.n_past;
  params.compress_ratio = s.c;
  params.block_topk = s.topk;
  std::vector<int32_t> want(s.n * width, 7777);
  p.cpu->qsa_select(host(q, {s.n, s.n_head, s.d}), host(bk, {n_blocks, s.d}),
                    Tensor(DType::i32, {s.n, width}, want.data()), params);
  DevGuarded gq = dev(*p.gpu, {s.n, s.n_head, s.d}, &q), gbk = dev(*p.gpu, {n_blocks, s.d}, &bk);
  std::vector<int32_t> init(s.n * width, 7777);
  DevGuarded gidx(*p.gpu, DType::i32, {s.n, width}, init.data());
  p.gpu->qsa_select(gq.t, gbk.t, gidx.t, params);
  std::vector<int32_t> got = gidx.ints();
  const std::string what = "qsa_select n_past=" + std::to_string(s.n_past) + " n=" + std::to_string(s.n) +
                           " topk=" + std::to_string(s.topk) + " ties=" + std::to_string(s.ties);
  EXPECT_EQ(got, want) << what;
  EXPECT_TRUE(gidx.intact()) << what << ": a write outside idx";
  return got;
}

TEST(CudaHybridOps, QsaSelectChoosesExactlyTheCpuIndices) {
  Pair p;
  std::mt19937 rng(10);
  for (const QsaCase s : {QsaCase{3, 7, 4, 2, 5, 22, 0}, QsaCase{2, 16, 4, 2, 0, 40, 0},
                          QsaCase{2, 16, 4, 5, 300, 9, 0}, QsaCase{4, 33, 3, 16, 5000, 3, 0},
                          QsaCase{2, 16, 4, 2, 0, 30, 1}, QsaCase{2, 16, 4, 7, 200, 5, 1},
                          QsaCase{3, 9, 4, 3, 60, 7, 2}, QsaCase{1, 128, 64, 8, 4000, 2, 0},
                          QsaCase{2, 16, 4, 1, 0, 3, 0},
                          // torch's tie rule on many blocks: its heap selection (k * 64 <= blocks)
                          // and its introselect (k * 64 > blocks)
                          QsaCase{2, 16, 4, 3, 5000, 2, 1}, QsaCase{2, 16, 4, 8, 5000, 2, 2},
                          QsaCase{2, 16, 4, 30, 5000, 2, 2}})
    check_qsa(p, rng, s);
}

TEST(CudaHybridOps, AttentionIndexed) {
  Pair p;
  std::mt19937 rng(11);
  for (auto [n, n_past, n_head, n_kv, d] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{6, 4, 4, 2, 11},
                                            {1, 50, 4, 2, 16}, {9, 13, 6, 3, 128}, {3, 100, 2, 1, 40}}) {
    const int64_t n_ctx = n_past + n + 2, width = n_ctx + 3;
    std::vector<float> q = rnd(rng, n * n_head * d), k = rnd(rng, n_ctx * n_kv * d), v = rnd(rng, n_ctx * n_kv * d);
    // Every other visible position, with -1 before, between and after the entries.
    std::vector<int32_t> idx(n * width, -1);
    for (int64_t i = 0; i < n; ++i) {
      int64_t m = 1;
      for (int64_t j = 0; j <= n_past + i; j += 2) idx[i * width + m++] = static_cast<int32_t>(j);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> want(n * n_head * d);
    p.cpu->attention_indexed(host(q, {n, n_head, d}), host(k, {n_ctx, n_kv, d}), host(v, {n_ctx, n_kv, d}),
                             Tensor(DType::i32, {n, width}, idx.data()), host(want, {n, n_head, d}), scale);
    DevGuarded gq = dev(*p.gpu, {n, n_head, d}, &q), gk = dev(*p.gpu, {n_ctx, n_kv, d}, &k),
               gv = dev(*p.gpu, {n_ctx, n_kv, d}, &v), go = dev(*p.gpu, {n, n_head, d});
    DevGuarded gi(*p.gpu, DType::i32, {n, width}, idx.data());
    p.gpu->attention_indexed(gq.t, gk.t, gv.t, gi.t, go.t, scale);
    expect_close(go, want, "attention_indexed n=" + std::to_string(n) + " d=" + std::to_string(d));
  }
}

}  // namespace
