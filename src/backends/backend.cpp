// Backend selection by name, and the defaults of optional ops.
#include "backends/backend.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/log.h"

namespace sluice {

bool cuda_built() {
#ifdef SLUICE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

#ifndef SLUICE_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int) {
  fail(Status::unsupported, "this sluice was built without CUDA (configure with -DSLUICE_CUDA=ON on a machine with nvcc)");
}
#endif

namespace {

// Backend::make_readback's default: to_host at begin.
class SyncReadback final : public HostReadback {
 public:
  SyncReadback(Backend& be, size_t bytes) : be_(be), bytes_(bytes) {}
  void begin(const Tensor& src) override {
    SLUICE_CHECK(src.nbytes() <= bytes_.size(), Status::internal, "readback of ", src.nbytes(), " bytes into ",
                 bytes_.size());
    n_ = src.nbytes();
    be_.to_host(src, bytes_.data());
  }
  void end(void* dst) override { std::memcpy(dst, bytes_.data(), n_); }

 private:
  Backend& be_;
  std::vector<uint8_t> bytes_;
  size_t n_ = 0;
};

}  // namespace

std::unique_ptr<HostReadback> Backend::make_readback(size_t bytes) { return std::make_unique<SyncReadback>(*this, bytes); }

void Backend::moe_routed(const ExpertTable&, const Tensor&, int64_t, bool, const Tensor&, const Tensor&,
                         const ReplayRows&) {
  fail(Status::internal, name(), ": moe_routed without an expert table (this backend routes on the host)");
}

void Backend::sample(const Tensor& logits, int64_t n_valid, const SampleRule& rule, const Tensor& uniform,
                     const Tensor& ids) {
  const int64_t n = logits.rows(), V = logits.cols();
  SLUICE_CHECK(logits.dtype == DType::f32 && logits.ndim == 2 && uniform.dtype == DType::i64 &&
                   ids.dtype == DType::i32 && uniform.numel() == n && ids.numel() == n && n_valid > 0 && n_valid <= V,
               Status::internal, name(), " sample: logits ", logits.shape_str(), ", n_valid ", n_valid, ", uniform ",
               uniform.shape_str(), ", ids ", ids.shape_str());
  std::vector<float> host(static_cast<size_t>(n * V));
  std::vector<int64_t> draws(static_cast<size_t>(n));
  std::vector<int32_t> out(static_cast<size_t>(n));
  to_host(logits, host.data());
  to_host(uniform, draws.data());
  SampleScratch scratch;
  for (int64_t r = 0; r < n; ++r)
    out[r] = sample_row(std::span<const float>(host).subspan(r * V, n_valid), rule,
                        static_cast<double>(draws[r]) * 0x1p-53, scratch);
  from_host(ids, out.data());
}

void Backend::get_rows_at(const Tensor& table, const Tensor& ids, const Tensor& out) {
  SLUICE_CHECK(ids.dtype == DType::i32, Status::internal, name(), " get_rows_at: ids must be i32");
  std::vector<int32_t> host(static_cast<size_t>(ids.numel()));
  to_host(ids, host.data());
  get_rows(table, host, out);
}

void Backend::scatter_rows_at(const Tensor& src, const Tensor& idx, const Tensor& dst) {
  SLUICE_CHECK(idx.dtype == DType::i32, Status::internal, name(), " scatter_rows_at: idx must be i32");
  std::vector<int32_t> host(static_cast<size_t>(idx.numel()));
  to_host(idx, host.data());
  scatter_rows(src, host, dst);
}

void Backend::add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) {
  add(x, y);
  rms_norm(x, w, eps, out);
}

void Backend::matmul_add_rms_norm(const Tensor& a, const Tensor& w, const Tensor& x, const Tensor& norm, float eps,
                                  const Tensor& out) {
  Tensor y = alloc(DType::f32, {x.rows(), x.cols()});
  matmul(a, w, y);
  add_rms_norm(x, y, norm, eps, out);
}

void Backend::attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                               const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin, int64_t rot_dim,
                               bool interleaved, const Tensor& k_cache, const Tensor& v_cache, int64_t n_past,
                               const Tensor& positions) {
  const int64_t n = q.shape[0], nh = q.shape[1], nkv = k.shape[1], d = q.shape[2];
  if (!q_norm.empty()) rms_norm(q.reshape({n * nh, d}), q_norm, eps, q.reshape({n * nh, d}));
  if (!k_norm.empty()) rms_norm(k.reshape({n * nkv, d}), k_norm, eps, k.reshape({n * nkv, d}));
  if (rot_dim > 0) {  // 0: a layer without rotary (Llama 4's NoPE layers); the tables go unread
    rope(q, cos, sin, rot_dim, interleaved);
    rope(k, cos, sin, rot_dim, interleaved);
  }
  if (positions.empty()) {
    copy(k, k_cache.slice_rows(n_past, n));  // a bf16 cache: rounded by the copy
    copy(v, v_cache.slice_rows(n_past, n));
  } else {
    const int64_t n_ctx = k_cache.shape[0];
    Tensor kr = k, vr = v;
    if (k_cache.dtype != DType::f32) {  // rows of the cache's dtype first (bf16: rounded)
      kr = alloc(k_cache.dtype, {n, nkv, d});
      vr = alloc(v_cache.dtype, {n, nkv, d});
      copy(k, kr);
      copy(v, vr);
    }
    scatter_rows_at(kr.reshape({n, nkv * d}), positions, k_cache.reshape({n_ctx, nkv * d}));
    scatter_rows_at(vr.reshape({n, nkv * d}), positions, v_cache.reshape({n_ctx, nkv * d}));
  }
}

void Backend::attention_inputs_rows(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                    const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin,
                                    int64_t rot_dim, bool interleaved, const RowCaches& caches) {
  for (int64_t b = 0; b < q.shape[0]; ++b) {
    const size_t i = static_cast<size_t>(b);
    attention_inputs(q.slice_rows(b, 1), k.slice_rows(b, 1), v.slice_rows(b, 1), q_norm, k_norm, eps,
                     cos.slice_rows(b, 1), sin.slice_rows(b, 1), rot_dim, interleaved, caches.k[i], caches.v[i],
                     caches.n_past[i], caches.positions.empty() ? Tensor{} : caches.positions.slice_rows(b, 1));
  }
}

void Backend::attention_rows(const Tensor& q, const Tensor& out, const RowCaches& caches, float scale,
                             int64_t sliding_window, const Tensor& sinks) {
  for (int64_t b = 0; b < q.shape[0]; ++b) {
    const size_t i = static_cast<size_t>(b);
    AttentionParams params;
    params.n_past = caches.n_past[i];
    params.n_past_at = caches.positions.empty() ? Tensor{} : caches.positions.slice_rows(b, 1);
    params.scale = scale;
    params.sliding_window = sliding_window;
    params.sinks = sinks;
    attention(q.slice_rows(b, 1), caches.k[i], caches.v[i], out.slice_rows(b, 1), params);
  }
}

void Backend::matmul_heads(const Tensor& x, const Tensor& w, const Tensor& y) {
  const int64_t n = x.shape[0], H = x.shape[1], k = x.shape[2], m = y.shape[2];
  SLUICE_CHECK(x.ndim == 3 && y.ndim == 3 && y.shape[0] == n && y.shape[1] == H && w.ndim == 2 && w.rows() == H * m &&
                   w.cols() == k,
               Status::internal, name(), " matmul_heads: x ", x.shape_str(), ", w ", w.shape_str(), ", y ", y.shape_str());
  const Tensor x2 = x.reshape({n, H * k}), y2 = y.reshape({n, H * m});
  Tensor xh = n == 1 ? Tensor{} : alloc(DType::f32, {n, k});
  Tensor yh = n == 1 ? Tensor{} : alloc(DType::f32, {n, m});
  for (int64_t h = 0; h < H; ++h) {
    const Tensor wh = w.slice_rows(h * m, m);
    if (n == 1) {  // one row: the head's columns are contiguous
      matmul(Tensor(DType::f32, {1, k}, x.ptr<float>() + h * k, x.storage), wh,
             Tensor(DType::f32, {1, m}, y.ptr<float>() + h * m, y.storage));
      continue;
    }
    copy_cols(x2, h * k, xh, 0, k);
    matmul(xh, wh, yh);
    copy_cols(yh, 0, y2, h * m, m);
  }
}

void Backend::write_rows(const Tensor& src, const Tensor& dst, int64_t row0, const Tensor& positions) {
  const int64_t n = src.rows();
  SLUICE_CHECK(src.dtype == DType::f32 && src.cols() == dst.cols() && (dst.dtype == DType::f32 || dst.dtype == DType::bf16) &&
                   (!positions.empty() || row0 + n <= dst.rows()),
               Status::internal, name(), " write_rows: src ", dtype_name(src.dtype), " ", src.shape_str(), " into ",
               dtype_name(dst.dtype), " ", dst.shape_str(), " at ", row0);
  if (positions.empty()) {
    copy(src, dst.slice_rows(row0, n));  // a bf16 dst: rounded by the copy
    return;
  }
  Tensor rows = src;
  if (dst.dtype != DType::f32) {
    rows = alloc(dst.dtype, {n, src.cols()});
    copy(src, rows);
  }
  scatter_rows_at(rows, positions, dst);
}

void Backend::attention_latent(const Tensor& q, const Tensor& cache, const Tensor& out, const AttentionParams& params) {
  const int64_t n = q.shape[0], H = q.shape[1], dk = q.shape[2], dv = out.shape[2];
  SLUICE_CHECK(q.ndim == 3 && out.ndim == 3 && out.shape[0] == n && out.shape[1] == H && dv <= dk &&
                   cache.ndim == 3 && cache.shape[1] == 1 && cache.shape[2] == dk,
               Status::internal, name(), " attention_latent: q ", q.shape_str(), ", cache ", cache.shape_str(), ", out ",
               out.shape_str());
  AttentionParams p;
  p.n_past = params.n_past;
  p.n_past_at = params.n_past_at;
  p.scale = params.scale;
  Tensor full = dv == dk ? out : alloc(DType::f32, {n, H, dk});
  attention(q, cache, cache, full, p);
  if (dv != dk) copy_cols(full.reshape({n * H, dk}), 0, out.reshape({n * H, dv}), 0, dv);
}

void Backend::attention_latent_rows(const Tensor& q, const Tensor& out, const RowCaches& caches, float scale) {
  for (int64_t b = 0; b < q.shape[0]; ++b) {
    const size_t i = static_cast<size_t>(b);
    AttentionParams params;
    params.n_past = caches.n_past[i];
    params.n_past_at = caches.positions.empty() ? Tensor{} : caches.positions.slice_rows(b, 1);
    params.scale = scale;
    attention_latent(q.slice_rows(b, 1), caches.k[i], out.slice_rows(b, 1), params);
  }
}

void Backend::set_kv_dtype(DType t) {
  SLUICE_CHECK(kv_dtype_supported(t), Status::unsupported, "the ", name(), " backend cannot hold a ", dtype_name(t),
               " KV cache", kv_dtype_supported(DType::bf16) ? " (f32 or bf16)" : " (f32 only so far)");
  kv_dtype_ = t;
}

void Backend::graph_begin() { fail(Status::unsupported, name(), ": no captured graphs"); }
std::unique_ptr<BackendGraph> Backend::graph_end() { fail(Status::unsupported, name(), ": no captured graphs"); }
void Backend::graph_launch(const BackendGraph&) { fail(Status::unsupported, name(), ": no captured graphs"); }

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda") return make_cuda_backend(0);
  if (name.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    long device = std::strtol(name.c_str() + 5, &end, 10);
    SLUICE_CHECK(end && *end == 0 && name.size() > 5 && device >= 0, Status::invalid_argument, "--backend ", name,
                 ": expected cuda:N");
    return make_cuda_backend(static_cast<int>(device));
  }
  if (name == "auto") {
    if (cuda_built()) {
      try {
        return make_cuda_backend(0);
      } catch (const Error& e) {
        LOG_INFO("no GPU backend (", e.what(), "); using the CPU");
      }
    }
    return make_cpu_backend();
  }
  fail(Status::invalid_argument, "unknown backend '", name, "' (cpu, cuda, cuda:N, auto)");
}

}  // namespace sluice
