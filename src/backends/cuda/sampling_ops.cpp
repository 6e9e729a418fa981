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
  // Rows take many blocks a row (sample.cu, sample_blocks.cu): their scratch, i32 words: for
  // a sampled rule with top-k or top-p the rows' states [n] (SampleSelectRow, 8-byte words
  // first), then the greedy partials [n][B] (3 words each), then for a sampled rule the rows'
  // maxima [n] (3 words each) and the blocks' sums [n][B] (f32). More rows than the backend
  // keeps counters for draw in the one-block kernel (sample.cu).
  const bool greedy = rule.temperature < cuda::kSampleKernelGreedyTemperature;
  Tensor partials;
  if (n <= cuda::kSampleMaxRows) {
    static_assert(sizeof(cuda::GreedyPartial) == 3 * sizeof(int32_t) && sizeof(float) == sizeof(int32_t));
    static_assert(sizeof(cuda::SampleSelectRow) % 8 == 0);
    const bool select = !greedy && !cuda::sample_by_temperature_alone(rule.temperature, rule.top_k, rule.top_p, n_valid);
    const int64_t parts = cuda::sample_greedy_partials(n);
    const int64_t select_words = select ? n * static_cast<int64_t>(sizeof(cuda::SampleSelectRow) / 4) : 0;
    partials = alloc(DType::i32, {select_words + 3 * parts + (greedy ? 0 : 3 * n + parts)});
    int32_t* words = partials.ptr<int32_t>();
    if (select) p.select = reinterpret_cast<cuda::SampleSelectRow*>(words);
    words += select_words;
    p.greedy_partials = reinterpret_cast<cuda::GreedyPartial*>(words);
    p.greedy_counters = static_cast<int*>(sample_counters_.get());
    if (!greedy) {
      p.row_best = reinterpret_cast<cuda::GreedyPartial*>(words + 3 * parts);
      p.block_sums = reinterpret_cast<float*>(words + 3 * parts + 3 * n);
    }
  }
  cuda::launch_sample(p, stream_);
}

}  // namespace sluice
