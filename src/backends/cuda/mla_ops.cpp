// CudaBackend's multi-head latent attention ops (cuda_backend.h; models/mla.h): matmul_heads
// (one launch for a decode step's rows, else a product a head on the tensor-core path),
// attention_latent (attention_latent.cu, one sequence or a batch step's rows with caches of
// their own), and the head size the expanded form pads to.
#include <algorithm>

#include "backends/cuda/attention_latent.h"
#include "backends/cuda/cuda_backend.h"

namespace sluice {

void CudaBackend::matmul_heads(const Tensor& x, const Tensor& w, const Tensor& y) {
  const int64_t n = x.shape[0], H = x.shape[1], k = x.shape[2], m = y.shape[2];
  const bool float_weights = w.dtype == DType::f32 || w.dtype == DType::bf16 || w.dtype == DType::f16;
  if (n > cuda::kMatmulHeadsMaxRows || !float_weights || x.ndim != 3 || y.ndim != 3) {
    Backend::matmul_heads(x, w, y);  // a product a head (tensor cores for many rows)
    return;
  }
  SLUICE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && y.shape[0] == n && y.shape[1] == H &&
                   w.rows() == H * m && w.cols() == k,
               Status::internal, "cuda matmul_heads: x ", x.shape_str(), ", w ", w.shape_str(), ", y ", y.shape_str());
  cuda::launch_matmul_heads(x.ptr<float>(), w.data, cuda::float_wtype_of(w.dtype, "matmul_heads"), y.ptr<float>(), n,
                            H, m, k, stream_);
}

void CudaBackend::attention_latent(const Tensor& q, const Tensor& cache, const Tensor& out,
                                   const AttentionParams& params) {
  const int64_t n = q.shape[0], H = q.shape[1], dk = q.shape[2], dv = out.shape[2];
  SLUICE_CHECK(q.ndim == 3 && out.ndim == 3 && out.shape[0] == n && out.shape[1] == H && cache.ndim == 3 &&
                   cache.shape[1] == 1 && cache.shape[2] == dk && params.n_past + n <= cache.shape[0] &&
                   (cache.dtype == DType::f32 || cache.dtype == DType::bf16),
               Status::internal, "cuda attention_latent: q ", q.shape_str(), ", cache ", dtype_name(cache.dtype), " ",
               cache.shape_str(), ", out ", out.shape_str(), " at ", params.n_past);
  SLUICE_CHECK(params.n_past_at.empty() || params.n_past_at.dtype == DType::i32, Status::internal,
               "cuda attention_latent: n_past_at must be i32");
  if (!cuda::latent_attention_supported(dk, dv, n, false)) {
    Backend::attention_latent(q, cache, out, params);
    return;
  }
  Tensor partials = alloc(DType::f32, {cuda::latent_attention_partial_floats(n, H, dv, cache.shape[0])});
  cuda::LatentAttentionParams a;
  a.q = q.ptr<float>();
  a.cache = cache.data;
  a.bf16 = cache.dtype == DType::bf16;
  a.out = out.ptr<float>();
  a.partials = partials.ptr<float>();
  a.n_rows = n;
  a.H = H;
  a.dk = dk;
  a.dv = dv;
  a.n_ctx = cache.shape[0];
  a.n_past = params.n_past;
  a.n_past_dev = params.n_past_at.empty() ? nullptr : params.n_past_at.ptr<int32_t>();
  a.scale = params.scale;
  cuda::launch_latent_attention(a, stream_);
}

void CudaBackend::attention_latent_rows(const Tensor& q, const Tensor& out, const RowCaches& caches, float scale) {
  const int64_t n = q.shape[0];
  if (n == 1 || q.ndim != 3 || out.ndim != 3 || static_cast<int64_t>(caches.k.size()) != n ||
      !cuda::latent_attention_supported(q.shape[2], out.shape[2], n, true)) {
    Backend::attention_latent_rows(q, out, caches, scale);
    return;
  }
  cuda::RowCachePtrs ptrs{};
  int64_t n_ctx = 0;
  for (int64_t b = 0; b < n; ++b) {
    const Tensor& c = caches.k[static_cast<size_t>(b)];
    SLUICE_CHECK(c.ndim == 3 && c.shape[1] == 1 && c.shape[2] == q.shape[2] && c.dtype == caches.k[0].dtype &&
                     caches.n_past[static_cast<size_t>(b)] < c.shape[0],
                 Status::internal, "cuda attention_latent_rows: row ", b, " cache ", dtype_name(c.dtype), " ",
                 c.shape_str(), " at ", caches.n_past[static_cast<size_t>(b)], " for keys of ", q.shape[2]);
    ptrs.k[b] = c.data;
    n_ctx = std::max(n_ctx, c.shape[0]);
  }
  const int32_t* pos = nullptr;
  auto staged = row_positions(caches, n, &pos);
  Tensor partials = alloc(DType::f32, {cuda::latent_attention_partial_floats(n, q.shape[1], out.shape[2], n_ctx)});
  cuda::LatentAttentionParams a;
  a.q = q.ptr<float>();
  a.rows = &ptrs;
  a.bf16 = caches.k[0].dtype == DType::bf16;
  a.out = out.ptr<float>();
  a.partials = partials.ptr<float>();
  a.n_rows = n;
  a.H = q.shape[1];
  a.dk = q.shape[2];
  a.dv = out.shape[2];
  a.n_ctx = n_ctx;
  a.n_past_dev = pos;
  a.scale = scale;
  cuda::launch_latent_attention(a, stream_);
}

void CudaBackend::write_rows(const Tensor& src, const Tensor& dst, int64_t row0, const Tensor& positions) {
  const int64_t n = src.rows();
  SLUICE_CHECK(src.dtype == DType::f32 && src.cols() == dst.cols() && (dst.dtype == DType::f32 || dst.dtype == DType::bf16) &&
                   (positions.empty() ? row0 + n <= dst.rows() : positions.dtype == DType::i32 && positions.numel() == n),
               Status::internal, "cuda write_rows: src ", dtype_name(src.dtype), " ", src.shape_str(), " into ",
               dtype_name(dst.dtype), " ", dst.shape_str(), " at ", row0);
  cuda::launch_write_rows(src.ptr<float>(), dst.data, dst.dtype == DType::bf16,
                          positions.empty() ? nullptr : positions.ptr<int32_t>(), row0, n, src.cols(), stream_);
}

// The flash kernel's sizes (attention_flash.cu: 64, 128 or 256 dims) for heads up to 256; past
// them, the row kernel's any size.
int64_t CudaBackend::attention_padded_dim(int64_t d) const {
  for (int64_t size : {64, 128, 256})
    if (d <= size) return size;
  return d;
}

}  // namespace sluice
