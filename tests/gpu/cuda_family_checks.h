// The checks every family's CUDA test makes (cuda_gpt_oss_test.cpp, cuda_llama4_test.cpp,
// cuda_gemma4_test.cpp), on a fresh CUDA backend with an f32 KV cache, within the CUDA
// decoder fixtures' bound (cuda_parity_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/gpu/scoped_env.h"
#include "models/load.h"

namespace sluice::test {

constexpr float kCudaLogitTolerance = 1e-3f;

// SLUICE_CUDA_HOST_ROUTED=1 (core/router_scoring.h) for a scope: the families' experts routed
// on the host and computed by the generic ops, as before the device kernels took them.
struct HostRouted : ScopedEnv {
  HostRouted() : ScopedEnv("SLUICE_CUDA_HOST_ROUTED", "1") {}
};

// The fixture's checkpoint against transformers: teacher-forced and decoded through the cache
// within the bound, and the greedy continuation equal.
inline void expect_cuda_matches_transformers(const std::string& fixture) {
  auto gpu = make_cuda_backend(0);
  gpu->set_kv_dtype(DType::f32);
  LoadedModel m = load_model(fixture_dir(fixture), *gpu);
  const ReferenceRun r = run_against_reference(*m.model, fixture);
  std::printf("cuda %s: max |logit - reference| %.3g teacher-forced, %.3g decoded\n", fixture.c_str(), r.forced,
              r.decoded);
  EXPECT_LE(r.forced, kCudaLogitTolerance);
  EXPECT_LE(r.decoded, kCudaLogitTolerance);
  EXPECT_EQ(r.continuation, read_reference(fixture).continuation_ids);
}

// The fixture's pack at expert kind `kind`, teacher-forced, against the CPU's run of the same
// pack (the kinds' quantization is the same on both backends); returns the logits.
inline std::vector<float> expect_cuda_pack_matches_the_cpu(const std::string& fixture, DType kind) {
  const std::vector<int32_t> ids = full_ids(fixture);
  const std::vector<float> want = teacher_forced(fixture_pack(fixture), ids, {kind});
  auto gpu = make_cuda_backend(0);
  gpu->set_kv_dtype(DType::f32);
  LoadedModel m = load_model(fixture_pack(fixture), *gpu, {kind});
  std::vector<float> got(want.size());
  m.model->forward(ids, *m.model->new_state(static_cast<int64_t>(ids.size())), got, true);
  const float diff = max_abs_diff(got, want);
  std::printf("cuda %s %s pack: max |logit - cpu| %.3g\n", fixture.c_str(), std::string(expert_kind_name(kind)).c_str(),
              diff);
  EXPECT_LE(diff, kCudaLogitTolerance);
  return got;
}

// LoadOptions streaming `kind` experts through a cache of `slots` slots.
inline LoadOptions streamed(DType kind, int32_t slots) {
  LoadOptions lo;
  lo.expert_kind = kind;
  StreamerOptions so;
  so.slots = slots;
  so.wait_timeout = std::chrono::seconds(10);
  lo.streaming = so;
  return lo;
}

}  // namespace sluice::test
