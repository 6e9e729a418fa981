// make_cuda_streamer in builds without CUDA: a clear error.
#include "experts/streaming_provider.h"

namespace sluice {

#ifndef SLUICE_HAVE_CUDA
std::shared_ptr<StreamingProvider> make_cuda_streamer(std::shared_ptr<const Pack>, ExpertKind, int64_t, Backend&,
                                                      const StreamerOptions&) {
  fail(Status::unsupported, "expert streaming on CUDA: this sluice was built without CUDA (configure with ",
       "-DSLUICE_CUDA=ON on a machine with nvcc, or pass --backend cpu)");
}
#endif

}  // namespace sluice
