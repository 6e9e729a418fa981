// gpt-oss on the CUDA backend: attention sinks in every attention kernel (cuda_ops_test.cpp's
// AttentionSinksEveryKernel), experts with biases and the clamped SwiGLU through the device
// MoE kernels (an expert table, routed on the device, decode as one graph; cuda_moe_test.cpp
// checks the kernels), and with SLUICE_CUDA_HOST_ROUTED=1 through the generic ops, routed on
// the host. Against transformers within the CUDA decoder bound of 1e-3, with
// the greedy continuation; the CPU's bf16 KV cache reproduced; a pack's experts at bf16 (the
// MXFP4 fixture's exact values), q4 and mxfp4 match the CPU's run of the same pack; streamed
// experts route on the device too (cuda_streaming_test.cpp's FamiliesDeviceRoutedBehindTheSwitch;
// host-routed: HostRoutedFamiliesSameRoutingAndTokensAsTheCpu).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "tests/gpu/cuda_family_checks.h"
#include "format/npy.h"

using namespace sluice;
using namespace sluice::test;

namespace {

TEST(CudaGptOss, MatchesTransformersTeacherForcedDecodedAndGreedy) { expect_cuda_matches_transformers("gpt_oss"); }

TEST(CudaGptOss, Bf16KvCacheMatchesTheCpuBf16Cache) {
  auto cpu = make_cpu_backend(), gpu = make_cuda_backend(0);
  cpu->set_kv_dtype(DType::bf16);
  gpu->set_kv_dtype(DType::bf16);
  LoadedModel mc = load_model(fixture_dir("gpt_oss"), *cpu), mg = load_model(fixture_dir("gpt_oss"), *gpu);
  const FixtureReference ref = read_reference("gpt_oss");
  const std::vector<int32_t> ids = full_ids("gpt_oss");
  const int64_t V = mc.model->info().n_vocab, n = static_cast<int64_t>(ids.size()),
                n_cont = static_cast<int64_t>(ref.continuation_ids.size());
  std::vector<float> want(n * V), got(n * V);
  mc.model->forward(ids, *mc.model->new_state(n), want, true);
  decode_in_chunks(*mg.model, ids, ref.prompt_ids.size(), got);
  const float diff = max_abs_diff(got, want);
  std::printf("cuda gpt_oss bf16 KV cache: max |logit - cpu bf16| %.3g decoded\n", diff);
  EXPECT_LE(diff, kCudaLogitTolerance);
  EXPECT_EQ(greedy(*mg.model, ref.prompt_ids, n_cont), greedy(*mc.model, ref.prompt_ids, n_cont));
}

// Packs: the CPU's run of the same pack is the reference (the kinds' quantization is the
// same on both backends); the MXFP4 fixture's bf16 kind holds its exact values, so it is
// also within the bound of transformers.
TEST(CudaGptOss, PacksMatchTheCpu) {
  for (const std::string& fixture : gpt_oss_fixtures())
    for (DType kind : {DType::bf16, DType::q4}) {
      SCOPED_TRACE(fixture + " " + std::string(expert_kind_name(kind)));
      const std::vector<float> got = expect_cuda_pack_matches_the_cpu(fixture, kind);
      if (kind == DType::bf16) {
        NpyArray ref = read_npy(fixture_dir(fixture) / "logits_full.npy");
        EXPECT_LE(max_abs_diff(got, ref.data), kCudaLogitTolerance);
      }
    }
}

// MXFP4 experts through the generic products: the checkpoint as it ships against
// transformers, the pack's mxfp4 kind against the CPU's run of the same pack, resident and
// streamed (host-routed) with 4 slots.
TEST(CudaGptOss, Mxfp4Experts) {
  expect_cuda_matches_transformers("gpt_oss_mxfp4");
  expect_cuda_pack_matches_the_cpu("gpt_oss_mxfp4", DType::mxfp4);
  const std::vector<int32_t> ids = full_ids("gpt_oss_mxfp4");
  const std::vector<float> want = teacher_forced(fixture_pack("gpt_oss_mxfp4"), ids, {DType::mxfp4});
  auto gpu = make_cuda_backend(0);
  gpu->set_kv_dtype(DType::f32);
  LoadedModel m = load_model(fixture_pack("gpt_oss_mxfp4"), *gpu, streamed(DType::mxfp4, 4));
  std::vector<float> got_streamed(want.size());
  m.model->forward(ids, *m.model->new_state(static_cast<int64_t>(ids.size())), got_streamed, true);
  const float diff_streamed = max_abs_diff(got_streamed, want);
  std::printf("cuda gpt_oss_mxfp4 mxfp4 pack streamed, 4 slots: max |logit - cpu| %.3g\n", diff_streamed);
  EXPECT_LE(diff_streamed, kCudaLogitTolerance);
}

// The host-routed experts (SLUICE_CUDA_HOST_ROUTED=1, core/router_scoring.h: no expert tables,
// the MoE layers route on the host and compute through the generic ops, the path before the
// device kernels took gpt-oss's experts): both fixtures against transformers with the greedy
// continuation, and the packs' bf16, q4 and mxfp4 kinds against the CPU's run of the same pack.
TEST(CudaGptOss, HostRoutedExpertsBehindTheirSwitch) {
  const HostRouted host_routed;
  for (const std::string& fixture : gpt_oss_fixtures()) {
    SCOPED_TRACE(fixture + " host-routed");
    expect_cuda_matches_transformers(fixture);
    for (DType kind : {DType::bf16, DType::q4}) expect_cuda_pack_matches_the_cpu(fixture, kind);
  }
  expect_cuda_pack_matches_the_cpu("gpt_oss_mxfp4", DType::mxfp4);
}

}  // namespace
