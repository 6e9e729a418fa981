// Llama 4 on the CUDA backend: chunked attention and the NoPE layers' temperature in every
// attention kernel (cuda_ops_test.cpp's AttentionChunksAndTemperatureEveryKernel), the
// experts with their inputs scaled by the sigmoid routing weights and the shared expert through
// the generic ops (routed on the host: the device MoE kernels scale outputs, so the backend
// builds no expert table for them). Against transformers within the CUDA decoder bound of
// 1e-3, teacher-forced and decoded through the cache, with the greedy continuation; a pack's
// q4 experts match the CPU's run of the same pack. Streamed Llama 4 experts are refused in one
// line (the CUDA streamer routes by softmax on the device).
#include <gtest/gtest.h>

#include <cstdio>

#include "../models/fixture_util.h"
#include "../models/pack_util.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

constexpr float kCudaLogitTolerance = 1e-3f;  // the CUDA decoder fixtures' bound (cuda_parity_test.cpp)

class CudaLlama4 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaLlama4, MatchesTransformersTeacherForcedDecodedAndGreedy) {
  auto gpu = make_cuda_backend(0);
  gpu->set_kv_dtype(DType::f32);
  LoadedModel m = load_model(fixture_dir(GetParam()), *gpu);
  const ReferenceRun r = run_against_reference(*m.model, GetParam());
  std::printf("cuda %s: max |logit - reference| %.3g teacher-forced, %.3g decoded\n", GetParam().c_str(), r.forced,
              r.decoded);
  EXPECT_LE(r.forced, kCudaLogitTolerance);
  EXPECT_LE(r.decoded, kCudaLogitTolerance);
  EXPECT_EQ(r.continuation, read_reference(GetParam()).continuation_ids);
}

TEST_P(CudaLlama4, Q4PackMatchesTheCpu) {
  const std::vector<int32_t> ids = full_ids(GetParam());
  const std::vector<float> want = teacher_forced(fixture_pack(GetParam()), ids, {DType::q4});
  auto gpu = make_cuda_backend(0);
  gpu->set_kv_dtype(DType::f32);
  LoadedModel m = load_model(fixture_pack(GetParam()), *gpu, {DType::q4});
  std::vector<float> got(want.size());
  m.model->forward(ids, *m.model->new_state(static_cast<int64_t>(ids.size())), got, true);
  const float diff = max_abs_diff(got, want);
  std::printf("cuda %s q4 pack: max |logit - cpu| %.3g\n", GetParam().c_str(), diff);
  EXPECT_LE(diff, kCudaLogitTolerance);
}

TEST_P(CudaLlama4, StreamedExpertsAreRefusedInOneLine) {
  auto gpu = make_cuda_backend(0);
  LoadOptions lo;
  lo.expert_kind = DType::q4;
  StreamerOptions so;
  so.slots = 4;
  lo.streaming = so;
  try {
    LoadedModel m = load_model(fixture_pack(GetParam()), *gpu, lo);
    const std::vector<int32_t> ids = full_ids(GetParam());
    std::vector<float> out(static_cast<size_t>(m.model->info().n_vocab));
    m.model->forward(std::span(ids).first(3), *m.model->new_state(8), out, false);
    ADD_FAILURE() << "did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("softmax-routed"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaLlama4, ::testing::ValuesIn(llama4_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
