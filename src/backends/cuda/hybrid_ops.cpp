// CudaBackend: the entry points of the hybrid families' ops (Gated DeltaNet, gated attention,
// QSA, hyper-connections, PLE): the CPU backend's shape checks, then a launcher of
// hybrid_kernels.h. Contracts: backends/backend.h; references: backends/cpu.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/hybrid_kernels.h"

namespace sluice {
namespace {

bool all_f32(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype != DType::f32) return false;
  return true;
}

// Product of all but the innermost dimension (unlike Tensor::rows, also right when cols is 0).
int64_t lead_rows(const Tensor& t) {
  int64_t n = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) n *= t.shape[i];
  return t.ndim ? n : 0;
}

// True when the byte ranges of a and b overlap.
bool overlaps(const Tensor& a, const Tensor& b) {
  auto pa = static_cast<const char*>(a.data), pb = static_cast<const char*>(b.data);
  return a.nbytes() && b.nbytes() && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

void CudaBackend::copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t n_cols) {
  SLUICE_CHECK(all_f32({&src, &dst}) && lead_rows(src) == lead_rows(dst) && src_col >= 0 && dst_col >= 0 &&
                   n_cols >= 0 && src_col + n_cols <= src.cols() && dst_col + n_cols <= dst.cols() &&
                   !overlaps(src, dst),
               Status::internal, "cuda copy_cols: src ", dtype_name(src.dtype), " ", src.shape_str(), " cols [",
               src_col, ", ", src_col + n_cols, "), dst ", dtype_name(dst.dtype), " ", dst.shape_str(), " from col ",
               dst_col, " (want f32, the same number of rows, ranges inside both, not overlapping)");
  cuda::launch_copy_cols(src.ptr<float>() + src_col, src.cols(), dst.ptr<float>() + dst_col, dst.cols(),
                         lead_rows(src), n_cols, stream_);
}

void CudaBackend::activate(const Tensor& x, Activation act, float in_div, float out_mul) {
  SLUICE_CHECK(x.dtype == DType::f32 && in_div != 0.0f, Status::internal, "cuda activate: x ", dtype_name(x.dtype),
               " ", x.shape_str(), ", in_div ", in_div, " (want f32, in_div != 0)");
  int code = cuda::kActSigmoid;
  switch (act) {
    case Activation::sigmoid: code = cuda::kActSigmoid; break;
    case Activation::silu: code = cuda::kActSilu; break;
    case Activation::gelu_tanh:
    case Activation::tanh:
      code = act == Activation::tanh ? cuda::kActTanh : cuda::kActGeluTanh;
      break;
  }
  cuda::launch_activate(x.ptr<float>(), x.numel(), code, in_div, out_mul, stream_);
}

void CudaBackend::mul(const Tensor& x, const Tensor& y) {
  const bool per_row = y.numel() != x.numel() && y.numel() == lead_rows(x) && y.cols() == 1;
  SLUICE_CHECK(all_f32({&x, &y}) && (y.numel() == x.numel() || per_row) && (x.data == y.data || !overlaps(x, y)),
               Status::internal, "cuda mul: x ", dtype_name(x.dtype), " ", x.shape_str(), ", y ", dtype_name(y.dtype),
               " ", y.shape_str(), " (want f32, y of x's size or [x.rows(), 1])");
  cuda::launch_mul(x.ptr<float>(), y.ptr<float>(), x.numel(), per_row ? x.cols() : 0, stream_);
}

void CudaBackend::rms_norm_groups(const Tensor& x, const Tensor& w, float eps, int64_t group, const Tensor& y) {
  SLUICE_CHECK(all_f32({&x, &y}) && x.numel() == y.numel() && x.cols() == y.cols() && group > 0 &&
                   x.cols() % group == 0 && (w.empty() || (w.dtype == DType::f32 && w.numel() == x.cols())),
               Status::internal, "cuda rms_norm_groups: x ", dtype_name(x.dtype), " ", x.shape_str(), ", w ",
               dtype_name(w.dtype), " ", w.shape_str(), ", group ", group, ", y ", dtype_name(y.dtype), " ",
               y.shape_str(), " (want f32 x, y [rows, c] with c % group == 0, w f32 [c] or empty)");
  if (x.cols() == 0) return;
  cuda::launch_rms_norm_groups(x.ptr<float>(), w.empty() ? nullptr : w.ptr<float>(), y.ptr<float>(), lead_rows(x),
                               x.cols(), group, eps, stream_);
}

void CudaBackend::causal_conv1d(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& out,
                                int64_t dilation, bool silu) {
  const int64_t n = lead_rows(x), c = x.cols(), K = w.cols();
  const int64_t S = (K - 1) * dilation;
  SLUICE_CHECK(all_f32({&x, &w, &state, &out}) && dilation >= 1 && K >= 1 && lead_rows(w) == c &&
                   out.numel() == x.numel() && out.cols() == c && state.cols() == c && lead_rows(state) == S &&
                   !overlaps(x, out) && !overlaps(state, out),
               Status::internal, "cuda causal_conv1d: x ", x.shape_str(), ", w ", w.shape_str(), ", state ",
               state.shape_str(), ", out ", out.shape_str(), ", dilation ", dilation,
               " (want f32 x, out [n, c], w [c, K], state [(K - 1) * dilation, c], out not overlapping)");
  cuda::Conv1dParams p{x.ptr<float>(), w.ptr<float>(), state.ptr<float>(), out.ptr<float>(), n, c, K, dilation, silu};
  cuda::launch_causal_conv1d(p, stream_);
}

void CudaBackend::delta_net_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                                  const Tensor& g, const Tensor& beta) {
  const int64_t H = a.cols();
  SLUICE_CHECK(all_f32({&a, &b, &A_log, &dt_bias, &g, &beta}) && b.numel() == a.numel() && g.numel() == a.numel() &&
                   beta.numel() == a.numel() && b.cols() == H && g.cols() == H && beta.cols() == H &&
                   A_log.numel() == H && dt_bias.numel() == H,
               Status::internal, "cuda delta_net_gates: a ", a.shape_str(), ", b ", b.shape_str(), ", A_log ",
               A_log.shape_str(), ", dt_bias ", dt_bias.shape_str(), ", g ", g.shape_str(), ", beta ",
               beta.shape_str(), " (want f32 a, b, g, beta [n, H], A_log and dt_bias [H])");
  cuda::launch_delta_net_gates(a.ptr<float>(), b.ptr<float>(), A_log.ptr<float>(), dt_bias.ptr<float>(),
                               g.ptr<float>(), beta.ptr<float>(), a.numel(), H, stream_);
}

void CudaBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                   const Tensor& beta, const Tensor& state, const Tensor& out,
                                   const DeltaRuleParams& params) {
  const bool shapes = q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3 && state.ndim == 3 &&
                      q.shape == k.shape && out.shape == v.shape && q.shape[0] == v.shape[0] && q.shape[1] > 0 &&
                      v.shape[1] % q.shape[1] == 0 && g.numel() == v.shape[0] * v.shape[1] &&
                      beta.numel() == g.numel() && state.shape[0] == v.shape[1] && state.shape[1] == q.shape[2] &&
                      state.shape[2] == v.shape[2];
  SLUICE_CHECK(all_f32({&q, &k, &v, &g, &beta, &state, &out}) && shapes && params.chunk_size >= 0 &&
                   !overlaps(out, state),
               Status::internal, "cuda gated_delta_rule: q ", q.shape_str(), ", k ", k.shape_str(), ", v ",
               v.shape_str(), ", g ", g.shape_str(), ", beta ", beta.shape_str(), ", state ", state.shape_str(),
               ", out ", out.shape_str(),
               " (want f32 q, k [n, Hk, dk], v, out [n, Hv, dv], g, beta [n, Hv], state [Hv, dk, dv], Hv % Hk == 0)");
  // chunk_size only selects the CPU's form; the kernel is the recurrent one (delta_net.cu).
  cuda::DeltaRuleKernelParams p{q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), g.ptr<float>(), beta.ptr<float>(),
                                state.ptr<float>(), out.ptr<float>(), q.shape[0], q.shape[1], v.shape[1], q.shape[2],
                                v.shape[2]};
  cuda::launch_gated_delta_rule(p, stream_);
}

void CudaBackend::hyper_mix(const Tensor& xn, const Tensor& logits, const Tensor& out) {
  const int64_t n = lead_rows(out), c = out.cols();
  const int64_t n_stream = c ? xn.cols() / c : 0;
  SLUICE_CHECK(all_f32({&xn, &logits, &out}) && c > 0 && n_stream > 0 && xn.cols() == n_stream * c &&
                   lead_rows(xn) == n && logits.numel() == xn.numel() && !overlaps(out, xn) && !overlaps(out, logits),
               Status::internal, "cuda hyper_mix: xn ", xn.shape_str(), ", logits ", logits.shape_str(), ", out ",
               out.shape_str(), " (want f32 xn, logits [n, n_stream * c], out [n, c])");
  cuda::launch_hyper_mix(xn.ptr<float>(), logits.ptr<float>(), out.ptr<float>(), n, n_stream, c, stream_);
}

void CudaBackend::hyper_inject(const Tensor& x, const Tensor& y, const Tensor& w) {
  const int64_t n = lead_rows(y), c = y.cols(), n_stream = w.cols();
  SLUICE_CHECK(all_f32({&x, &y, &w}) && c > 0 && n_stream > 0 && x.cols() == n_stream * c && lead_rows(x) == n &&
                   lead_rows(w) == n && !overlaps(x, y) && !overlaps(x, w),
               Status::internal, "cuda hyper_inject: x ", x.shape_str(), ", y ", y.shape_str(), ", w ", w.shape_str(),
               " (want f32 x [n, n_stream * c], y [n, c], w [n, n_stream])");
  cuda::launch_hyper_inject(x.ptr<float>(), y.ptr<float>(), w.ptr<float>(), n, n_stream, c, stream_);
}

void CudaBackend::ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& out) {
  const int64_t n = lead_rows(value), c = value.cols();
  const int64_t n_stream = c ? key.cols() / c : 0;
  SLUICE_CHECK(all_f32({&key, &query, &value, &out}) && c > 0 && n_stream > 0 && key.cols() == n_stream * c &&
                   lead_rows(key) == n && query.numel() == key.numel() && out.numel() == key.numel() &&
                   !overlaps(out, key) && !overlaps(out, query) && !overlaps(out, value),
               Status::internal, "cuda ple_gate: key ", key.shape_str(), ", query ", query.shape_str(), ", value ",
               value.shape_str(), ", out ", out.shape_str(),
               " (want f32 key, query, out [n, n_stream * c], value [n, c])");
  cuda::launch_ple_gate(key.ptr<float>(), query.ptr<float>(), value.ptr<float>(), out.ptr<float>(), n, n_stream, c,
                        stream_);
}

void CudaBackend::mean_rows(const Tensor& src, int64_t group, const Tensor& dst) {
  const int64_t m = lead_rows(dst), c = dst.cols();
  SLUICE_CHECK(all_f32({&src, &dst}) && group > 0 && src.cols() == c && lead_rows(src) == m * group &&
                   !overlaps(src, dst),
               Status::internal, "cuda mean_rows: src ", src.shape_str(), ", group ", group, ", dst ", dst.shape_str(),
               " (want f32 src [m * group, c], dst [m, c])");
  cuda::launch_mean_rows(src.ptr<float>(), dst.ptr<float>(), m, group, c, stream_);
}

void CudaBackend::qsa_select(const Tensor& q, const Tensor& block_keys, const Tensor& idx, const QsaParams& p) {
  const int64_t c = p.compress_ratio, k = p.block_topk;
  const bool shapes = q.ndim == 3 && block_keys.ndim == 2 && idx.ndim == 2 && c > 0 && k > 0 &&
                      block_keys.shape[1] == q.shape[2] && idx.shape[0] == q.shape[0] &&
                      idx.shape[1] == k * c + c - 1 && p.n_past >= 0 &&
                      block_keys.shape[0] >= (p.n_past + q.shape[0]) / c;
  SLUICE_CHECK(q.dtype == DType::f32 && block_keys.dtype == DType::f32 && idx.dtype == DType::i32 && shapes,
               Status::internal, "cuda qsa_select: q ", q.shape_str(), ", block_keys ", block_keys.shape_str(),
               ", idx ", dtype_name(idx.dtype), " ", idx.shape_str(), ", n_past ", p.n_past, ", compress_ratio ", c,
               ", block_topk ", k,
               " (want f32 q [n, n_head, d], block_keys [>= (n_past + n) / c, d], idx i32 [n, block_topk c + c - 1])");
  const int64_t n = q.shape[0], d = q.shape[2], stride = std::max<int64_t>(1, (p.n_past + n) / c);
  SLUICE_CHECK(stride <= INT32_MAX, Status::unsupported, "cuda qsa_select: ", stride, " key blocks");
  // The block scores of every query row and an index row for tie replays (freed after the
  // kernel: cudaFree waits for it).
  Tensor scratch = alloc(DType::i32, {2, n, stride});
  cuda::QsaSelectParams kp{q.ptr<float>(), block_keys.ptr<float>(), idx.ptr<int32_t>(),
                           static_cast<uint32_t*>(scratch.data), scratch.ptr<int32_t>() + n * stride, stride, n,
                           q.shape[1], d, p.n_past, c, k,
                           idx.shape[1], static_cast<float>(std::sqrt(static_cast<double>(d)))};
  cuda::launch_qsa_select(kp, stream_);
}

void CudaBackend::attention_indexed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& idx,
                                    const Tensor& out, float scale) {
  SLUICE_CHECK(all_f32({&q, &k, &v, &out}) && idx.dtype == DType::i32 && q.ndim == 3 && k.ndim == 3 && v.ndim == 3 &&
                   out.ndim == 3 && idx.ndim == 2 && k.shape == v.shape && out.shape == q.shape &&
                   k.shape[2] == q.shape[2] && k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0 &&
                   idx.shape[0] == q.shape[0] && !overlaps(out, q),
               Status::internal, "cuda attention_indexed: q ", q.shape_str(), ", k ", k.shape_str(), ", v ",
               v.shape_str(), ", idx ", dtype_name(idx.dtype), " ", idx.shape_str(), ", out ", out.shape_str(),
               " (want f32 q, out [n, n_head, d], k, v [n_ctx, n_kv_head, d], idx i32 [n, m])");
  cuda::AttentionIndexedParams p{q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), idx.ptr<int32_t>(),
                                 out.ptr<float>(), q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[0],
                                 idx.shape[1], scale};
  cuda::launch_attention_indexed(p, stream_);
}

}  // namespace sluice
