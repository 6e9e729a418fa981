// Llama 4 on the CUDA backend: chunked attention and the NoPE layers' temperature in every
// attention kernel (cuda_ops_test.cpp's AttentionChunksAndTemperatureEveryKernel), the
// experts with their inputs scaled by the sigmoid routing weights on the device (an expert
// table: the sigmoid top-k, the pairs' inputs scaled, the decode step one graph;
// cuda_moe_test.cpp checks the kernels), and with SLUICE_CUDA_HOST_ROUTED=1 routed on the host
// through the generic ops.
// Against transformers within the CUDA decoder bound of 1e-3, teacher-forced and decoded
// through the cache, with the greedy continuation; a pack's q4 experts match the CPU's run of
// the same pack. Streamed Llama 4 experts route on the device too
// (cuda_streaming_test.cpp's FamiliesDeviceRoutedBehindTheSwitch; host-routed:
// HostRoutedFamiliesSameRoutingAndTokensAsTheCpu).
#include <gtest/gtest.h>

#include "tests/gpu/cuda_family_checks.h"

using namespace sluice;
using namespace sluice::test;

namespace {

class CudaLlama4 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaLlama4, MatchesTransformersTeacherForcedDecodedAndGreedy) { expect_cuda_matches_transformers(GetParam()); }

TEST_P(CudaLlama4, Q4PackMatchesTheCpu) { expect_cuda_pack_matches_the_cpu(GetParam(), DType::q4); }

TEST_P(CudaLlama4, HostRoutedExpertsBehindTheirSwitch) {
  const HostRouted host_routed;
  expect_cuda_matches_transformers(GetParam());
  expect_cuda_pack_matches_the_cpu(GetParam(), DType::q4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaLlama4, ::testing::ValuesIn(llama4_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
