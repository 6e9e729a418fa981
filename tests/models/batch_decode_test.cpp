// Model::forward_batch: a decode step of several sequences at once gives every sequence the
// logits it gets alone, bit for bit on the CPU, on every model fixture (every family batches
// its products and expert unions; token mixers run per sequence), with sequences at
// different positions, joining and leaving the batch, and with the experts resident or
// streamed through a small cache (one expert union for the batch). Bad batches are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "tests/models/fixture_util.h"
#include "models/load.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;

namespace {

std::vector<int32_t> fixture_tokens(const std::string& fixture) {
  FixtureReference ref = read_reference(fixture);
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  return ids;
}

// Three sequences over the fixture's tokens: prompts of different lengths (so their positions
// differ in every step), then `steps` decode tokens each, sequence 2 joining one step late and
// sequence 0 leaving one step early. Returns every decode step's logits of every sequence,
// [sequence][step][V], computed with forward_batch (batched) or forward() one at a time.
std::vector<std::vector<std::vector<float>>> decode_three(Model& m, const std::vector<int32_t>& ids, bool batched) {
  const int64_t V = m.info().n_vocab;
  const size_t n = ids.size();
  const size_t prompt_len[3] = {n / 4 + 1, n / 3 + 2, n / 2 + 1};
  const int steps = static_cast<int>(n - prompt_len[2]) - 1;
  std::vector<std::unique_ptr<SequenceState>> st;
  std::vector<float> scratch(static_cast<size_t>(V));
  for (int s = 0; s < 3; ++s) {
    st.push_back(m.new_state(static_cast<int64_t>(n)));
    m.forward(std::span<const int32_t>(ids.data(), prompt_len[s]), *st.back(), scratch, false);
  }
  std::vector<std::vector<std::vector<float>>> out(3);
  for (int t = 0; t < steps; ++t) {
    std::vector<int> live;
    for (int s = 0; s < 3; ++s)
      if (!(s == 2 && t == 0) && !(s == 0 && t == steps - 1)) live.push_back(s);
    std::vector<int32_t> tokens;
    std::vector<SequenceState*> states;
    for (int s : live) {
      tokens.push_back(ids[prompt_len[s] + static_cast<size_t>(t) - (s == 2 ? 1 : 0)]);
      states.push_back(st[static_cast<size_t>(s)].get());
    }
    std::vector<float> logits(tokens.size() * static_cast<size_t>(V));
    if (batched) {
      m.forward_batch(tokens, states, logits);
    } else {
      for (size_t b = 0; b < tokens.size(); ++b)
        m.forward(std::span<const int32_t>(&tokens[b], 1), *states[b],
                  std::span<float>(logits).subspan(b * static_cast<size_t>(V), static_cast<size_t>(V)), false);
    }
    for (size_t b = 0; b < live.size(); ++b)
      out[static_cast<size_t>(live[b])].emplace_back(logits.begin() + static_cast<std::ptrdiff_t>(b * V),
                                                     logits.begin() + static_cast<std::ptrdiff_t>((b + 1) * V));
  }
  return out;
}

void expect_same(const std::vector<std::vector<std::vector<float>>>& got,
                 const std::vector<std::vector<std::vector<float>>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << "sequence " << s;
    for (size_t t = 0; t < got[s].size(); ++t)
      ASSERT_EQ(std::memcmp(got[s][t].data(), want[s][t].data(), got[s][t].size() * sizeof(float)), 0)
          << "sequence " << s << ", step " << t << ": max |diff| " << max_abs_diff(got[s][t], want[s][t]);
  }
}

}  // namespace

TEST(BatchDecode, EveryFixtureEqualsOneSequenceAtATime) {
  auto be = make_cpu_backend();
  for (const std::string& fixture : model_fixtures()) {
    SCOPED_TRACE(fixture);
    LoadedModel m = load_model(fixture_dir(fixture), *be);
    const std::vector<int32_t> ids = fixture_tokens(fixture);
    const auto want = decode_three(*m.model, ids, false);
    ASSERT_FALSE(want[1].empty());
    expect_same(decode_three(*m.model, ids, true), want);
  }
}

TEST(BatchDecode, StreamedExpertsOneUnionForTheBatch) {
  auto be = make_cpu_backend();
  for (const std::string& fixture : expert_fixtures()) {
    SCOPED_TRACE(fixture);
    LoadOptions resident_opt;
    resident_opt.expert_kind = DType::q4;
    LoadedModel resident = load_model(fixture_pack(fixture), *be, resident_opt);
    const std::vector<int32_t> ids = fixture_tokens(fixture);
    const auto want = decode_three(*resident.model, ids, false);
    const int32_t k = static_cast<int32_t>(resident.model->info().n_expert_used);
    for (int32_t slots : {k, 3 * k}) {
      SCOPED_TRACE(str(slots, " slots"));
      LoadOptions lo = resident_opt;
      StreamerOptions so;
      so.slots = slots;
      lo.streaming = so;
      LoadedModel m = load_model(fixture_pack(fixture), *be, lo);
      expect_same(decode_three(*m.model, ids, true), want);
      ASSERT_TRUE(m.streamer->drain(std::chrono::seconds(10)));
      const RunStats r = m.streamer->stats();
      for (const std::string& e : r.consistency_errors()) ADD_FAILURE() << e;
      // Every family batches: a decode step of 2-3 sequences is one step of the streamer (when
      // their union fits), not one per sequence.
      if (slots >= 3 * k) {
        EXPECT_GT(r.decode.rows, r.decode.steps) << "the batch's rows went through the streamer together";
      }
    }
  }
}

TEST(BatchDecode, BadBatchesAreRefused) {
  auto be = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir("qwen3_moe"), *be);
  const int64_t V = m.model->info().n_vocab;
  auto a = m.model->new_state(4), b = m.model->new_state(4);
  std::vector<float> logits(static_cast<size_t>(2 * V));
  SequenceState* both[] = {a.get(), b.get()};
  SequenceState* twice[] = {a.get(), a.get()};
  const int32_t two[] = {1, 2};
  EXPECT_THROW(m.model->forward_batch(std::span<const int32_t>(two, 1), both, logits), Error);   // 1 token, 2 states
  EXPECT_THROW(m.model->forward_batch(two, twice, logits), Error);                              // a sequence twice
  EXPECT_THROW(m.model->forward_batch(two, both, std::span<float>(logits).first(static_cast<size_t>(V))), Error);
  const int32_t bad[] = {1, static_cast<int32_t>(V)};
  EXPECT_THROW(m.model->forward_batch(bad, both, logits), Error);                               // outside the vocabulary
  b->n_past = 4;                                                                                // b's context is full
  EXPECT_THROW(m.model->forward_batch(two, both, logits), Error);
  EXPECT_EQ(a->n_past, 0) << "a refused batch changes no sequence";
}
