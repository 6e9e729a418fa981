// gpt-oss on the CUDA backend: attention sinks in every attention kernel (cuda_ops_test.cpp's
// AttentionSinksEveryKernel), experts with biases and the clamped SwiGLU through the generic
// ops (routed on the host: the device MoE kernels compute plain SwiGLU, so the backend builds
// no expert table for them). Against transformers within the CUDA decoder bound of 1e-3, with
// the greedy continuation; the CPU's bf16 KV cache reproduced; a pack's experts at bf16 (the
// MXFP4 fixture's exact values) and q4 match the CPU's run of the same pack. What the CUDA
// backend does not take yet is refused in one line: mxfp4 weights (unless SLUICE_CUDA_MXFP4=1
// runs the unverified kernels) and streamed experts with biases.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "../models/fixture_util.h"
#include "../models/pack_util.h"
#include "format/npy.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

constexpr float kCudaLogitTolerance = 1e-3f;  // the CUDA decoder fixtures' bound (cuda_parity_test.cpp)

TEST(CudaGptOss, MatchesTransformersTeacherForcedDecodedAndGreedy) {
  auto gpu = make_cuda_backend(0);
  gpu->set_kv_dtype(DType::f32);
  LoadedModel m = load_model(fixture_dir("gpt_oss"), *gpu);
  const ReferenceRun r = run_against_reference(*m.model, "gpt_oss");
  std::printf("cuda gpt_oss: max |logit - reference| %.3g teacher-forced, %.3g decoded\n", r.forced, r.decoded);
  EXPECT_LE(r.forced, kCudaLogitTolerance);
  EXPECT_LE(r.decoded, kCudaLogitTolerance);
  EXPECT_EQ(r.continuation, read_reference("gpt_oss").continuation_ids);
}

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
      const std::vector<int32_t> ids = full_ids(fixture);
      const std::vector<float> want = teacher_forced(fixture_pack(fixture), ids, {kind});
      auto gpu = make_cuda_backend(0);
      gpu->set_kv_dtype(DType::f32);
      LoadedModel m = load_model(fixture_pack(fixture), *gpu, {kind});
      const int64_t n = static_cast<int64_t>(ids.size());
      std::vector<float> got(want.size());
      m.model->forward(ids, *m.model->new_state(n), got, true);
      const float diff = max_abs_diff(got, want);
      std::printf("cuda %s %s pack: max |logit - cpu| %.3g\n", fixture.c_str(),
                  std::string(expert_kind_name(kind)).c_str(), diff);
      EXPECT_LE(diff, kCudaLogitTolerance);
      if (kind == DType::bf16) {
        NpyArray ref = read_npy(fixture_dir(fixture) / "logits_full.npy");
        EXPECT_LE(max_abs_diff(got, ref.data), kCudaLogitTolerance);
      }
    }
}

// MXFP4 experts through the generic products, behind SLUICE_CUDA_MXFP4=1 (cuda/wtype.h: not
// verified on a GPU when written): the checkpoint as it ships against transformers, and the
// pack's mxfp4 kind against the CPU's run of the same pack.
TEST(CudaGptOss, Mxfp4ExpertsBehindTheirSwitch) {
  setenv("SLUICE_CUDA_MXFP4", "1", 1);
  auto gpu = make_cuda_backend(0);
  gpu->set_kv_dtype(DType::f32);
  {
    LoadedModel m = load_model(fixture_dir("gpt_oss_mxfp4"), *gpu);
    const ReferenceRun r = run_against_reference(*m.model, "gpt_oss_mxfp4");
    std::printf("cuda gpt_oss mxfp4 checkpoint: max |logit - reference| %.3g teacher-forced, %.3g decoded\n", r.forced,
                r.decoded);
    EXPECT_LE(r.forced, kCudaLogitTolerance);
    EXPECT_LE(r.decoded, kCudaLogitTolerance);
    EXPECT_EQ(r.continuation, read_reference("gpt_oss_mxfp4").continuation_ids);
  }
  const std::vector<int32_t> ids = full_ids("gpt_oss_mxfp4");
  const std::vector<float> want = teacher_forced(fixture_pack("gpt_oss_mxfp4"), ids, {DType::mxfp4});
  LoadedModel m = load_model(fixture_pack("gpt_oss_mxfp4"), *gpu, {DType::mxfp4});
  std::vector<float> got(want.size());
  m.model->forward(ids, *m.model->new_state(static_cast<int64_t>(ids.size())), got, true);
  const float diff = max_abs_diff(got, want);
  std::printf("cuda gpt_oss_mxfp4 mxfp4 pack: max |logit - cpu| %.3g\n", diff);
  EXPECT_LE(diff, kCudaLogitTolerance);
  unsetenv("SLUICE_CUDA_MXFP4");
}

TEST(CudaGptOss, WhatIsNotSupportedYetIsRefusedInOneLine) {
  unsetenv("SLUICE_CUDA_MXFP4");
  auto gpu = make_cuda_backend(0);
  auto one_line = [](const std::function<void()>& fn, const std::string& fragment) {
    try {
      fn();
      ADD_FAILURE() << "did not throw (expected: " << fragment << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  };
  const std::vector<int32_t> ids = full_ids("gpt_oss_mxfp4");
  // MXFP4 weights: the checkpoint as it ships, and the pack's mxfp4 kind.
  for (const auto& lo : {LoadOptions{}, LoadOptions{DType::mxfp4}}) {
    one_line(
        [&] {
          LoadedModel m = load_model(lo.expert_kind ? fixture_pack("gpt_oss_mxfp4") : fixture_dir("gpt_oss_mxfp4"), *gpu, lo);
          std::vector<float> out(static_cast<size_t>(m.model->info().n_vocab));
          m.model->forward(std::span(ids).first(3), *m.model->new_state(8), out, false);
        },
        "mxfp4");
  }
  // Streamed experts with biases.
  LoadOptions lo;
  lo.expert_kind = DType::q4;
  StreamerOptions so;
  so.slots = 4;
  lo.streaming = so;
  one_line([&] { load_model(fixture_pack("gpt_oss"), *gpu, lo); }, "biases");
}

}  // namespace
