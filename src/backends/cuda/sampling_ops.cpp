// CudaBackend::sample: the sampling rule of core/sampling.h on the device (sample.cu).
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/sample.h"

namespace sluice {

static_assert(cuda::kSampleKernelMassOne == kSampleMassOne, "the device sums top-p masses as the host does");
static_assert(cuda::kSampleKernelGreedyTemperature == kGreedyTemperature, "the device is greedy where the host is");

void CudaBackend::sample(const Tensor& logits, int64_t n_valid, const SampleRule& rule, const Tensor& uniform,
                         const Tensor& ids) {
  const int64_t n = logits.rows(), V = logits.cols();
  SLUICE_CHECK(logits.dtype == DType::f32 && logits.ndim == 2 && uniform.dtype == DType::i64 &&
                   ids.dtype == DType::i32 && uniform.numel() == n && ids.numel() == n && n_valid > 0 && n_valid <= V,
               Status::internal, "cuda sample: logits ", logits.shape_str(), ", n_valid ", n_valid, ", uniform ",
               uniform.shape_str(), ", ids ", ids.shape_str());
  cuda::SampleParams p;
  p.logits = logits.ptr<float>();
  p.uniform = uniform.ptr<int64_t>();
  p.ids = ids.ptr<int32_t>();
  p.n = n;
  p.vocab = V;
  p.n_valid = n_valid;
  p.temperature = rule.temperature;
  p.top_k = rule.top_k;
  p.top_p = rule.top_p;
  Tensor partials;
  if (rule.temperature < cuda::kSampleKernelGreedyTemperature && n <= cuda::kSampleMaxRows) {  // greedy rows only
    static_assert(sizeof(cuda::GreedyPartial) == 3 * sizeof(int32_t));
    partials = alloc(DType::i32, {3 * cuda::sample_greedy_partials(n)});
    p.greedy_partials = reinterpret_cast<cuda::GreedyPartial*>(partials.ptr<int32_t>());
    p.greedy_counters = static_cast<int*>(sample_counters_.get());
  }
  cuda::launch_sample(p, stream_);
}

}  // namespace sluice
