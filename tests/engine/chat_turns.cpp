// Chats through a BatchEngine (chat_turns.h).
#include "tests/engine/chat_turns.h"

#include <gtest/gtest.h>

#include <chrono>

#include "tests/models/fixture_util.h"

namespace sluice::test {

std::vector<int32_t> fixture_ids(const std::string& fixture, size_t n) {
  FixtureReference ref = read_reference(fixture);
  std::vector<int32_t> one = ref.prompt_ids;
  one.insert(one.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  std::vector<int32_t> ids;
  while (ids.size() < n) ids.insert(ids.end(), one.begin(), one.end());
  ids.resize(n);
  return ids;
}

CompletionRequest Collector::request(std::vector<int32_t> prompt, int64_t max_tokens) {
  CompletionRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = SamplingParams{0.0f, 1.0f, 0, 0};
  r.on_token = [this](int32_t t) {
    std::lock_guard<std::mutex> lk(mu);
    tokens.push_back(t);
    return true;
  };
  r.on_done = [this](const CompletionResult& res) { done.set_value(res); };
  return r;
}

Collector::Reply Collector::wait() {
  Reply r;
  auto f = done.get_future();
  if (f.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    ADD_FAILURE() << "the request did not end within 120 s";
    r.result = CompletionResult{FinishReason::error, "no end"};
    return r;
  }
  r.result = f.get();
  std::lock_guard<std::mutex> lk(mu);
  r.tokens = tokens;
  return r;
}

Reply ask(BatchEngine& engine, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  Collector c;
  engine.submit(c.request(prompt, max_tokens));
  return c.wait();
}

std::vector<Reply> chat(BatchEngine& engine, const std::vector<int32_t>& ids, int turns, size_t first, size_t user,
                        int64_t reply) {
  std::vector<Reply> out;
  std::vector<int32_t> prompt(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(first));
  for (int t = 0; t < turns; ++t) {
    out.push_back(ask(engine, prompt, reply));
    prompt.insert(prompt.end(), out.back().tokens.begin(), out.back().tokens.end());
    const size_t at = (first + static_cast<size_t>(t) * 7) % (ids.size() - user);
    prompt.insert(prompt.end(), ids.begin() + static_cast<std::ptrdiff_t>(at),
                  ids.begin() + static_cast<std::ptrdiff_t>(at + user));
  }
  return out;
}

std::vector<Reply> take_turns(BatchEngine& engine, const std::vector<int32_t>& ids, const std::vector<int>& order,
                              const std::function<void()>& after_each) {
  std::vector<std::vector<int32_t>> history(3);
  for (int c = 0; c < 3; ++c) {
    history[c].assign(ids.begin() + c * 40, ids.begin() + c * 40 + 30);
    history[c][0] = 100 + c;
  }
  std::vector<Reply> out;
  for (int c : order) {
    out.push_back(ask(engine, history[c], 4));
    history[c].insert(history[c].end(), out.back().tokens.begin(), out.back().tokens.end());
    history[c].insert(history[c].end(), ids.begin() + 120, ids.begin() + 130);
    if (after_each) after_each();
  }
  return out;
}

CacheComparison with_and_without_cache(
    Model& model, const BatchEngineOptions& o,
    const std::function<std::vector<Reply>(BatchEngine& engine, const std::function<void()>& after_each)>& run,
    const std::function<void(BatchEngine& engine)>& after_each) {
  CacheComparison out;
  {
    BatchEngineOptions off = o;
    off.prompt_cache_bytes = 0;
    off.prompt_cache_host_bytes = 0;
    BatchEngine engine(model, off);
    out.plain = run(engine, {});
  }
  BatchEngine engine(model, o);
  std::function<void()> each;
  if (after_each) each = [&] { after_each(engine); };
  out.cached = run(engine, each);
  out.counters = engine.counters().prompt_cache;
  EXPECT_EQ(out.cached.size(), out.plain.size());
  for (size_t i = 0; i < out.cached.size() && i < out.plain.size(); ++i)
    EXPECT_EQ(out.cached[i].tokens, out.plain[i].tokens) << "request " << i << " with the cache and without";
  return out;
}

}  // namespace sluice::test
