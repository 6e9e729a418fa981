// CPU attention: causal grouped-query attention over a KV cache, one (query row, head) pair
// at a time, pairs spread over the thread pool. The caches are f32 or bf16 (Backend::kv_dtype):
// a bf16 element is read as its exact f32 value, so a bf16 cache gives the bits an f32 cache
// holding the same rounded values gives.
//
// For query row i (position p = n_past + i) and head h, with kv head g = h / (n_head /
// n_kv_head) and visible keys j in [j0, p] (j0 = 0, or p - sliding_window + 1 clamped at 0, or
// with chunks at least p - p % chunk), scale times the temperature of p where that is tuned:
//   s_j = cpu::dot(q, k_j) * scale                 (canonical 8-lane dot, then one multiply)
//   m = max(max_j s_j, sink_h)                      (sink_h = -inf without sinks)
//   e_j = exp(s_j - m)                              (cpu::exp8)
//   sum = 8-lane f32 sum of e_j over j, hsum8       (lane (j - j0) % 8, blocks in j order),
//         + exp(sink_h - m) with sinks (gpt-oss: the sink takes mass but no value)
//   out[c] = sum over j in order of fma(e_j * (1 / sum), v_j[c], acc)
// Nothing depends on n or on the other rows, so decoding token by token gives the same bits
// as a batched prefill.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <new>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

struct AttnShape {
  int64_t n_head, d;
  int64_t kv_stride;  // floats between consecutive positions of k and v: n_kv_head * d
};

// One (query, head): q[d], keys and values of kv head g at positions [j0, j1), out[d]; the
// caches' elements of dtype KV (f32 or bf16, read as their exact f32 values).
// s: scratch of at least j1 - j0 + 8 floats.
template <DType KV>
void attend_one(const float* q, const cpu::elem_t<KV>* k, const cpu::elem_t<KV>* v, float* out, int64_t j0,
                int64_t j1, float scale, float sink, const AttnShape& sh, float* s) {
  const int64_t len = j1 - j0, d = sh.d;
  int64_t j = 0;
  for (; j + 4 <= len; j += 4) {
    cpu::dot4<KV>(q, k + (j0 + j) * sh.kv_stride, sh.kv_stride, d, s + j);
    for (int r = 0; r < 4; ++r) s[j + r] *= scale;
  }
  for (; j < len; ++j) s[j] = cpu::dot<KV>(q, k + (j0 + j) * sh.kv_stride, d) * scale;

  __m256 vmax = _mm256_set1_ps(-__builtin_inff());
  for (j = 0; j + 8 <= len; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  float mx = cpu::hmax8(vmax);
  for (; j < len; ++j) mx = std::max(mx, s[j]);
  mx = std::max(mx, sink);  // -inf without sinks: no change

  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 vsum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= len; j += 8) {
    __m256 e = cpu::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
    _mm256_storeu_ps(s + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  if (j < len) {  // zero-padded lanes would give exp(0 - mx); mask them out of the sum
    int64_t r = len - j;
    __m256 e = cpu::exp8(_mm256_sub_ps(cpu::load8_tail<DType::f32>(s + j, r), vmx));
    alignas(32) float buf[8];
    _mm256_store_ps(buf, e);
    for (int64_t l = r; l < 8; ++l) buf[l] = 0.0f;
    e = _mm256_load_ps(buf);
    cpu::store8_tail(s + j, e, r);
    vsum = _mm256_add_ps(vsum, e);
  }
  float total = cpu::hsum8(vsum);
  if (sink != -__builtin_inff()) total += std::exp(sink - mx);
  const float inv = 1.0f / total;
  for (j = 0; j < len; ++j) s[j] *= inv;

  // out = sum_j s_j * v_j, 32 output dims at a time in registers, j in order.
  int64_t c = 0;
  for (; c + 32 <= d; c += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const cpu::elem_t<KV>* vp = v + j0 * sh.kv_stride + c;
    for (j = 0; j < len; ++j, vp += sh.kv_stride) {
      __m256 p = _mm256_set1_ps(s[j]);
      a0 = _mm256_fmadd_ps(p, cpu::load8<KV>(vp), a0);
      a1 = _mm256_fmadd_ps(p, cpu::load8<KV>(vp + 8), a1);
      a2 = _mm256_fmadd_ps(p, cpu::load8<KV>(vp + 16), a2);
      a3 = _mm256_fmadd_ps(p, cpu::load8<KV>(vp + 24), a3);
    }
    _mm256_storeu_ps(out + c, a0);
    _mm256_storeu_ps(out + c + 8, a1);
    _mm256_storeu_ps(out + c + 16, a2);
    _mm256_storeu_ps(out + c + 24, a3);
  }
  for (; c < d; c += 8) {
    int64_t r = std::min<int64_t>(8, d - c);
    __m256 a = _mm256_setzero_ps();
    const cpu::elem_t<KV>* vp = v + j0 * sh.kv_stride + c;
    for (j = 0; j < len; ++j, vp += sh.kv_stride) {
      __m256 vv = r == 8 ? cpu::load8<KV>(vp) : cpu::load8_tail<KV>(vp, r);
      a = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), vv, a);
    }
    if (r == 8) _mm256_storeu_ps(out + c, a);
    else cpu::store8_tail(out + c, a, r);
  }
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const AttentionParams& params) {
  const bool kv_bf16 = k.dtype == DType::bf16;
  SLUICE_CHECK(q.dtype == DType::f32 && (k.dtype == DType::f32 || kv_bf16) && v.dtype == k.dtype &&
                   out.dtype == DType::f32 && q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3 &&
                   k.shape == v.shape && out.shape == q.shape && k.shape[2] == q.shape[2] && k.shape[1] > 0 &&
                   q.shape[1] % k.shape[1] == 0 && params.n_past >= 0 && params.sliding_window >= 0 && params.chunk >= 0 &&
                   k.shape[0] >= params.n_past + q.shape[0],
               Status::internal, "cpu attention: q ", q.shape_str(), ", k ", k.shape_str(), ", v ",
               v.shape_str(), ", out ", out.shape_str(), ", n_past ", params.n_past, ", sliding_window ",
               params.sliding_window,
               " (want f32 q, out [n, n_head, d], k, v [n_ctx >= n_past + n, n_kv_head, d] both f32 or both bf16,",
               " n_head % n_kv_head == 0)");
  const int64_t n = q.shape[0];
  const AttnShape sh{q.shape[1], q.shape[2], k.shape[1] * q.shape[2]};
  if (n == 0 || sh.n_head == 0 || sh.d == 0) return;
  const int64_t group = sh.n_head / k.shape[1];  // query heads per kv head
  std::vector<float> sinks(static_cast<size_t>(sh.n_head), -__builtin_inff());  // [n_head]
  if (!params.sinks.empty()) {
    SLUICE_CHECK(params.sinks.numel() == sh.n_head && dtype_is_float(params.sinks.dtype), Status::internal,
                 "cpu attention: sinks ", dtype_name(params.sinks.dtype), " ", params.sinks.shape_str(), " for ",
                 sh.n_head, " heads");
    dtype_row_to_f32(params.sinks.data, params.sinks.dtype, sh.n_head, sinks.data());
  }
  const float* qp = q.ptr<float>();
  float* op = out.ptr<float>();
  const size_t scores_len = static_cast<size_t>(params.n_past + n + 8);
  std::atomic<bool> out_of_memory{false};
  pool().parallel_for(n * sh.n_head, 1, [&](int64_t u0, int64_t u1) {
    std::unique_ptr<float[]> scores(new (std::nothrow) float[scores_len]);
    if (!scores) {  // a pool task must not throw: the caller reports it
      out_of_memory = true;
      return;
    }
    for (int64_t u = u0; u < u1; ++u) {
      int64_t i = u / sh.n_head, h = u % sh.n_head, g = h / group;
      int64_t p = params.n_past + i;
      int64_t j0 = params.sliding_window > 0 ? std::max<int64_t>(0, p - params.sliding_window + 1) : 0;
      if (params.chunk > 0) j0 = std::max(j0, p - p % params.chunk);
      float scale = params.scale;
      if (params.temperature_floor_scale > 0)  // as transformers' f32 attn_scales (on q: the same on q.k)
        scale *= std::log1p(std::floor((static_cast<float>(p) + 1.0f) / static_cast<float>(params.temperature_floor_scale))) *
                     params.temperature_attn_scale +
                 1.0f;
      const float sink = sinks[static_cast<size_t>(h)];
      if (kv_bf16)
        attend_one<DType::bf16>(qp + u * sh.d, k.ptr<uint16_t>() + g * sh.d, v.ptr<uint16_t>() + g * sh.d,
                                op + u * sh.d, j0, p + 1, scale, sink, sh, scores.get());
      else
        attend_one<DType::f32>(qp + u * sh.d, k.ptr<float>() + g * sh.d, v.ptr<float>() + g * sh.d, op + u * sh.d,
                               j0, p + 1, scale, sink, sh, scores.get());
    }
  });
  SLUICE_CHECK(!out_of_memory, Status::out_of_memory, "cpu attention: ", scores_len * 4, " bytes of scores");
}

}  // namespace sluice
