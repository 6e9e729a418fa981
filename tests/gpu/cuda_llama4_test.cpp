// Llama 4 on the CUDA backend: chunked attention and the NoPE layers' temperature in every
// attention kernel (cuda_ops_test.cpp's AttentionChunksAndTemperatureEveryKernel), the
// experts with their inputs scaled by the sigmoid routing weights and the shared expert through
// the generic ops (routed on the host: by default the backend builds no expert table for
// them), and with SLUICE_CUDA_UNVERIFIED=1 on the device (an expert table: the sigmoid top-k,
// the pairs' inputs scaled, the decode step one graph; cuda_moe_test.cpp checks the kernels).
// Against transformers within the CUDA decoder bound of 1e-3, teacher-forced and decoded
// through the cache, with the greedy continuation; a pack's q4 experts match the CPU's run of
// the same pack. Streamed Llama 4 experts take the streamer's host-routed path
// (cuda_streaming_test.cpp's HostRoutedFamiliesSameRoutingAndTokensAsTheCpu).
#include <gtest/gtest.h>

#include "cuda_family_checks.h"

using namespace sluice;
using namespace sluice::test;

namespace {

class CudaLlama4 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaLlama4, MatchesTransformersTeacherForcedDecodedAndGreedy) { expect_cuda_matches_transformers(GetParam()); }

TEST_P(CudaLlama4, Q4PackMatchesTheCpu) { expect_cuda_pack_matches_the_cpu(GetParam(), DType::q4); }

TEST_P(CudaLlama4, DeviceRoutedExpertsBehindTheirSwitch) {
  const UnverifiedOptIn opt_in;
  expect_cuda_matches_transformers(GetParam());
  expect_cuda_pack_matches_the_cpu(GetParam(), DType::q4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaLlama4, ::testing::ValuesIn(llama4_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
