// Placeholders for the device MoE launchers of moe_kernels.h until the kernels land (branch
// cuda-resident): a clear unsupported error, so that everything links meanwhile. Removed when
// that branch is merged.
#include "backends/cuda/moe_kernels.h"

#include "core/error.h"

namespace sluice::cuda {

void launch_router_topk(const float*, int64_t, int64_t, int64_t, bool, int32_t*, float*, Stream) {
  fail(Status::unsupported, "cuda: the device router (launch_router_topk) is not in this build yet");
}
void launch_moe_experts(const float*, const int32_t*, const ExpertRef*, uint8_t*, float*, float*, const MoeShape&,
                        Stream) {
  fail(Status::unsupported, "cuda: the device expert dispatch (launch_moe_experts) is not in this build yet");
}
void launch_moe_combine_done(const float*, const float*, const uint8_t*, float*, const MoeShape&, Stream) {
  fail(Status::unsupported, "cuda: the device combine (launch_moe_combine_done) is not in this build yet");
}

}  // namespace sluice::cuda
