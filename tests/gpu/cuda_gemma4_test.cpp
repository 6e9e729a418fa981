// Gemma 4 on the CUDA backend: its gelu_tanh gates (MLP, experts, per-layer inputs) and tanh
// logit softcap through the activate kernel, the experts routed on the device (an expert table
// with the per-expert scales; GeGLU in the device MoE kernels, cuda_moe_test.cpp), the full layers' head of twice the
// sliding layers' through the per-row attention kernels. Against transformers within the CUDA
// decoder bound of 1e-3,
// teacher-forced and decoded through the cache (f32 KV: a bf16 cache flips the routing at a
// few (position, layer) pairs of these fixtures, gemma4_test.cpp), with the greedy
// continuation; a pack's q4 experts against the CPU's run of the same pack. The same with
// SLUICE_CUDA_HOST_ROUTED=1, where the experts route on the host (per-expert scales there) and
// compute through the generic ops.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/gpu/cuda_family_checks.h"

using namespace sluice;
using namespace sluice::test;

namespace {

class CudaGemma4 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGemma4, MatchesTransformersTeacherForcedDecodedAndGreedy) { expect_cuda_matches_transformers(GetParam()); }

TEST_P(CudaGemma4, Q4PackMatchesTheCpu) { expect_cuda_pack_matches_the_cpu(GetParam(), DType::q4); }

TEST_P(CudaGemma4, HostRoutedExpertsBehindTheirSwitch) {
  const HostRouted host_routed;
  expect_cuda_matches_transformers(GetParam());
  expect_cuda_pack_matches_the_cpu(GetParam(), DType::q4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGemma4, ::testing::ValuesIn(gemma4_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
