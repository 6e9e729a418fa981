// CPU Gated DeltaNet: the gates (delta_net_gates) and the gated delta rule in both of
// transformers' forms (torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule of
// models/qwen3_next), one value head per task.
//
// Recurrent form, per token t (S [dk, dv], q and k normalized, q / sqrt(dk)):
//   S = exp(g_t) S;  kv[j] = sum_i S[i, j] k[i];  delta = beta_t (v_t - kv);
//   S[i, j] += k[i] delta[j];  out[j] = sum_i S[i, j] q[i]
// with every sum over i accumulated in i order, one rounding per product and per sum.
// Chunked form, per chunk of m tokens (q scaled by dk^-0.5, cum = running sum of g in the
// chunk, D[i, j] = exp(cum_i - cum_j) for j <= i):
//   A[i, j] = (beta_i k_i . k_j) D[i, j] (j < i);  (I + A) U = beta v;  (I + A) W = beta k exp(cum)
//   v_new = U - W S;  out = (q exp(cum)) S + (q_i . k_j D[i, j])_{j <= i} v_new
//   S = exp(cum_last) S + (k exp(cum_last - cum))^T v_new
// (the triangular systems solved by forward substitution). The two forms are equal in exact
// arithmetic and agree to f32 rounding; a last chunk shorter than chunk_size is computed as
// is (transformers pads it with zero keys, values and decays, which add nothing).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

struct DeltaShape {
  int64_t n, hk, hv, dk, dv;
};

// y = x / sqrt(sum(x^2) + 1e-6), then y * mul or y / div (transformers' l2norm; the chunked
// form multiplies q by dk^-0.5, the recurrent one divides it by sqrt(dk)).
void l2norm(const float* x, float* y, int64_t d, float mul, float div) {
  const float inv = 1.0f / std::sqrt(cpu::dot<DType::f32>(x, x, d) + 1e-6f);
  for (int64_t i = 0; i < d; ++i) {
    float v = x[i] * inv;
    if (mul != 1.0f) v *= mul;
    if (div != 1.0f) v /= div;
    y[i] = v;
  }
}

float dot(const float* a, const float* b, int64_t d) { return cpu::dot<DType::f32>(a, b, d); }

void recurrent_head(const DeltaShape& sh, int64_t h, const float* q, const float* k, const float* v, const float* g,
                    const float* beta, float* S, float* out) {
  const int64_t dk = sh.dk, dv = sh.dv, kh = h / (sh.hv / sh.hk);
  const float sqrt_dk = static_cast<float>(std::sqrt(static_cast<double>(dk)));
  std::vector<float> qn(dk), kn(dk), kv(dv), delta(dv);
  for (int64_t t = 0; t < sh.n; ++t) {
    l2norm(q + (t * sh.hk + kh) * dk, qn.data(), dk, 1.0f, sqrt_dk);
    l2norm(k + (t * sh.hk + kh) * dk, kn.data(), dk, 1.0f, 1.0f);
    const float decay = std::exp(g[t * sh.hv + h]), b = beta[t * sh.hv + h];
    const float* vt = v + (t * sh.hv + h) * dv;
    for (int64_t e = 0; e < dk * dv; ++e) S[e] *= decay;
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) kv[j] += S[i * dv + j] * kn[i];
    for (int64_t j = 0; j < dv; ++j) delta[j] = (vt[j] - kv[j]) * b;
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += kn[i] * delta[j];
    float* ot = out + (t * sh.hv + h) * dv;
    std::fill(ot, ot + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) ot[j] += S[i * dv + j] * qn[i];
  }
}

// Solves (I + A) X = B in place (B [m, w] becomes X), A strictly lower [m, m].
void solve_unit_lower(const std::vector<float>& A, int64_t m, float* B, int64_t w) {
  for (int64_t i = 1; i < m; ++i) {
    float* bi = B + i * w;
    for (int64_t j = 0; j < i; ++j) {
      const float a = A[i * m + j];
      const float* bj = B + j * w;
      for (int64_t c = 0; c < w; ++c) bi[c] -= a * bj[c];
    }
  }
}

void chunked_head(const DeltaShape& sh, int64_t h, int64_t chunk, const float* q, const float* k, const float* v,
                  const float* g, const float* beta, float* S, float* out) {
  const int64_t dk = sh.dk, dv = sh.dv, kh = h / (sh.hv / sh.hk);
  const float scale = static_cast<float>(std::pow(static_cast<double>(dk), -0.5));
  std::vector<float> qn(chunk * dk), kn(chunk * dk), kb(chunk * dk), U(chunk * dv), W(chunk * dk), cum(chunk),
      A(chunk * chunk), P(chunk * chunk), vnew(chunk * dv), snew(dk * dv), inter(dv), intra(dv);
  for (int64_t t0 = 0; t0 < sh.n; t0 += chunk) {
    const int64_t m = std::min(chunk, sh.n - t0);
    float run = 0.0f;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = t0 + i;
      l2norm(q + (t * sh.hk + kh) * dk, qn.data() + i * dk, dk, scale, 1.0f);
      l2norm(k + (t * sh.hk + kh) * dk, kn.data() + i * dk, dk, 1.0f, 1.0f);
      const float b = beta[t * sh.hv + h];
      for (int64_t a = 0; a < dk; ++a) kb[i * dk + a] = kn[i * dk + a] * b;
      const float* vt = v + (t * sh.hv + h) * dv;
      for (int64_t j = 0; j < dv; ++j) U[i * dv + j] = vt[j] * b;
      run += g[t * sh.hv + h];
      cum[i] = run;
    }
    // A (strictly lower) and the intra-chunk attention P (lower, diagonal included).
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        const float decay = std::exp(cum[i] - cum[j]);
        if (j < i) A[i * m + j] = dot(kb.data() + i * dk, kn.data() + j * dk, dk) * decay;
        P[i * m + j] = dot(qn.data() + i * dk, kn.data() + j * dk, dk) * decay;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const float e = std::exp(cum[i]);
      for (int64_t a = 0; a < dk; ++a) W[i * dk + a] = kb[i * dk + a] * e;
    }
    solve_unit_lower(A, m, U.data(), dv);  // U: the new values
    solve_unit_lower(A, m, W.data(), dk);  // W: the decayed keys that read the old state
    const float last = cum[m - 1];
    for (int64_t i = 0; i < m; ++i) {
      const float eq = std::exp(cum[i]), ek = std::exp(last - cum[i]);
      for (int64_t a = 0; a < dk; ++a) {
        qn[i * dk + a] *= eq;
        kn[i * dk + a] *= ek;
      }
    }
    // v_new = U - W S; out = q' S + P v_new.
    for (int64_t i = 0; i < m; ++i) {
      float* vn = vnew.data() + i * dv;
      std::fill(vn, vn + dv, 0.0f);
      for (int64_t a = 0; a < dk; ++a) {
        const float w = W[i * dk + a];
        for (int64_t j = 0; j < dv; ++j) vn[j] += w * S[a * dv + j];
      }
      for (int64_t j = 0; j < dv; ++j) vn[j] = U[i * dv + j] - vn[j];
    }
    for (int64_t i = 0; i < m; ++i) {
      float* ot = out + ((t0 + i) * sh.hv + h) * dv;
      std::fill(inter.begin(), inter.end(), 0.0f);
      std::fill(intra.begin(), intra.end(), 0.0f);
      for (int64_t a = 0; a < dk; ++a) {
        const float w = qn[i * dk + a];
        for (int64_t j = 0; j < dv; ++j) inter[j] += w * S[a * dv + j];
      }
      for (int64_t l = 0; l <= i; ++l) {
        const float w = P[i * m + l];
        for (int64_t j = 0; j < dv; ++j) intra[j] += w * vnew[l * dv + j];
      }
      for (int64_t j = 0; j < dv; ++j) ot[j] = inter[j] + intra[j];
    }
    // S = exp(last) S + k'^T v_new.
    const float chunk_decay = std::exp(last);
    std::fill(snew.begin(), snew.end(), 0.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t a = 0; a < dk; ++a) {
        const float w = kn[i * dk + a];
        for (int64_t j = 0; j < dv; ++j) snew[a * dv + j] += w * vnew[i * dv + j];
      }
    for (int64_t e = 0; e < dk * dv; ++e) S[e] = S[e] * chunk_decay + snew[e];
  }
}

}  // namespace

void CpuBackend::delta_net_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                                 const Tensor& g, const Tensor& beta) {
  const int64_t H = a.cols();
  SLUICE_CHECK(a.dtype == DType::f32 && b.dtype == DType::f32 && A_log.dtype == DType::f32 &&
                   dt_bias.dtype == DType::f32 && g.dtype == DType::f32 && beta.dtype == DType::f32 &&
                   b.numel() == a.numel() && g.numel() == a.numel() && beta.numel() == a.numel() &&
                   b.cols() == H && g.cols() == H && beta.cols() == H && A_log.numel() == H && dt_bias.numel() == H,
               Status::internal, "cpu delta_net_gates: a ", a.shape_str(), ", b ", b.shape_str(), ", A_log ",
               A_log.shape_str(), ", dt_bias ", dt_bias.shape_str(), ", g ", g.shape_str(), ", beta ",
               beta.shape_str(), " (want f32 a, b, g, beta [n, H], A_log and dt_bias [H])");
  const float* ap = a.ptr<float>();
  const float* bp = b.ptr<float>();
  const float* lp = A_log.ptr<float>();
  const float* dp = dt_bias.ptr<float>();
  float* gp = g.ptr<float>();
  float* betap = beta.ptr<float>();
  const int64_t total = a.numel();
  for (int64_t i = 0; i < total; ++i) {
    const int64_t h = i % H;
    const float x = ap[i] + dp[h];
    const float softplus = x > 20.0f ? x : std::log1p(std::exp(x));  // torch's threshold
    gp[i] = -std::exp(lp[h]) * softplus;
    betap[i] = 1.0f / (1.0f + std::exp(-bp[i]));
  }
}

void CpuBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                  const Tensor& beta, const Tensor& state, const Tensor& out,
                                  const DeltaRuleParams& params) {
  const bool shapes = q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3 && state.ndim == 3 &&
                      q.shape == k.shape && out.shape == v.shape && q.shape[0] == v.shape[0] && q.shape[1] > 0 &&
                      v.shape[1] % q.shape[1] == 0 && g.numel() == v.shape[0] * v.shape[1] &&
                      beta.numel() == g.numel() && state.shape[0] == v.shape[1] && state.shape[1] == q.shape[2] &&
                      state.shape[2] == v.shape[2];
  SLUICE_CHECK(q.dtype == DType::f32 && k.dtype == DType::f32 && v.dtype == DType::f32 && g.dtype == DType::f32 &&
                   beta.dtype == DType::f32 && state.dtype == DType::f32 && out.dtype == DType::f32 && shapes &&
                   params.chunk_size >= 0 && !cpu::overlaps(out, state),
               Status::internal, "cpu gated_delta_rule: q ", q.shape_str(), ", k ", k.shape_str(), ", v ",
               v.shape_str(), ", g ", g.shape_str(), ", beta ", beta.shape_str(), ", state ", state.shape_str(),
               ", out ", out.shape_str(),
               " (want f32 q, k [n, Hk, dk], v, out [n, Hv, dv], g, beta [n, Hv], state [Hv, dk, dv], Hv % Hk == 0)");
  const DeltaShape sh{q.shape[0], q.shape[1], v.shape[1], q.shape[2], v.shape[2]};
  if (sh.n == 0) return;
  const float* qp = q.ptr<float>();
  const float* kp = k.ptr<float>();
  const float* vp = v.ptr<float>();
  const float* gp = g.ptr<float>();
  const float* bp = beta.ptr<float>();
  float* sp = state.ptr<float>();
  float* op = out.ptr<float>();
  pool().parallel_for(sh.hv, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      float* S = sp + h * sh.dk * sh.dv;
      if (params.chunk_size == 0) recurrent_head(sh, h, qp, kp, vp, gp, bp, S, op);
      else chunked_head(sh, h, params.chunk_size, qp, kp, vp, gp, bp, S, op);
    }
  });
}

}  // namespace sluice
