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
#include "backends/cuda/kernels.h"
#include "backends/cuda/moe_persistent.h"
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

// The persistent decode MoE step (moe_persistent.h; SLUICE_CUDA_PERSISTENT=1) inside the
// decode graph: the fixture's pack with bf16, q8 and q4 experts (the
// decode kernels' types) decodes to the same logits, bit for bit, as with the three chained
// launches, and the graphs hold the step where the decode kernels take the widths.
TEST_P(CudaGraph, PersistentMoeStepIsTheChainBitForBit) {
  FixtureReference ref = read_reference(GetParam());
  const ScopedEnv persistent("SLUICE_CUDA_PERSISTENT", nullptr);
  for (DType kind : {DType::bf16, DType::q8, DType::q4}) {
    LoadOptions lo;
    lo.expert_kind = kind;
    std::vector<std::vector<float>> got[2];
    for (int on = 0; on < 2; ++on) {
      persistent.set(on ? "1" : nullptr);
      auto be = cuda_backend(true);
      LoadedModel m = load_model(fixture_pack(GetParam()), *be, lo);
      const int64_t before = cuda::moe_persistent_launches();
      got[on] = greedy_logits(*m.model, ref.prompt_ids, 12);
      const int64_t taken = cuda::moe_persistent_launches() - before;
      // bf16 rows take the decode kernels at every fixture's widths (multiples of 8); q8 and q4
      // need widths of 16 and 32 (the fixtures' expert widths are 24 to 48), else the chain runs.
      if (!on) {
        EXPECT_EQ(taken, 0) << expert_kind_name(kind) << ": taken while off";
      } else if (kind == DType::bf16) {
        EXPECT_GT(taken, 0) << expert_kind_name(kind) << ": not taken";
      }
      if (on) std::printf("%s %s: %lld persistent steps captured\n", GetParam().c_str(),
                          std::string(expert_kind_name(kind)).c_str(), static_cast<long long>(taken));
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t s = 0; s < got[0].size(); ++s)
      EXPECT_EQ(max_abs_diff(got[1][s], got[0][s]), 0.0f) << GetParam() << " " << expert_kind_name(kind) << " step " << s;
  }
}

// Early launches (common.cuh's chained_kernel_entry(bool): the norms and the attention merge
// let the next kernel launch at their entry, the products of uploaded weights load their first
// weight chunks before they wait; SLUICE_CUDA_EARLY=1) decode to the same logits, bit for
// bit, as with SLUICE_CUDA_EARLY=0, eagerly and from the graphs, and the early products
// are taken.
TEST_P(CudaGraph, EarlyLaunchesDecodeBitForBit) {
  FixtureReference ref = read_reference(GetParam());
  const ScopedEnv early("SLUICE_CUDA_EARLY", nullptr);
  for (bool graphs : {false, true}) {
    std::vector<std::vector<float>> got[2];
    for (int off = 0; off < 2; ++off) {
      early.set(off ? "0" : "1");
      auto be = cuda_backend(graphs);
      LoadedModel m = load_model(fixture_dir(GetParam()), *be);
      const int64_t before = cuda::matvec_early_launches();
      got[off] = greedy_logits(*m.model, ref.prompt_ids, 12);
      const int64_t taken = cuda::matvec_early_launches() - before;
      if (off) EXPECT_EQ(taken, 0) << GetParam() << ": early products while off";
      else EXPECT_GT(taken, 0) << GetParam() << ": no early product";
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t s = 0; s < got[0].size(); ++s)
      EXPECT_EQ(max_abs_diff(got[1][s], got[0][s]), 0.0f) << GetParam() << " graphs " << graphs << " step " << s;
  }
}

// Greedy decode of the fixture with `env` set to `off` and to `on`: the same logits, bit for
// bit, eagerly and from the graphs (where the launches overlap).
void expect_switch_decodes_bit_for_bit(const std::string& fixture, const char* env, const char* off, const char* on) {
  FixtureReference ref = read_reference(fixture);
  const ScopedEnv scoped(env, nullptr);
  for (bool graphs : {false, true}) {
    std::vector<std::vector<float>> got[2];
    for (int i = 0; i < 2; ++i) {
      scoped.set(i ? on : off);
      auto be = cuda_backend(graphs);
      LoadedModel m = load_model(fixture_dir(fixture), *be);
      got[i] = greedy_logits(*m.model, ref.prompt_ids, 12);
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t s = 0; s < got[0].size(); ++s)
      EXPECT_EQ(max_abs_diff(got[1][s], got[0][s]), 0.0f) << fixture << " " << env << " graphs " << graphs << " step " << s;
  }
}

// The MoE down + combine launched early (the default; SLUICE_CUDA_EARLY_DOWN=0 is the plain
// launch: its pairs' experts read and its weights in flight before it waits for the gate/up
// product).
TEST_P(CudaGraph, EarlyDownCombineDecodeBitForBit) {
  expect_switch_decodes_bit_for_bit(GetParam(), "SLUICE_CUDA_EARLY_DOWN", "0", "1");
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
