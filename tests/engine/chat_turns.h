// Chats through a BatchEngine, for the prompt cache's tests (CPU and CUDA): requests whose
// tokens and end are collected, a chat whose every turn resends the history, chats taking
// turns on the engine, and the token ids they are cut from.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "engine/batch_engine.h"

namespace sluice::test {

// The fixture's prompt and continuation ids, repeated to n tokens.
std::vector<int32_t> fixture_ids(const std::string& fixture, size_t n);

// A greedy request whose tokens and end are collected.
struct Collector {
  std::mutex mu;
  std::vector<int32_t> tokens;
  std::promise<CompletionResult> done;

  CompletionRequest request(std::vector<int32_t> prompt, int64_t max_tokens);
  // The tokens and the end, once the request ended (a failure after 120 s, not a hang).
  struct Reply {
    std::vector<int32_t> tokens;
    CompletionResult result;
  };
  Reply wait();
};

using Reply = Collector::Reply;

// One greedy request, waited for.
Reply ask(BatchEngine& engine, const std::vector<int32_t>& prompt, int64_t max_tokens);

// A chat of `turns` turns: the first prompt is ids' first `first` tokens; each next one is the
// last one, its reply (`reply` tokens) and `user` new tokens cut from ids at the turn's own
// offset. The replies in order.
std::vector<Reply> chat(BatchEngine& engine, const std::vector<int32_t>& ids, int turns, size_t first, size_t user,
                        int64_t reply);

// Chats 0, 1, 2 take turns in `order` (30 first tokens each, the first one telling them
// apart; then each turn adds the 4-token reply and 10 new tokens); the replies in order.
// after_each: called after every turn.
std::vector<Reply> take_turns(BatchEngine& engine, const std::vector<int32_t>& ids, const std::vector<int>& order,
                              const std::function<void()>& after_each = {});

// The same requests through an engine without the prompt cache and through one with o's: the
// replies of both and the cache's counters at the end. run: the requests; after_each, given
// the engine with the cache: called by run (take_turns) after each request, or not at all.
struct CacheComparison {
  std::vector<Reply> plain, cached;
  PromptCacheCounters counters;
};
CacheComparison with_and_without_cache(
    Model& model, const BatchEngineOptions& o,
    const std::function<std::vector<Reply>(BatchEngine& engine, const std::function<void()>& after_each)>& run,
    const std::function<void(BatchEngine& engine)>& after_each = {});

}  // namespace sluice::test
