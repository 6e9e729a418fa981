// CudaBackend: memory, transfers and the op entry points (shape checks, then a launcher).
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/cuda/attention_decode.h"
#include "backends/cuda/sample.h"
#include "backends/cuda/gemm_bf16.h"
#include "backends/cuda/graph_profile.h"
#include "backends/cuda/kernels.h"
#include "core/log.h"
#include "core/quant.h"
#include "core/switches.h"

#include "backends/cuda/cuda_check.h"

namespace sluice {
namespace {

cuda::WType wtype_of(const Tensor& t, const char* op) { return cuda::float_wtype_of(t.dtype, op); }

void check_f32(const Tensor& t, const char* op, const char* what) {
  SLUICE_CHECK(t.dtype == DType::f32, Status::internal, "cuda ", op, ": ", what, " must be f32, is ",
               dtype_name(t.dtype));
}

// gpt-oss's attention sinks as the kernels take them: [n_head] f32 on the device, or null.
const float* sinks_of(const Tensor& sinks, int64_t n_head) {
  if (sinks.empty()) return nullptr;
  SLUICE_CHECK(sinks.dtype == DType::f32 && sinks.numel() == n_head, Status::internal, "cuda attention: sinks ",
               dtype_name(sinks.dtype), " ", sinks.shape_str(), " for ", n_head, " heads (want f32 [n_head])");
  return sinks.ptr<float>();
}

// Whether the K and V caches are bf16 (else f32; both the same: Backend::kv_dtype).
bool kv_bf16_of(const Tensor& k, const Tensor& v, const char* op) {
  SLUICE_CHECK(k.dtype == v.dtype && (k.dtype == DType::f32 || k.dtype == DType::bf16), Status::internal, "cuda ",
               op, ": caches ", dtype_name(k.dtype), " and ", dtype_name(v.dtype), " (want both f32 or both bf16)");
  return k.dtype == DType::bf16;
}

std::shared_ptr<void> device_alloc(size_t bytes, int device) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
  SLUICE_CHECK(err == cudaSuccess, Status::out_of_memory, "cuda: cannot allocate ", bytes, " bytes on device ",
               device, ": ", cudaGetErrorString(err));
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  SLUICE_CHECK(err == cudaSuccess && count > 0, Status::unsupported, "no usable CUDA device (",
               err == cudaSuccess ? "none found" : cudaGetErrorString(err), ")");
  SLUICE_CHECK(device >= 0 && device < count, Status::invalid_argument, "CUDA device ", device, " does not exist (",
               count, " found)");
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  name_ = str("cuda:", device, " (", prop.name, ")");
  pool_ = std::make_shared<cuda::DevicePool>(device);
  graphs_enabled_ = switches::on(Switch::cuda_graphs);
  pinned_ = std::make_unique<cuda::PinnedRing>();
  sample_counters_ = device_alloc(cuda::kSampleMaxRows * sizeof(int), device);
  norm_counter_ = device_alloc(sizeof(int), device);
  CUDA_CHECK(cudaMemsetAsync(norm_counter_.get(), 0, sizeof(int), stream_));
  CUDA_CHECK(cudaMemsetAsync(sample_counters_.get(), 0, cuda::kSampleMaxRows * sizeof(int), stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  cublas_.reset();
  pinned_.reset();
  if (readback_) cudaFreeHost(readback_);
  pool_->release_cached();  // blocks still owned by tensors return to the pool, freed with it
  if (stream_) cudaStreamDestroy(stream_);
}

Tensor CudaBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t(dtype, shape, nullptr);
  auto mem = (capture_pool_ ? capture_pool_ : pool_)->get(t.nbytes());
  t.data = mem.get();
  t.storage = std::move(mem);
  return t;
}

Tensor CudaBackend::upload(const Tensor& host) {
  Tensor t = host;
  const size_t data_bytes = host.nbytes(), scale_bytes = host.scale_nbytes();
  const size_t scale_offset = (data_bytes + 15) / 16 * 16;  // kernels load scales as f32 / half2
  auto mem = device_alloc(scale_offset + scale_bytes, device_);
  t.data = mem.get();
  // On the backend's stream (non-blocking: plain cudaMemcpy runs on the legacy stream, which
  // it does not wait for, and a pageable copy returns before its DMA has landed), then wait,
  // since the caller may free `host` at once.
  CUDA_CHECK(cudaMemcpyAsync(t.data, host.data, data_bytes, cudaMemcpyHostToDevice, stream_));
  if (scale_bytes) {
    t.scales = static_cast<char*>(t.data) + scale_offset;
    CUDA_CHECK(cudaMemcpyAsync(t.scales, host.scales, scale_bytes, cudaMemcpyHostToDevice, stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  t.storage = std::move(mem);
  return t;
}

void CudaBackend::to_host(const Tensor& src, void* dst) {
  SLUICE_CHECK(!capture_pool_, Status::internal, "cuda: to_host while capturing a graph");
  const size_t bytes = src.nbytes();
  if (bytes > 0 && bytes <= kReadbackMax) {
    if (bytes > readback_bytes_) {
      if (readback_) cudaFreeHost(readback_);
      readback_ = nullptr;
      readback_bytes_ = 0;
      const size_t want = std::max<size_t>(bytes, size_t{1} << 20);
      if (cudaHostAlloc(&readback_, want, cudaHostAllocDefault) == cudaSuccess) readback_bytes_ = want;
      else readback_ = nullptr;  // no page-locked memory to spare: the pageable copy below
    }
    if (readback_) {
      CUDA_CHECK(cudaMemcpyAsync(readback_, src.data, bytes, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      std::memcpy(dst, readback_, bytes);
      return;
    }
  }
  CUDA_CHECK(cudaMemcpyAsync(dst, src.data, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

namespace {

// HostReadback on CUDA: a page-locked buffer and an event after the copy into it.
class CudaReadback final : public HostReadback {
 public:
  CudaReadback(cudaStream_t stream, size_t bytes) : stream_(stream), bytes_(bytes) {
    CUDA_CHECK(cudaHostAlloc(&buf_, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~CudaReadback() override {
    cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
    cudaFreeHost(buf_);
  }
  CudaReadback(const CudaReadback&) = delete;
  CudaReadback& operator=(const CudaReadback&) = delete;
  void begin(const Tensor& src) override {
    SLUICE_CHECK(src.nbytes() <= bytes_, Status::internal, "cuda readback of ", src.nbytes(), " bytes into ", bytes_);
    cudaEventSynchronize(done_);  // the copy before into this buffer (normally long done)
    n_ = src.nbytes();
    CUDA_CHECK(cudaMemcpyAsync(buf_, src.data, n_, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaEventRecord(done_, stream_));
  }
  void end(void* dst) override {
    CUDA_CHECK(cudaEventSynchronize(done_));
    std::memcpy(dst, buf_, n_);
  }

 private:
  cudaStream_t stream_;
  size_t bytes_, n_ = 0;
  void* buf_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace

std::unique_ptr<HostReadback> CudaBackend::make_readback(size_t bytes) {
  return std::make_unique<CudaReadback>(stream_, bytes);
}

void CudaBackend::from_host(const Tensor& dst, const void* src) { copy_from_host(dst.data, src, dst.nbytes()); }

void CudaBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  SLUICE_CHECK(!capture_pool_, Status::internal, "cuda: from_host while capturing a graph");
  if (bytes == 0 || pinned_->copy_async(dst, src, bytes, stream_)) return;
  // Larger than a pinned slot (weights, whole tables): a pageable copy, then wait, since the
  // caller may reuse src at once.
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  SLUICE_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), Status::internal, "cuda copy: ",
               src.shape_str(), " to ", dst.shape_str());
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill(const Tensor& dst, float value) {
  check_f32(dst, "fill", "dst");
  cuda::launch_fill(dst.ptr<float>(), value, dst.numel(), stream_);
}

void CudaBackend::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// Free device memory as the driver reports it (blocks cached in the pools not counted).
std::optional<uint64_t> CudaBackend::memory_available() const {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(device_) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
    return std::nullopt;
  return free_bytes;
}

std::shared_ptr<void> CudaBackend::stage(const void* host, size_t bytes) {
  SLUICE_CHECK(!capture_pool_, Status::internal, "cuda: a host array passed to an op while capturing a graph");
  auto mem = pool_->get(bytes);
  copy_from_host(mem.get(), host, bytes);
  return mem;
}

void CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& y) {
  check_f32(x, "matmul", "x");
  check_f32(y, "matmul", "y");
  const int64_t n = x.rows(), k = x.cols(), m = w.rows();
  SLUICE_CHECK(w.cols() == k && y.rows() == n && y.cols() == m, Status::internal, "cuda matmul: x ", x.shape_str(),
               ", w ", w.shape_str(), ", y ", y.shape_str());
  if (dtype_is_quantized(w.dtype))
    SLUICE_CHECK(w.scales != nullptr || m == 0, Status::internal, "cuda matmul: quantized weight without scales");
  if (n == 0 || m == 0) return;
  const cuda::MatmulParams mp{x.ptr<float>(), w.data, w.scales, cuda::matmul_wtype_of(w.dtype, "matmul"), y.ptr<float>(),
                              n, m, k};
  if (n <= cuda::kMatvecMaxRows) {  // decode: bandwidth-bound, every weight byte read once
    cuda::launch_matvec(mp, stream_);
  } else if (n <= cuda::kMatvecBatchRows && m < cuda::kMatvecPassMaxCols) {  // batch decode (kernels.h)
    for (int64_t r0 = 0; r0 < n; r0 += cuda::kMatvecMaxRows) {
      cuda::MatmulParams pass = mp;
      pass.x += r0 * k;
      pass.y += r0 * m;
      pass.n = std::min(cuda::kMatvecMaxRows, n - r0);
      cuda::launch_matvec(pass, stream_);
    }
  } else if (mp.wtype == cuda::WType::bf16 && k % 4 == 0 && (reinterpret_cast<uintptr_t>(mp.x) & 15) == 0 &&
             cuda::cublas_enabled()) {  // prefill of bf16 weights: cuBLAS (gemm_bf16.h)
    if (!cublas_) cublas_ = std::make_unique<cuda::CublasGemm>(device_, stream_);
    Tensor parts = alloc(DType::bf16, {3, std::min(n, cuda::CublasGemm::rows_per_pass(k)), k});
    cublas_->bf16(mp.x, mp.w, mp.y, n, m, k, parts.data);
  } else {  // prefill: shared-memory tiles, a weight element read once per 64 rows
    cuda::launch_matmul_tiled(mp, stream_);
  }
}

void CudaBackend::matmul_add_rms_norm(const Tensor& a, const Tensor& w, const Tensor& x, const Tensor& norm, float eps,
                                      const Tensor& out) {
  check_f32(a, "matmul_add_rms_norm", "a");
  check_f32(x, "matmul_add_rms_norm", "x");
  check_f32(out, "matmul_add_rms_norm", "out");
  const int64_t n = a.rows(), k = a.cols(), m = w.rows();
  SLUICE_CHECK(w.cols() == k && x.rows() == n && x.cols() == m && out.numel() == x.numel() &&
                   (norm.empty() || norm.numel() == m) && (!dtype_is_quantized(w.dtype) || w.scales || m == 0),
               Status::internal, "cuda matmul_add_rms_norm: a ", a.shape_str(), ", w ", w.shape_str(), ", x ",
               x.shape_str(), ", norm ", norm.shape_str());
  if (!cuda::matvec_add_rms_norm_supported(n, m, x.data, out.data)) {
    Backend::matmul_add_rms_norm(a, w, x, norm, eps, out);
    return;
  }
  const cuda::MatmulParams mp{a.ptr<float>(), w.data, w.scales, cuda::matmul_wtype_of(w.dtype, "matmul"), x.ptr<float>(),
                              n, m, k};
  cuda::MatvecResidualNorm rn;
  rn.norm_w = norm.empty() ? nullptr : norm.data;
  rn.norm_type = norm.empty() ? cuda::WType::f32 : wtype_of(norm, "matmul_add_rms_norm");
  rn.h = out.ptr<float>();
  rn.eps = eps;
  rn.counter = static_cast<int*>(norm_counter_.get());
  cuda::launch_matvec_add_rms_norm(mp, rn, stream_);
}

void CudaBackend::add_bias(const Tensor& y, const Tensor& b) {
  check_f32(y, "add_bias", "y");
  SLUICE_CHECK(b.numel() == y.cols(), Status::internal, "cuda add_bias: y ", y.shape_str(), ", b ", b.shape_str());
  cuda::launch_add_bias(y.ptr<float>(), b.data, wtype_of(b, "add_bias"), y.rows(), y.cols(), stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
  check_f32(x, "rms_norm", "x");
  check_f32(y, "rms_norm", "y");
  SLUICE_CHECK(x.numel() == y.numel() && (w.empty() || w.numel() == x.cols()), Status::internal,
               "cuda rms_norm: x ", x.shape_str(), ", w ", w.shape_str(), ", y ", y.shape_str());
  cuda::launch_rms_norm(x.ptr<float>(), w.empty() ? nullptr : w.data, w.empty() ? cuda::WType::f32 : wtype_of(w, "rms_norm"),
                        y.ptr<float>(), x.rows(), x.cols(), eps, stream_);
}

void CudaBackend::add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) {
  check_f32(x, "add_rms_norm", "x");
  check_f32(y, "add_rms_norm", "y");
  check_f32(out, "add_rms_norm", "out");
  SLUICE_CHECK(x.numel() == y.numel() && x.numel() == out.numel() && (w.empty() || w.numel() == x.cols()),
               Status::internal, "cuda add_rms_norm: x ", x.shape_str(), ", y ", y.shape_str(), ", w ", w.shape_str(),
               ", out ", out.shape_str());
  cuda::launch_add_rms_norm(x.ptr<float>(), y.ptr<float>(), w.empty() ? nullptr : w.data,
                            w.empty() ? cuda::WType::f32 : wtype_of(w, "add_rms_norm"), out.ptr<float>(), x.rows(), x.cols(), eps,
                            stream_);
}

void CudaBackend::attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                   const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin,
                                   int64_t rot_dim, bool interleaved, const Tensor& k_cache, const Tensor& v_cache,
                                   int64_t n_past, const Tensor& positions) {
  attention_inputs_launch(q, k, v, q_norm, k_norm, eps, cos, sin, rot_dim, interleaved, k_cache, v_cache, n_past,
                          positions, nullptr);
}

void CudaBackend::attention_inputs_launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                          const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin,
                                          int64_t rot_dim, bool interleaved, const Tensor& k_cache,
                                          const Tensor& v_cache, int64_t n_past, const Tensor& positions,
                                          const cuda::RowCachePtrs* rows) {
  const int64_t n = q.shape[0], nh = q.shape[1], nkv = k.shape[1], d = q.shape[2];
  SLUICE_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && k.shape[0] == n && v.shape[0] == n && k.shape[2] == d &&
                   v.shape[1] == nkv && v.shape[2] == d && k_cache.ndim == 3 && k_cache.shape[1] == nkv &&
                   k_cache.shape[2] == d && v_cache.numel() == k_cache.numel() && cos.rows() == n &&
                   (rot_dim == 0 || cos.cols() == rot_dim / 2) && (q_norm.empty() || q_norm.numel() == d) &&
                   (k_norm.empty() || k_norm.numel() == d) && (positions.empty() || positions.numel() == n) &&
                   (!positions.empty() || n_past + n <= k_cache.shape[0]),
               Status::internal, "cuda attention_inputs: q ", q.shape_str(), ", k ", k.shape_str(), ", cache ",
               k_cache.shape_str(), ", rot ", rot_dim, ", n_past ", n_past);
  SLUICE_CHECK(positions.empty() || positions.dtype == DType::i32, Status::internal,
               "cuda attention_inputs: positions must be i32");
  cuda::AttentionInputsParams a;
  a.q = q.ptr<float>();
  a.k = k.ptr<float>();
  a.v = v.ptr<float>();
  a.q_norm = q_norm.empty() ? nullptr : q_norm.data;
  a.q_norm_wtype = q_norm.empty() ? cuda::WType::f32 : wtype_of(q_norm, "attention_inputs");
  a.k_norm = k_norm.empty() ? nullptr : k_norm.data;
  a.k_norm_wtype = k_norm.empty() ? cuda::WType::f32 : wtype_of(k_norm, "attention_inputs");
  a.eps = eps;
  a.cos = cos.ptr<float>();
  a.sin = sin.ptr<float>();
  a.rot = rot_dim;
  a.interleaved = interleaved;
  a.k_cache = k_cache.data;
  a.v_cache = v_cache.data;
  a.kv_bf16 = kv_bf16_of(k_cache, v_cache, "attention_inputs");
  a.positions = positions.empty() ? nullptr : positions.ptr<int32_t>();
  a.n_past = n_past;
  a.n = n;
  a.nh = nh;
  a.nkv = nkv;
  a.d = d;
  a.rows = rows;
  cuda::launch_attention_inputs(a, stream_);
}

// A batch step's positions on the device: caches.positions, or n_past staged (eagerly only).
std::shared_ptr<void> CudaBackend::row_positions(const RowCaches& caches, int64_t n, const int32_t** dev) {
  if (!caches.positions.empty()) {
    SLUICE_CHECK(caches.positions.dtype == DType::i32 && caches.positions.numel() == n, Status::internal,
                 "cuda: batch positions ", caches.positions.shape_str(), " for ", n, " rows");
    *dev = caches.positions.ptr<int32_t>();
    return nullptr;
  }
  std::vector<int32_t> pos(caches.n_past.begin(), caches.n_past.end());
  auto staged = stage(pos.data(), pos.size() * sizeof(int32_t));
  *dev = static_cast<const int32_t*>(staged.get());
  return staged;
}

// Row b's caches into ptrs; false when the batch cannot take the one-launch kernels. Every
// row's caches of row 0's dtype (f32 or bf16).
static bool row_cache_ptrs(const Backend::RowCaches& caches, int64_t n, int64_t nkv, int64_t d,
                           cuda::RowCachePtrs& ptrs) {
  if (n > cuda::kMaxCacheRows || static_cast<int64_t>(caches.k.size()) != n ||
      static_cast<int64_t>(caches.v.size()) != n || static_cast<int64_t>(caches.n_past.size()) != n)
    return false;
  for (int64_t b = 0; b < n; ++b) {
    const Tensor &kc = caches.k[static_cast<size_t>(b)], &vc = caches.v[static_cast<size_t>(b)];
    kv_bf16_of(kc, vc, "batch caches");
    SLUICE_CHECK(kc.ndim == 3 && kc.shape[1] == nkv && kc.shape[2] == d && vc.numel() == kc.numel() &&
                     kc.dtype == caches.k[0].dtype && caches.n_past[static_cast<size_t>(b)] < kc.shape[0],
                 Status::internal, "cuda batch caches: row ", b, " cache ", dtype_name(kc.dtype), " ",
                 kc.shape_str(), " at ", caches.n_past[static_cast<size_t>(b)], " for heads of ", nkv, " x ", d,
                 " (every row ", dtype_name(caches.k[0].dtype), ")");
    ptrs.k[b] = kc.data;
    ptrs.v[b] = vc.data;
    if (((reinterpret_cast<uintptr_t>(ptrs.k[b]) | reinterpret_cast<uintptr_t>(ptrs.v[b])) & 15) != 0) return false;
  }
  return true;
}

void CudaBackend::attention_inputs_rows(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                        const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin,
                                        int64_t rot_dim, bool interleaved, const RowCaches& caches) {
  const int64_t n = q.shape[0];
  cuda::RowCachePtrs ptrs{};
  if (n == 1 || q.ndim != 3 || k.ndim != 3 || !row_cache_ptrs(caches, n, k.shape[1], q.shape[2], ptrs)) {
    Backend::attention_inputs_rows(q, k, v, q_norm, k_norm, eps, cos, sin, rot_dim, interleaved, caches);
    return;
  }
  const int32_t* pos = nullptr;
  auto staged = row_positions(caches, n, &pos);
  const Tensor positions(DType::i32, {n}, const_cast<int32_t*>(pos));
  attention_inputs_launch(q, k, v, q_norm, k_norm, eps, cos, sin, rot_dim, interleaved, caches.k[0], caches.v[0], 0,
                          positions, &ptrs);
}

void CudaBackend::attention_rows(const Tensor& q, const Tensor& out, const RowCaches& caches, float scale,
                                 int64_t sliding_window, const Tensor& sinks) {
  const int64_t n = q.shape[0];
  cuda::RowCachePtrs ptrs{};
  if (n == 1 || q.ndim != 3 || caches.k.empty() || caches.k[0].ndim != 3 ||
      !cuda::attention_decode_rows_supported(q.shape[1], caches.k[0].shape[1], q.shape[2], n) ||
      !row_cache_ptrs(caches, n, caches.k[0].shape[1], q.shape[2], ptrs) ||
      ((reinterpret_cast<uintptr_t>(q.data) | reinterpret_cast<uintptr_t>(out.data)) & 15) != 0) {
    Backend::attention_rows(q, out, caches, scale, sliding_window, sinks);
    return;
  }
  SLUICE_CHECK(out.numel() == q.numel(), Status::internal, "cuda attention_rows: q ", q.shape_str(), ", out ",
               out.shape_str());
  const int64_t hq = q.shape[1], hkv = caches.k[0].shape[1], d = q.shape[2];
  int64_t n_ctx = 0;
  for (const Tensor& kc : caches.k) n_ctx = std::max(n_ctx, kc.shape[0]);
  const int32_t* pos = nullptr;
  auto staged = row_positions(caches, n, &pos);
  decode_attention({.q = q.ptr<float>(), .kv_bf16 = kv_bf16_of(caches.k[0], caches.v[0], "attention_rows"),
                    .out = out.ptr<float>(),
                    .hq = hq, .hkv = hkv, .d = d, .n_ctx = n_ctx, .n_past_dev = pos, .scale = scale,
                    .window = sliding_window, .sinks = sinks_of(sinks, hq), .n_rows = n, .rows = &ptrs});
}

void CudaBackend::decode_attention(cuda::AttentionDecodeParams a) {
  const int64_t rows = a.rows ? a.n_rows : 1;
  Tensor partials = alloc(DType::f32, {rows * cuda::attention_decode_partial_floats(a.hq, a.hkv, a.d, a.n_ctx)});
  a.partials = partials.ptr<float>();
  cuda::launch_attention_decode(a, stream_);
}

Tensor CudaBackend::concat_rows(std::span<const Tensor> parts) {
  SLUICE_CHECK(!parts.empty(), Status::internal, "cuda concat_rows: no parts");
  const Tensor& first = parts[0];
  int64_t rows = 0;
  for (const Tensor& t : parts) {
    if (t.ndim != 2 || t.dtype != first.dtype || t.cols() != first.cols() || t.data == nullptr) return {};
    rows += t.rows();
  }
  Tensor all(first.dtype, {rows, first.cols()}, nullptr);
  const size_t data_bytes = all.nbytes(), scale_bytes = all.scale_nbytes();
  const size_t scale_offset = (data_bytes + 15) / 16 * 16;  // as upload
  auto mem = device_alloc(scale_offset + scale_bytes, device_);
  all.data = mem.get();
  if (scale_bytes) all.scales = static_cast<char*>(all.data) + scale_offset;
  size_t data_at = 0, scale_at = 0;
  for (const Tensor& t : parts) {
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(all.data) + data_at, t.data, t.nbytes(), cudaMemcpyDeviceToDevice,
                               stream_));
    data_at += t.nbytes();
    if (scale_bytes) {
      CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(all.scales) + scale_at, t.scales, t.scale_nbytes(),
                                 cudaMemcpyDeviceToDevice, stream_));
      scale_at += t.scale_nbytes();
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // the parts may be freed once this returns
  all.storage = std::move(mem);
  return all;
}

void CudaBackend::rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim, bool interleaved) {
  check_f32(x, "rope", "x");
  SLUICE_CHECK(x.ndim == 3 && rot_dim <= x.shape[2] && rot_dim % 2 == 0 && cos.rows() == x.shape[0] &&
                   cos.cols() == rot_dim / 2 && sin.numel() == cos.numel(),
               Status::internal, "cuda rope: x ", x.shape_str(), ", cos ", cos.shape_str(), ", rot ", rot_dim);
  cuda::launch_rope(x.ptr<float>(), cos.ptr<float>(), sin.ptr<float>(), x.shape[0], x.shape[1], x.shape[2], rot_dim,
                    interleaved, stream_);
}

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const AttentionParams& p) {
  SLUICE_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.numel() == q.numel() && k.shape[2] == q.shape[2] &&
                   q.shape[1] % k.shape[1] == 0 && p.n_past + q.shape[0] <= k.shape[0],
               Status::internal, "cuda attention: q ", q.shape_str(), ", k ", k.shape_str(), ", n_past ", p.n_past);
  SLUICE_CHECK(p.n_past_at.empty() || p.n_past_at.dtype == DType::i32, Status::internal,
               "cuda attention: n_past_at must be i32");

  const int64_t n_ctx = k.shape[0], hq = q.shape[1], hkv = k.shape[1], d = q.shape[2];
  const bool kv_bf16 = kv_bf16_of(k, v, "attention");
  if (q.shape[0] == 1 && cuda::attention_decode_supported(hq, hkv, d, q.data, k.data, v.data)) {
    // Decode: the context split over many blocks (attention_decode.cu).
    decode_attention({.q = q.ptr<float>(), .k = k.data, .v = v.data, .kv_bf16 = kv_bf16, .out = out.ptr<float>(),
                      .hq = hq, .hkv = hkv, .d = d, .n_ctx = n_ctx, .n_past = p.n_past,
                      .n_past_dev = p.n_past_at.empty() ? nullptr : p.n_past_at.ptr<int32_t>(), .scale = p.scale,
                      .window = p.sliding_window, .sinks = sinks_of(p.sinks, hq), .chunk = p.chunk,
                      .temperature_floor_scale = p.temperature_floor_scale,
                      .temperature_attn_scale = p.temperature_attn_scale});
    return;
  }
  cuda::AttentionParams ap;
  ap.q = q.ptr<float>();
  ap.k = k.data;
  ap.v = v.data;
  ap.kv_bf16 = kv_bf16;
  ap.out = out.ptr<float>();
  ap.n = q.shape[0];
  ap.hq = q.shape[1];
  ap.hkv = k.shape[1];
  ap.d = q.shape[2];
  ap.n_past = p.n_past;
  ap.n_past_dev = p.n_past_at.empty() ? nullptr : p.n_past_at.ptr<int32_t>();
  ap.scale = p.scale;
  ap.window = p.sliding_window;
  ap.sinks = sinks_of(p.sinks, hq);
  ap.chunk = p.chunk;
  ap.temperature_floor_scale = p.temperature_floor_scale;
  ap.temperature_attn_scale = p.temperature_attn_scale;
  cuda::launch_attention_at(ap, stream_);
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  SLUICE_CHECK(gate.numel() == up.numel() && gate.numel() == out.numel(), Status::internal, "cuda swiglu shapes");
  cuda::launch_swiglu(gate.ptr<float>(), up.ptr<float>(), out.ptr<float>(), gate.numel(), stream_);
}

void CudaBackend::swiglu_clamped(const Tensor& gate, const Tensor& up, const Tensor& out, float alpha, float limit) {
  SLUICE_CHECK(gate.numel() == up.numel() && gate.numel() == out.numel(), Status::internal,
               "cuda swiglu_clamped shapes");
  cuda::launch_swiglu_clamped(gate.ptr<float>(), up.ptr<float>(), out.ptr<float>(), gate.numel(), alpha, limit,
                              stream_);
}

void CudaBackend::add(const Tensor& x, const Tensor& y) {
  SLUICE_CHECK(x.numel() == y.numel(), Status::internal, "cuda add: ", x.shape_str(), " + ", y.shape_str());
  cuda::launch_add(x.ptr<float>(), y.ptr<float>(), x.numel(), stream_);
}

void CudaBackend::clamp(const Tensor& x, float lo, float hi) {
  check_f32(x, "clamp", "x");
  cuda::launch_clamp(x.ptr<float>(), lo, hi, x.numel(), stream_);
}

void CudaBackend::get_rows(const Tensor& table, std::span<const int32_t> ids, const Tensor& out) {
  const int64_t n = static_cast<int64_t>(ids.size()), cols = table.cols();
  SLUICE_CHECK(out.rows() == n && out.cols() == cols, Status::internal, "cuda get_rows: table ", table.shape_str(),
               ", out ", out.shape_str());
  for (int32_t id : ids)
    SLUICE_CHECK(id >= 0 && id < table.rows(), Status::invalid_argument, "row id ", id, " outside [0, ", table.rows(), ")");
  auto staged = stage(ids.data(), ids.size_bytes());
  auto* d_ids = static_cast<const int32_t*>(staged.get());
  cuda::launch_get_rows(table.data, table.scales, cuda::wtype_of(table.dtype, "get_rows"), d_ids, out.ptr<float>(), n,
                        cols, table.rows(), stream_);
}

void CudaBackend::gather_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& out) {
  const int64_t n = static_cast<int64_t>(idx.size());
  SLUICE_CHECK(out.rows() == n && out.cols() == src.cols(), Status::internal, "cuda gather_rows shapes");
  auto staged = stage(idx.data(), idx.size_bytes());
  auto* d_idx = static_cast<const int32_t*>(staged.get());
  cuda::launch_gather_rows(src.ptr<float>(), d_idx, out.ptr<float>(), n, src.cols(), stream_);
}

void CudaBackend::scatter_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& dst) {
  const int64_t n = static_cast<int64_t>(idx.size());
  SLUICE_CHECK(src.rows() == n && src.cols() == dst.cols(), Status::internal, "cuda scatter_rows shapes");
  auto staged = stage(idx.data(), idx.size_bytes());
  auto* d_idx = static_cast<const int32_t*>(staged.get());
  cuda::launch_scatter_rows(src.ptr<float>(), d_idx, dst.ptr<float>(), n, src.cols(), stream_);
}

void CudaBackend::moe_combine(const Tensor& expert_out, std::span<const float> weights, int64_t k, const Tensor& out) {
  const int64_t n = out.rows();
  SLUICE_CHECK(expert_out.rows() == n * k && expert_out.cols() == out.cols() &&
                   static_cast<int64_t>(weights.size()) == n * k,
               Status::internal, "cuda moe_combine shapes");
  auto staged = stage(weights.data(), weights.size_bytes());
  auto* d_w = static_cast<const float*>(staged.get());
  cuda::launch_moe_combine(expert_out.ptr<float>(), d_w, out.ptr<float>(), n, k, out.cols(), stream_);
}

void CudaBackend::get_rows_at(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const int64_t n = ids.numel(), cols = table.cols();
  SLUICE_CHECK(ids.dtype == DType::i32 && out.rows() == n && out.cols() == cols, Status::internal,
               "cuda get_rows_at: table ", table.shape_str(), ", ids ", ids.shape_str(), ", out ", out.shape_str());
  cuda::launch_get_rows(table.data, table.scales, cuda::wtype_of(table.dtype, "get_rows"), ids.ptr<int32_t>(),
                        out.ptr<float>(), n, cols, table.rows(), stream_);
}

void CudaBackend::scatter_rows_at(const Tensor& src, const Tensor& idx, const Tensor& dst) {
  const int64_t n = idx.numel();
  SLUICE_CHECK(idx.dtype == DType::i32 && src.rows() == n && src.cols() == dst.cols(), Status::internal,
               "cuda scatter_rows_at: src ", src.shape_str(), ", idx ", idx.shape_str(), ", dst ", dst.shape_str());
  cuda::launch_scatter_rows(src.ptr<float>(), idx.ptr<int32_t>(), dst.ptr<float>(), n, src.cols(), stream_);
}

namespace {
struct CudaGraph final : BackendGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::shared_ptr<cuda::DevicePool> pool;  // the memory the graph's ops use
  ~CudaGraph() override {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};
}  // namespace

void CudaBackend::graph_begin() {
  SLUICE_CHECK(graphs_enabled_ && !capture_pool_, Status::internal, "cuda: graph_begin ",
               capture_pool_ ? "inside a capture" : "with graphs disabled (SLUICE_CUDA_GRAPHS=0)");
  capture_pool_ = std::make_shared<cuda::DevicePool>(device_);
  // Relaxed: the pool may cudaMalloc while capturing.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
}

std::unique_ptr<BackendGraph> CudaBackend::graph_end() {
  SLUICE_CHECK(capture_pool_ != nullptr, Status::internal, "cuda: graph_end without graph_begin");
  auto g = std::make_unique<CudaGraph>();
  g->pool = std::move(capture_pool_);
  capture_pool_ = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &g->graph));
  CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
  if (switches::on(Switch::cuda_profile)) cuda::profile_graph(g->graph, g->exec, stream_);
  return g;
}

void CudaBackend::graph_launch(const BackendGraph& graph) {
  const auto* g = dynamic_cast<const CudaGraph*>(&graph);
  SLUICE_CHECK(g && g->exec, Status::internal, "cuda: graph_launch of a graph this backend did not capture");
  CUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
}

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

namespace cuda {

WType wtype_of(DType t, const char* op) {
  switch (t) {
    case DType::f32: return WType::f32;
    case DType::f16: return WType::f16;
    case DType::bf16: return WType::bf16;
    case DType::q8: return WType::q8;
    case DType::q4: return WType::q4;
    case DType::q2: return WType::q2;
    default: break;
  }
  fail(Status::unsupported, "cuda ", op, ": weight dtype ", dtype_name(t), " is not supported");
}

WType matmul_wtype_of(DType t, const char* op) {
  if (t == DType::mxfp4) return WType::mxfp4;
  return wtype_of(t, op);
}

WType float_wtype_of(DType t, const char* op) {
  SLUICE_CHECK(dtype_is_float(t), Status::unsupported, "cuda ", op, ": weight dtype ", dtype_name(t),
               " is not supported yet");
  return wtype_of(t, op);
}

}  // namespace cuda

}  // namespace sluice
