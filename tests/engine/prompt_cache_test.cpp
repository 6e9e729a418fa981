// The prompt cache (engine/prompt_cache.h) on the CPU backend:
//  - a state resumed from a prefix gives the logits of a full prefill bit for bit: a KV cache
//    cut anywhere, also when its rows came from decode steps; a hybrid (DeltaNet, QSA, PLE)
//    from a snapshot at a multiple of the prefill chunk, through a detached prefix state, and
//    cut back in place after decode steps changed its recurrent state;
//  - through BatchEngine, a multi-turn chat (each turn resends the history) gives the same
//    greedy tokens with and without the cache, the later turns resumed (CompletionResult's
//    cached_tokens), on a KV fixture and a hybrid one;
//  - eviction under a budget that holds one prefix: least recently used out, the budget kept,
//    a conversation whose prefix went is prefilled whole, answers unchanged; with a host tier
//    the evicted prefixes move to host memory and back (a KV fixture and a hybrid one);
//  - requests that share a long prefix arriving together prefill it once (the others wait and
//    copy it), answers unchanged.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/engine/chat_turns.h"
#include "tests/models/fixture_util.h"
#include "engine/batch_engine.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

// Prefills ids[from, to) into st in chunks that end at multiples of `chunk` (as BatchEngine
// cuts a prompt); the last token's logits.
std::vector<float> prefill(Model& m, SequenceState& st, const std::vector<int32_t>& ids, int64_t to, int64_t chunk) {
  std::vector<float> logits(static_cast<size_t>(m.info().n_vocab));
  for (int64_t at = st.n_past; at < to;) {
    const int64_t n = std::min(chunk - at % chunk, to - at);
    m.forward(std::span(ids).subspan(static_cast<size_t>(at), static_cast<size_t>(n)), st, logits, false);
    at += n;
  }
  return logits;
}

// Runs ids[st.n_past, to) one token at a time (decode steps).
void decode(Model& m, SequenceState& st, const std::vector<int32_t>& ids, int64_t to) {
  std::vector<float> logits(static_cast<size_t>(m.info().n_vocab));
  while (st.n_past < to) m.forward(std::span(ids).subspan(static_cast<size_t>(st.n_past), 1), st, logits, false);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// A KV cache copied at any position, its rows written by a prefill or by decode steps, resumes
// to the logits of a full prefill, bit for bit.
TEST(PromptCache, KvPrefixResumesBitForBit) {
  auto be = make_cpu_backend();
  for (const std::string fixture : {"qwen3_moe", "gemma4_kv", "deepseek_v3"}) {
    SCOPED_TRACE(fixture);
    LoadedModel m = load_model(fixture_dir(fixture), *be);
    Model& model = *m.model;
    ASSERT_TRUE(model.prefix_copyable());
    EXPECT_EQ(model.snapshot_bytes(), 0u);
    const std::vector<int32_t> ids = fixture_ids(fixture, 40);
    auto full = model.new_state(64);
    const std::vector<float> want = prefill(model, *full, ids, 40, 8);
    for (int64_t cut : {int64_t{1}, int64_t{13}, int64_t{24}, int64_t{39}}) {
      SCOPED_TRACE(str("cut at ", cut));
      // The source ran the prefix token by token, then more; a detached prefix copy of it,
      // then a fresh state from that copy.
      auto src = model.new_state(64);
      decode(model, *src, ids, 39);
      auto held = model.new_prefix_state(cut);
      model.copy_prefix(*src, *held, 0, cut, nullptr);
      auto dst = model.new_state(64);
      prefill(model, *dst, ids, 5, 8);  // rows that the copy must leave or overwrite
      model.copy_prefix(*held, *dst, std::min<int64_t>(cut, 5), cut, nullptr);
      EXPECT_EQ(dst->n_past, cut);
      EXPECT_TRUE(same_bits(prefill(model, *dst, ids, 40, 8), want));
      // Cut back in place.
      model.copy_prefix(*src, *src, cut, cut, nullptr);
      EXPECT_TRUE(same_bits(prefill(model, *src, ids, 40, 8), want));
    }
  }
}

// A hybrid state resumes from a snapshot at a multiple of the prefill chunk: through a prefix
// state, and in place after decode steps moved its recurrent state on.
TEST(PromptCache, HybridSnapshotResumesBitForBit) {
  auto be = make_cpu_backend();
  for (const std::string fixture : {"qwen3_next", "qwen4_exp_qsa", "qwen4_exp_ple"}) {
    SCOPED_TRACE(fixture);
    LoadedModel m = load_model(fixture_dir(fixture), *be);
    Model& model = *m.model;
    ASSERT_TRUE(model.prefix_copyable());
    ASSERT_GT(model.snapshot_bytes(), 0u);
    const int64_t chunk = 16, n = 70;
    const std::vector<int32_t> ids = fixture_ids(fixture, n);
    auto full = model.new_state(96);
    const std::vector<float> want = prefill(model, *full, ids, n, chunk);
    for (int64_t at : {chunk, 3 * chunk}) {
      SCOPED_TRACE(str("snapshot at ", at));
      auto src = model.new_state(96);
      prefill(model, *src, ids, at, chunk);
      std::unique_ptr<StateSnapshot> snap = model.snapshot(*src);
      ASSERT_TRUE(snap);
      EXPECT_EQ(snap->n_past, at);
      decode(model, *src, ids, at + 9);  // the recurrent state moves on
      auto held = model.new_prefix_state(at);
      model.copy_prefix(*src, *held, 0, at, snap.get());
      auto dst = model.new_state(96);
      decode(model, *dst, ids, 3);  // a used state
      model.copy_prefix(*held, *dst, 0, at, snap.get());
      EXPECT_TRUE(same_bits(prefill(model, *dst, ids, n, chunk), want));
      model.copy_prefix(*src, *src, at, at, snap.get());
      EXPECT_TRUE(same_bits(prefill(model, *src, ids, n, chunk), want));
    }
  }
}

// Ten turns, each resending the history: the same greedy replies with the cache as without,
// the turns after the first resumed (most of their prompt on a KV cache; from the last
// snapshot at a multiple of --ubatch on a hybrid).
TEST(PromptCache, ChatTurnsEqualWithAndWithoutTheCache) {
  auto be = make_cpu_backend();
  for (const std::string fixture : {"qwen3_moe", "mixtral", "deepseek_v3", "qwen3_next", "qwen4_exp_qsa", "qwen4_exp_ple"}) {
    SCOPED_TRACE(fixture);
    LoadedModel m = load_model(fixture_dir(fixture), *be);
    const std::vector<int32_t> ids = fixture_ids(fixture, 120);
    BatchEngineOptions o;
    o.n_parallel = 2;
    o.n_ctx = 200;
    o.ubatch = 8;
    o.prompt_cache_bytes = 64 << 20;
    const CacheComparison c = with_and_without_cache(
        *m.model, o, [&](BatchEngine& engine, const auto&) { return chat(engine, ids, 10, 20, 6, 6); });
    const std::vector<Reply>& plain = c.plain;
    const std::vector<Reply>& cached = c.cached;
    const PromptCacheCounters& pc = c.counters;
    ASSERT_EQ(plain.size(), cached.size());
    const bool hybrid = m.model->snapshot_bytes() > 0;
    for (size_t t = 0; t < plain.size(); ++t) {
      SCOPED_TRACE(str("turn ", t + 1));
      EXPECT_EQ(plain[t].result.cached_tokens, 0);
      const int64_t n_prompt = cached[t].result.prompt_tokens, got = cached[t].result.cached_tokens;
      if (t == 0) {
        EXPECT_EQ(got, 0);
      } else if (hybrid) {
        // The last snapshot within the previous prompt (its prefill's last multiple of --ubatch).
        EXPECT_EQ(got, (n_prompt - 6 - 6) / o.ubatch * o.ubatch);
      } else {
        // All but the last reply token (never run) and the user's new tokens.
        EXPECT_EQ(got, n_prompt - 6 - 1);
      }
    }
    EXPECT_EQ(pc.requests, 10u);
    EXPECT_EQ(pc.hits, 9u);
    EXPECT_LE(pc.bytes, pc.budget_bytes);
  }
}

// A budget that holds one prefix: three chats take turns on one sequence; what the sequence
// held goes into an entry when another chat takes it, evicting the entry before; a chat whose
// prefix went is prefilled whole. Answers are those without a cache.
TEST(PromptCache, EvictionUnderASmallBudget) {
  auto be = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir("qwen3_moe"), *be);
  Model& model = *m.model;
  const std::vector<int32_t> ids = fixture_ids("qwen3_moe", 160);
  BatchEngineOptions o;
  o.n_parallel = 1;
  o.n_ctx = 128;
  o.ubatch = 16;
  o.prompt_cache_bytes = model.prefix_bytes(256) * 3 / 2;  // one entry (rows in steps of 256) fits, two do not
  // Turns of chats A, B, C; the cache's counters after each.
  const std::vector<int> order = {0, 1, 0, 2, 1, 2};
  std::vector<PromptCacheCounters> after;
  const std::vector<Reply> cached =
      with_and_without_cache(
          model, o, [&](BatchEngine& engine, const auto& each) { return take_turns(engine, ids, order, each); },
          [&](BatchEngine& engine) {
            after.push_back(engine.counters().prompt_cache);
            EXPECT_LE(after.back().bytes, after.back().budget_bytes);
          })
          .cached;
  // 0: A runs. 1: B; A's 33 tokens (prompt and the replies' tokens run) go into an entry.
  // 2: A again, from that entry (B cannot be kept: the one entry is the one A resumes from).
  // 3: C; A's 47 tokens replace A's entry. 4: B again: nothing of it kept, prefilled whole; C
  // goes into an entry, evicting A's. 5: C again, from its entry.
  const std::vector<int64_t> want = {0, 0, 33, 0, 0, 33};
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(cached[i].result.cached_tokens, want[i]) << "request " << i;
  EXPECT_EQ(after[3].evictions, 0u);
  EXPECT_EQ(after[4].evictions, 1u);
  EXPECT_EQ(after[5].entries, 1u);
}

// A hybrid's budget full of snapshots that a free sequence holds: a running prompt's push them
// out, earliest first, so that its chat's next turn resumes; the other chat's went.
TEST(PromptCache, RunningPromptsSnapshotsPushOutFreeOnes) {
  auto be = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir("qwen3_next"), *be);
  Model& model = *m.model;
  const std::vector<int32_t> ids = fixture_ids("qwen3_next", 160);
  BatchEngineOptions o;
  o.n_parallel = 2;
  o.n_ctx = 128;
  o.ubatch = 8;
  o.prompt_cache_bytes = 3 * model.snapshot_bytes();  // three snapshots, no entry
  // A's 30-token prompt leaves snapshots at 8, 16 and 24 (the budget); B's take their place
  // (A's sequence is free, B's was empty: nothing is copied out), so that B's next turn resumes
  // at 24 and A's finds nothing; B's second turn has no room for more.
  const std::vector<int> order = {0, 1, 1, 0};
  std::vector<PromptCacheCounters> after;
  const CacheComparison c = with_and_without_cache(
      model, o, [&](BatchEngine& engine, const auto& each) { return take_turns(engine, ids, order, each); },
      [&](BatchEngine& engine) { after.push_back(engine.counters().prompt_cache); });
  const std::vector<int64_t> want = {0, 0, 24, 0};
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(c.cached[i].result.cached_tokens, want[i]) << "request " << i;
    EXPECT_LE(after[i].bytes, after[i].budget_bytes) << "request " << i;
  }
  EXPECT_EQ(after[0].snapshots, 3u);
  EXPECT_EQ(after[1].snapshots, 3u);
}

// With a host tier, what the backend's budget cannot hold moves to host memory and back: the
// chats of the test above all resume, from the host tier after the first round.
TEST(PromptCache, HostTierKeepsWhatTheBackendEvicts) {
  auto be = make_cpu_backend();
  for (const std::string fixture : {"qwen3_moe", "mixtral", "qwen3_next", "qwen4_exp_qsa", "qwen4_exp_ple"}) {
    SCOPED_TRACE(fixture);
    LoadedModel m = load_model(fixture_dir(fixture), *be);
    Model& model = *m.model;
    const std::vector<int32_t> ids = fixture_ids(fixture, 160);
    BatchEngineOptions o;
    o.n_parallel = 1;
    o.n_ctx = 128;
    o.ubatch = 8;
    // One entry fits the backend's budget (with a hybrid's snapshots), several the host's.
    o.prompt_cache_bytes = model.prefix_bytes(256) * 3 / 2 + 8 * model.snapshot_bytes();
    o.prompt_cache_host_bytes = 64 << 20;
    const std::vector<int> order = {0, 1, 0, 2, 1, 2, 0};
    const CacheComparison c = with_and_without_cache(
        model, o, [&](BatchEngine& engine, const auto&) { return take_turns(engine, ids, order); });
    const std::vector<Reply>& cached = c.cached;
    const PromptCacheCounters& pc = c.counters;
    // Every later turn resumes: 2 from the backend's entry; 4, 5 and 6 from the host tier (B
    // and C went there straight, their room on the backend taken by the entry resumed then;
    // A's went there when B's came back). A KV cache resumes all but the last reply token.
    // A hybrid resumes from the last snapshot within the chat's previous prompt.
    const bool hybrid = model.snapshot_bytes() > 0;
    const std::vector<int64_t> previous = {0, 0, 30, 0, 30, 30, 44};  // the chat's previous prompt
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t p = previous[i], want = p == 0 ? 0 : hybrid ? p / o.ubatch * o.ubatch : p + 3;
      EXPECT_EQ(cached[i].result.cached_tokens, want) << "request " << i;
    }
    EXPECT_EQ(pc.host_hits, 3u);
    EXPECT_GT(pc.host_entries, 0u);
    EXPECT_LE(pc.bytes, pc.budget_bytes);
    EXPECT_LE(pc.host_bytes, pc.host_budget_bytes);
  }
}

// Four requests sharing a 150-token prefix, submitted together: the first prefills it, the
// others wait for it and copy it (150 tokens each), then prefill their own tails.
TEST(PromptCache, ConcurrentRequestsShareAPrefix) {
  auto be = make_cpu_backend();
  for (const std::string fixture : {"qwen3_moe", "qwen3_next"}) {
    SCOPED_TRACE(fixture);
    LoadedModel m = load_model(fixture_dir(fixture), *be);
    const std::vector<int32_t> ids = fixture_ids(fixture, 200);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> p(ids.begin(), ids.begin() + 160);
      p[150] = 200 + i;  // the tails differ from their first token
      prompts.push_back(p);
    }
    BatchEngineOptions o;
    o.n_parallel = 4;
    o.n_ctx = 200;
    o.ubatch = 16;
    auto run = [&](uint64_t budget, BatchEngineCounters& counters) {
      o.prompt_cache_bytes = budget;
      std::vector<std::unique_ptr<Collector>> cs;
      BatchEngine engine(*m.model, o);
      for (const auto& p : prompts) {
        cs.push_back(std::make_unique<Collector>());
        engine.submit(cs.back()->request(p, 5));
      }
      std::vector<Reply> out;
      for (auto& c : cs) out.push_back(c->wait());
      counters = engine.counters();
      return out;
    };
    BatchEngineCounters c_plain, c_cached;
    const std::vector<Reply> plain = run(0, c_plain), cached = run(64 << 20, c_cached);
    const int64_t shared = m.model->snapshot_bytes() > 0 ? 144 : 150;  // a hybrid: the last multiple of 16
    int64_t total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(cached[i].tokens, plain[i].tokens) << "request " << i;
      EXPECT_EQ(cached[i].result.cached_tokens, i == 0 ? 0 : shared) << "request " << i;
      total += cached[i].result.cached_tokens;
    }
    EXPECT_EQ(c_cached.prompt_cache.cached_tokens, static_cast<uint64_t>(total));
    EXPECT_LT(c_cached.prefill_chunks, c_plain.prefill_chunks / 2) << "the shared prefix was prefilled once";
  }
}
