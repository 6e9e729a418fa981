// Decode graphs: a one-token step replayed from a captured CUDA graph gives exactly the
// logits of the same step enqueued eagerly (SLUICE_CUDA_GRAPHS=0), step after step (the
// position, the KV append and the attention read the position on the device), for every
// decoder fixture; and a second sequence state gets its own graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "../models/fixture_util.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

std::unique_ptr<Backend> cuda_backend(bool graphs) {
  setenv("SLUICE_CUDA_GRAPHS", graphs ? "1" : "0", 1);
  auto be = make_cuda_backend(0);
  unsetenv("SLUICE_CUDA_GRAPHS");
  return be;
}

// Logits of the prompt's last token, then of n greedy steps, one vector per forward.
std::vector<std::vector<float>> greedy_logits(Model& m, const std::vector<int32_t>& prompt, int n) {
  const int64_t V = m.info().n_vocab;
  auto state = m.new_state(static_cast<int64_t>(prompt.size()) + n);
  std::vector<std::vector<float>> out;
  std::vector<float> logits(V);
  m.forward(prompt, *state, logits, false);
  out.push_back(logits);
  for (int i = 0; i < n; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    m.forward(std::span<const int32_t>(&next, 1), *state, logits, false);
    out.push_back(logits);
  }
  return out;
}

class CudaGraph : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGraph, ReplayEqualsEagerDecode) {
  FixtureReference ref = read_reference(GetParam());
  auto eager_be = cuda_backend(false), graph_be = cuda_backend(true);
  ASSERT_FALSE(eager_be->graphs_enabled());
  ASSERT_TRUE(graph_be->graphs_enabled());
  LoadedModel eager = load_model(fixture_dir(GetParam()), *eager_be);
  LoadedModel graph = load_model(fixture_dir(GetParam()), *graph_be);
  const int steps = 12;
  auto want = greedy_logits(*eager.model, ref.prompt_ids, steps);
  for (int rep = 0; rep < 2; ++rep) {  // a second state captures its own graph
    auto got = greedy_logits(*graph.model, ref.prompt_ids, steps);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      float diff = 0;
      for (size_t i = 0; i < got[s].size(); ++i) diff = std::max(diff, std::abs(got[s][i] - want[s][i]));
      EXPECT_EQ(diff, 0.0f) << GetParam() << " state " << rep << " step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraph, ::testing::ValuesIn(decoder_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
