// The prompt cache on the CUDA backend (decode graphs, the decoder families' bf16 KV cache,
// the next decode step enqueued before a token is read): a ten-turn chat whose every turn
// resends the history gives the same greedy tokens with the cache as without, its later turns
// resumed where the CPU's are (a decoder fixture: all but the user's new tokens; the hybrid
// ones: from the last snapshot at a multiple of --ubatch); and chats whose prefixes go to the
// host tier and come back (device to host and back) answer alike.
#include <gtest/gtest.h>

#include "tests/engine/chat_turns.h"
#include "tests/models/fixture_util.h"
#include "engine/batch_engine.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

class CudaPromptCache : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPromptCache, ChatTurnsEqualWithAndWithoutTheCache) {
  auto be = make_cuda_backend(0);
  LoadedModel m = load_model(fixture_dir(GetParam()), *be);
  const std::vector<int32_t> ids = fixture_ids(GetParam(), 120);
  BatchEngineOptions o;
  o.n_parallel = 2;
  o.n_ctx = 200;
  o.ubatch = 8;
  o.prompt_cache_bytes = 64 << 20;
  const std::vector<Reply> cached =
      with_and_without_cache(*m.model, o, [&](BatchEngine& engine, const auto&) {
        return chat(engine, ids, 10, 20, 6, 6);
      }).cached;  // the same tokens without the cache (checked inside)
  const bool hybrid = m.model->snapshot_bytes() > 0;
  for (size_t t = 0; t < cached.size(); ++t) {
    SCOPED_TRACE(str("turn ", t + 1));
    const int64_t previous = cached[t].result.prompt_tokens - 6 - 6;
    const int64_t want = t == 0 ? 0 : hybrid ? previous / o.ubatch * o.ubatch : previous + 5;
    EXPECT_EQ(cached[t].result.cached_tokens, want);
  }
}

TEST_P(CudaPromptCache, HostTierRoundTrip) {
  auto be = make_cuda_backend(0);
  LoadedModel m = load_model(fixture_dir(GetParam()), *be);
  Model& model = *m.model;
  const std::vector<int32_t> ids = fixture_ids(GetParam(), 160);
  BatchEngineOptions o;
  o.n_parallel = 1;
  o.n_ctx = 128;
  o.ubatch = 8;
  o.prompt_cache_bytes = model.prefix_bytes(256) * 3 / 2 + 8 * model.snapshot_bytes();  // one entry
  o.prompt_cache_host_bytes = 64 << 20;
  const std::vector<int> order = {0, 1, 0, 2, 1, 2, 0};
  const CacheComparison c = with_and_without_cache(
      model, o, [&](BatchEngine& engine, const auto&) { return take_turns(engine, ids, order); });
  EXPECT_EQ(c.counters.host_hits, 3u);
  EXPECT_GT(c.cached[4].result.cached_tokens, 0);  // from the host tier
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaPromptCache,
                         ::testing::Values("qwen3_moe", "mixtral", "deepseek_v3", "qwen3_next", "qwen4_exp_qsa", "qwen4_exp_ple"));
