// make_streamer: the streamer for a backend.
#include "experts/streaming_provider.h"

#include "experts/streamer.h"
#ifdef SLUICE_HAVE_CUDA
#include "experts/cuda/cuda_streamer.h"
#endif

namespace sluice {

std::shared_ptr<StreamingProvider> make_streamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k,
                                                 Backend& backend, const StreamerOptions& opt) {
#ifdef SLUICE_HAVE_CUDA
  if (auto cuda = make_cuda_streamer(pack, kind, top_k, backend, opt)) return cuda;  // slots in device memory
#endif
  return std::make_shared<ExpertStreamer>(std::move(pack), kind, top_k, opt);  // slots in host memory
}

}  // namespace sluice
