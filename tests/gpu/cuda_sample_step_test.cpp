// forward_sample on CUDA (the decode step and the draw in one replayed graph, only the token
// id returned) against forward() plus the CPU rule on the same backend: greedy, the same
// tokens step after step; sampled, every drawn token is in the kept set of that step's logits
// (computed by a second sequence fed the same tokens), and a seed reproduces the run. Every
// decoder fixture. Greedy steps enqueued ahead (forward_sample runs the next step from the
// token it leaves on the device before the host reads it) give the tokens and logits of the
// step-by-step run whatever the caller does next: the returned token, another one, a forward()
// of its own, a rewind of n_past.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <random>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "core/sampling.h"
#include "engine/generator.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

class CudaSampleStep : public ::testing::TestWithParam<std::string> {};

// Tokens drawn by forward_sample after the prompt, with the draws of generator `seed`, each
// step given the next one's draw when `ahead` (so that it may enqueue that step ahead) and
// none otherwise (each step alone); the logits of each step from a second sequence (forward)
// go to `step_logits`.
std::vector<int32_t> run(Model& m, const std::vector<int32_t>& prompt, const SampleRule& rule, uint64_t seed,
                         int steps, std::vector<std::vector<float>>* step_logits, bool ahead = true) {
  const int64_t V = m.info().n_vocab;
  auto a = m.new_state(static_cast<int64_t>(prompt.size()) + steps + 1);
  auto b = m.new_state(static_cast<int64_t>(prompt.size()) + steps + 1);
  std::vector<float> logits(V);
  m.forward(std::span(prompt).first(prompt.size() - 1), *a, logits, false);
  m.forward(std::span(prompt).first(prompt.size() - 1), *b, logits, false);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> draws(static_cast<size_t>(steps));
  for (int64_t& d : draws) d = static_cast<int64_t>(rng() >> 11);
  std::vector<int32_t> out;
  int32_t token = prompt.back();
  for (int i = 0; i < steps; ++i) {
    m.forward(std::span<const int32_t>(&token, 1), *b, logits, false);
    if (step_logits) step_logits->push_back(logits);
    token = m.forward_sample(token, *a, rule, V, draws[static_cast<size_t>(i)],
                             ahead && i + 1 < steps ? std::optional<int64_t>(draws[static_cast<size_t>(i) + 1])
                                                    : std::nullopt);
    EXPECT_GE(token, 0);
    if (token < 0) break;
    out.push_back(token);
  }
  return out;
}

TEST_P(CudaSampleStep, GreedyMatchesAndSampledTokensAreKept) {
  FixtureReference ref = read_reference(GetParam());
  auto be = make_cuda_backend(0);
  ASSERT_TRUE(be->graphs_enabled());
  LoadedModel m = load_model(fixture_dir(GetParam()), *be);
  const int steps = 10;
  std::vector<std::vector<float>> logits;
  const std::vector<int32_t> greedy = run(*m.model, ref.prompt_ids, SampleRule{}, 1, steps, &logits);
  SampleScratch sc;
  for (size_t i = 0; i < greedy.size(); ++i)
    EXPECT_EQ(greedy[i], sample_row(logits[i], SampleRule{}, 0.0, sc)) << GetParam() << " step " << i;
  for (const SampleRule rule : {SampleRule{1.0f, 0, 1.0f}, SampleRule{0.8f, 5, 0.9f}}) {
    logits.clear();
    const std::vector<int32_t> a = run(*m.model, ref.prompt_ids, rule, 7, steps, &logits);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(sample_kept(logits[i], rule, sc)[static_cast<size_t>(a[i])]) << GetParam() << " step " << i;
    EXPECT_EQ(run(*m.model, ref.prompt_ids, rule, 7, steps, nullptr), a) << GetParam() << ": the seed reproduces";
    EXPECT_EQ(run(*m.model, ref.prompt_ids, rule, 7, steps, nullptr, false), a)
        << GetParam() << ": the steps enqueued ahead draw what the step-by-step run draws";
  }
}

// The greedy tokens of `steps` forward_sample calls on a fresh state after the prompt, each
// given the next step's draw when `ahead` (none otherwise); the caller's choices at step i: feed `other` instead of the
// drawn token where swap(i), run a forward() of the token first (its logits to `logits`) where
// eager(i), and rewind n_past by one (re-running the step before) where rewind(i).
struct Script {
  std::function<bool(int)> swap = [](int) { return false; };
  std::function<bool(int)> eager = [](int) { return false; };
  std::function<bool(int)> rewind = [](int) { return false; };
};
std::vector<int32_t> run_greedy(Model& m, const std::vector<int32_t>& prompt, int steps, bool ahead,
                                const Script& script, std::vector<std::vector<float>>* logits_out) {
  const int64_t V = m.info().n_vocab;
  auto a = m.new_state(static_cast<int64_t>(prompt.size()) + 2 * steps + 1);
  std::vector<float> logits(V);
  m.forward(std::span(prompt).first(prompt.size() - 1), *a, logits, false);
  std::vector<int32_t> out;
  int32_t token = prompt.back(), before = prompt.back();
  for (int i = 0; i < steps; ++i) {
    if (script.swap(i)) token = static_cast<int32_t>((token + 1 + i) % V);
    if (script.rewind(i) && a->n_past > 0) {
      a->n_past -= 1;
      token = before;
    }
    if (script.eager(i)) {
      m.forward(std::span<const int32_t>(&token, 1), *a, logits, false);
      if (logits_out) logits_out->push_back(logits);
      a->n_past -= 1;  // the step below runs the same token at the same position
    }
    before = token;
    token = m.forward_sample(token, *a, SampleRule{}, V, 0, ahead ? std::optional<int64_t>(0) : std::nullopt);
    out.push_back(token);
    if (token < 0) break;
  }
  return out;
}

TEST_P(CudaSampleStep, GreedyStepsAheadAreTheStepByStepOnes) {
  FixtureReference ref = read_reference(GetParam());
  auto be = make_cuda_backend(0);
  ASSERT_TRUE(be->graphs_enabled());
  LoadedModel m = load_model(fixture_dir(GetParam()), *be);
  const int steps = 12;
  const std::vector<Script> scripts = {
      Script{},
      Script{.swap = [](int i) { return i % 4 == 2; }},
      Script{.eager = [](int i) { return i % 3 == 1; }},
      Script{.rewind = [](int i) { return i == 5 || i == 9; }},
      Script{.swap = [](int i) { return i == 3; }, .eager = [](int i) { return i == 7; },
             .rewind = [](int i) { return i == 10; }},
  };
  for (size_t k = 0; k < scripts.size(); ++k) {
    std::vector<std::vector<float>> on_logits, off_logits;
    const auto on = run_greedy(*m.model, ref.prompt_ids, steps, true, scripts[k], &on_logits);
    const auto off = run_greedy(*m.model, ref.prompt_ids, steps, false, scripts[k], &off_logits);
    EXPECT_EQ(on, off) << GetParam() << " script " << k;
    ASSERT_EQ(on_logits.size(), off_logits.size());
    for (size_t i = 0; i < on_logits.size(); ++i)
      EXPECT_EQ(on_logits[i], off_logits[i]) << GetParam() << " script " << k << ", forward() " << i;
  }
}

// The same with the experts streamed (the CUDA streamer: each step enqueued eagerly, the greedy
// step ahead behind it, its MoE layers' jobs queued behind the step's own), at top_k + 1 slots
// read from disk and from a preloaded host tier. A swapped token drops the step ahead,
// which the streamer still ran: more layer steps with the steps ahead than without shows
// they were enqueued. A generation (Generator) enqueues none after its last token. Sampled
// steps ahead draw the step-by-step run's tokens.
TEST_P(CudaSampleStep, StreamedGreedyStepsAheadAreTheStepByStepOnes) {
  FixtureReference ref = read_reference(GetParam());
  auto be = make_cuda_backend(0);
  ASSERT_TRUE(be->graphs_enabled());  // the readbacks the step ahead needs
  const int64_t k = load_model(fixture_dir(GetParam()), *be).model->info().n_expert_used;
  const int steps = 10;
  const std::vector<Script> scripts = {
      Script{},
      Script{.swap = [](int i) { return i % 4 == 2; }},
      Script{.swap = [](int i) { return i == 3; }, .eager = [](int i) { return i == 5; },
             .rewind = [](int i) { return i == 7; }},
  };
  for (bool host_tier : {false, true}) {
    LoadOptions lo;
    lo.expert_kind = DType::q4;
    StreamerOptions so;
    so.slots = static_cast<int32_t>(k + 1);
    so.wait_timeout = std::chrono::seconds(10);
    if (host_tier) {
      so.host_cache_bytes = 1 << 30;
      so.host_cache_preload = true;
    }
    lo.streaming = so;
    LoadedModel m = load_model(fixture_pack(GetParam()), *be, lo);
    ASSERT_TRUE(m.streamer && m.model->expert_provider()->forwards_overlap());
    for (size_t s = 0; s < scripts.size(); ++s) {
      std::vector<std::vector<float>> on_logits, off_logits;
      uint64_t layer_steps[2] = {0, 0};
      std::vector<int32_t> tokens[2];
      for (int ahead : {1, 0}) {
        m.streamer->reset_stats();
        tokens[ahead] = run_greedy(*m.model, ref.prompt_ids, steps, ahead, scripts[s], ahead ? &on_logits : &off_logits);
        ASSERT_TRUE(m.streamer->drain(std::chrono::seconds(10)));
        layer_steps[ahead] = m.streamer->stats().totals().steps;
      }
      SCOPED_TRACE(str(GetParam(), host_tier ? " host tier" : " disk", " script ", s));
      EXPECT_EQ(tokens[1], tokens[0]);
      ASSERT_EQ(on_logits.size(), off_logits.size());
      for (size_t i = 0; i < on_logits.size(); ++i) EXPECT_EQ(on_logits[i], off_logits[i]) << "forward() " << i;
      if (s > 0) {
        EXPECT_GT(layer_steps[1], layer_steps[0]) << "no step ahead was enqueued";
      }
      m.streamer->residency().check_invariants();
    }
    // A generation enqueues no step after its last token (Model::forward_sample's
    // next_draw53): as many layer steps with the steps ahead as without
    // (GenerateOptions::steps_ahead), the same tokens.
    std::vector<int32_t> generated[2];
    uint64_t layer_steps[2] = {0, 0};
    for (int ahead : {1, 0}) {
      m.streamer->reset_stats();
      GenerateOptions g;
      g.n_predict = steps;
      g.sampling.temperature = 0;
      g.steps_ahead = ahead != 0;
      Generator(*m.model).generate(ref.prompt_ids, g, [&](int32_t id) {
        generated[ahead].push_back(id);
        return true;
      });
      ASSERT_TRUE(m.streamer->drain(std::chrono::seconds(10)));
      layer_steps[ahead] = m.streamer->stats().totals().steps;
    }
    EXPECT_EQ(generated[1], generated[0]) << GetParam();
    EXPECT_EQ(layer_steps[1], layer_steps[0]) << GetParam() << ": a step enqueued after the last token";
    // Sampled steps enqueued ahead (each given the next one's draw) draw the step-by-step
    // run's tokens.
    for (const SampleRule rule : {SampleRule{1.0f, 0, 1.0f}, SampleRule{0.8f, 5, 0.9f}})
      EXPECT_EQ(run(*m.model, ref.prompt_ids, rule, 7, steps, nullptr, true),
                run(*m.model, ref.prompt_ids, rule, 7, steps, nullptr, false))
          << GetParam() << " temperature " << rule.temperature;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaSampleStep, ::testing::ValuesIn(decoder_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
