// Decode graphs: a one-token step replayed from a captured CUDA graph gives exactly the
// logits of the same step enqueued eagerly (SLUICE_CUDA_GRAPHS=0), step after step (the
// position, the KV append and the attention read the position on the device), for every
// decoder fixture; and a second sequence state gets its own graph. A batch step of several
// sequences (forward_batch, forward_batch_sample) replayed from its graph gives exactly the
// eager batch's logits, with sequences joining and leaving (new graphs, kept ones reused at
// new positions), and draws what the host rule draws from those logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "core/sampling.h"
#include "models/load.h"
#include "tests/gpu/scoped_env.h"

using namespace sluice;
using namespace sluice::test;

namespace {

std::unique_ptr<Backend> cuda_backend(bool graphs) {
  const ScopedEnv env("SLUICE_CUDA_GRAPHS", graphs ? "1" : "0");
  return make_cuda_backend(0);
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

// The resident MoE layers on the decode kernels (moe_decode.cu: the down + combine launched
// early, its pairs' experts read and its weights in flight before it waits for the gate/up
// product) decode as the generic per-pair kernels do (SLUICE_CUDA_MOE_DECODE=0: each kernel
// waits for the one before at its entry), bit for bit, eagerly and in the graphs: the
// fixture's pack with bf16 experts (the decode kernels take bf16 rows at every fixture's
// widths, multiples of 8; int8 and q4 need 16 and 32) and with q4 experts.
TEST_P(CudaGraph, DecodeKernelsDecodeAsTheGenericKernelsBitForBit) {
  FixtureReference ref = read_reference(GetParam());
  const ScopedEnv generic("SLUICE_CUDA_MOE_DECODE", nullptr);
  for (DType kind : {DType::bf16, DType::q4})
    for (bool graphs : {false, true}) {
      LoadOptions lo;
      lo.expert_kind = kind;
      std::vector<std::vector<float>> got[2];
      for (int decode_kernels = 0; decode_kernels < 2; ++decode_kernels) {
        generic.set(decode_kernels ? "1" : "0");
        auto be = cuda_backend(graphs);
        LoadedModel m = load_model(fixture_pack(GetParam()), *be, lo);
        got[decode_kernels] = greedy_logits(*m.model, ref.prompt_ids, 12);
      }
      ASSERT_EQ(got[0].size(), got[1].size());
      for (size_t s = 0; s < got[0].size(); ++s)
        EXPECT_EQ(max_abs_diff(got[1][s], got[0][s]), 0.0f)
            << GetParam() << " " << expert_kind_name(kind) << " graphs " << graphs << " step " << s;
    }
}

// Four sequences at different positions decode `steps` tokens each: the batch of step t
// holds the sequences live at t (0 and 1 throughout, 2 from step 2, 3 until step steps - 3,
// then 3 again for the last step: a set seen before comes back). With forward_batch each
// step's logits are recorded ([sequence][step][V]) and the next token is the row's argmax;
// with rules, forward_batch_sample draws it (draws from one generator) and `drawn` records it.
std::vector<std::vector<std::vector<float>>> batch_run(Model& m, const std::vector<int32_t>& prompt, int steps,
                                                      const std::vector<SampleRule>* rules,
                                                      std::vector<std::vector<int32_t>>* drawn) {
  const int64_t V = m.info().n_vocab;
  const int n_seq = 4;
  std::vector<std::unique_ptr<SequenceState>> st;
  std::vector<int32_t> next(n_seq);
  std::vector<float> logits(static_cast<size_t>(V));
  for (int s = 0; s < n_seq; ++s) {
    const size_t len = std::max<size_t>(1, prompt.size() - static_cast<size_t>(s));
    st.push_back(m.new_state(static_cast<int64_t>(len) + steps + 1));
    m.forward(std::span<const int32_t>(prompt.data(), len - 1), *st.back(), logits, false);
    next[static_cast<size_t>(s)] = prompt[len - 1];
  }
  std::vector<std::vector<std::vector<float>>> out(n_seq);
  if (drawn) drawn->assign(n_seq, {});
  uint64_t draw = 12345;
  for (int t = 0; t < steps; ++t) {
    std::vector<int> live = {0, 1};
    if (t >= 2) live.push_back(2);
    if (t < steps - 3 || t == steps - 1) live.push_back(3);
    std::vector<int32_t> tokens;
    std::vector<SequenceState*> states;
    for (int s : live) {
      tokens.push_back(next[static_cast<size_t>(s)]);
      states.push_back(st[static_cast<size_t>(s)].get());
    }
    if (rules) {
      std::vector<SampleRule> r;
      std::vector<int64_t> draws;
      for (int s : live) {
        r.push_back((*rules)[static_cast<size_t>(s)]);
        draw = draw * 6364136223846793005ull + 1442695040888963407ull;
        draws.push_back(static_cast<int64_t>(draw >> 11));
      }
      std::vector<int32_t> got(live.size());
      m.forward_batch_sample(tokens, states, r, V, draws, got);
      for (size_t b = 0; b < live.size(); ++b) {
        EXPECT_GE(got[b], 0);
        (*drawn)[static_cast<size_t>(live[b])].push_back(got[b]);
        next[static_cast<size_t>(live[b])] = std::max(got[b], 0);
      }
      continue;
    }
    std::vector<float> rows(live.size() * static_cast<size_t>(V));
    m.forward_batch(tokens, states, rows);
    for (size_t b = 0; b < live.size(); ++b) {
      const auto row = rows.begin() + static_cast<std::ptrdiff_t>(b * V);
      out[static_cast<size_t>(live[b])].emplace_back(row, row + V);
      next[static_cast<size_t>(live[b])] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
  }
  return out;
}

TEST_P(CudaGraph, BatchReplayEqualsEagerBatch) {
  FixtureReference ref = read_reference(GetParam());
  auto eager_be = cuda_backend(false), graph_be = cuda_backend(true);
  LoadedModel eager = load_model(fixture_dir(GetParam()), *eager_be);
  LoadedModel graph = load_model(fixture_dir(GetParam()), *graph_be);
  const int steps = 9;
  const auto want = batch_run(*eager.model, ref.prompt_ids, steps, nullptr, nullptr);
  const auto got = batch_run(*graph.model, ref.prompt_ids, steps, nullptr, nullptr);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << "sequence " << s;
    for (size_t t = 0; t < got[s].size(); ++t)
      EXPECT_EQ(max_abs_diff(got[s][t], want[s][t]), 0.0f) << GetParam() << " sequence " << s << " step " << t;
  }
}

TEST_P(CudaGraph, BatchSampleDrawsWhatTheHostRuleDraws) {
  FixtureReference ref = read_reference(GetParam());
  auto be = cuda_backend(true);
  LoadedModel m = load_model(fixture_dir(GetParam()), *be);
  const int steps = 9;
  // Greedy everywhere: the tokens are the argmax of the batch logits, step after step.
  const std::vector<SampleRule> greedy(4, SampleRule{});
  std::vector<std::vector<int32_t>> drawn;
  const auto logits = batch_run(*m.model, ref.prompt_ids, steps, nullptr, nullptr);
  batch_run(*m.model, ref.prompt_ids, steps, &greedy, &drawn);
  SampleScratch sc;
  for (size_t s = 0; s < drawn.size(); ++s) {
    ASSERT_EQ(drawn[s].size(), logits[s].size()) << "sequence " << s;
    for (size_t t = 0; t < drawn[s].size(); ++t)
      EXPECT_EQ(drawn[s][t], sample_row(logits[s][t], SampleRule{}, 0.0, sc)) << GetParam() << " sequence " << s
                                                                                << " step " << t;
  }
  // Mixed rules in one batch (runs of equal rules share a draw launch): every draw is in the
  // kept set of its rule, and the same draws reproduce the run.
  const std::vector<SampleRule> mixed = {SampleRule{1.0f, 0, 1.0f}, SampleRule{1.0f, 0, 1.0f}, SampleRule{},
                                         SampleRule{0.8f, 5, 0.9f}};
  std::vector<std::vector<int32_t>> a, b;
  batch_run(*m.model, ref.prompt_ids, steps, &mixed, &a);
  batch_run(*m.model, ref.prompt_ids, steps, &mixed, &b);
  EXPECT_EQ(a, b) << GetParam() << ": the draws reproduce the run";
  // The first step of each sequence sees the prompt's state: its logits are those of the
  // greedy run's first step, so the draw must be in the rule's kept set there.
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_FALSE(a[s].empty());
    EXPECT_TRUE(sample_kept(logits[s][0], mixed[s], sc)[static_cast<size_t>(a[s][0])]) << GetParam() << " sequence "
                                                                                     << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraph, ::testing::ValuesIn(decoder_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
