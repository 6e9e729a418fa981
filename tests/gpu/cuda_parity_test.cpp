// GPU parity: every fixture on the CUDA backend matches transformers' logits within 1e-3
// (f32 activations) and reproduces the greedy continuation.
#include <gtest/gtest.h>

#include <cstdio>

#include "../models/fixture_util.h"
#include "engine/generator.h"
#include "format/npy.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

class CudaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaParity, LogitsAndGreedyMatchTransformers) {
  auto backend = make_cuda_backend(0);
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  const int64_t V = m.model->info().n_vocab;
  NpyArray want = read_npy(fixture_dir(GetParam()) / "logits_full.npy");
  auto state = m.model->new_state(static_cast<int64_t>(ids.size()));
  std::vector<float> got(ids.size() * V);
  m.model->forward(ids, *state, got, true);
  float diff = max_abs_diff(got, want.data);
  std::printf("cuda %s: max |logit - reference| = %.3g\n", GetParam().c_str(), diff);
  EXPECT_LE(diff, 1e-3f);
  GenerateOptions opt;
  opt.n_predict = static_cast<int64_t>(ref.continuation_ids.size());
  opt.sampling.temperature = 0;
  std::vector<int32_t> cont;
  Generator(*m.model).generate(ref.prompt_ids, opt, [&](int32_t id) {
    cont.push_back(id);
    return true;
  });
  EXPECT_EQ(cont, ref.continuation_ids);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParity, ::testing::ValuesIn(decoder_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
