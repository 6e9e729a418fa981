// BatchEngine (continuous batching): requests running together produce, each, exactly what
// the Generator (`sluice run`) produces for them alone, greedy and seeded, whatever the
// number of parallel sequences and the prefill chunk (prompts prefilled between decode
// steps); cancellation, stop callbacks, eos, max_tokens, a full queue and shutdown end
// requests with the right reason and give every sequence back (the engine's own counters).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "tests/models/fixture_util.h"
#include "engine/batch_engine.h"
#include "engine/generator.h"
#include "engine/json_schema.h"
#include "engine/token_mask.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  CompletionResult result;
};

// A request whose tokens and end land in a future.
struct Collector {
  std::mutex mu;
  std::vector<int32_t> tokens;
  std::promise<CompletionResult> done;
  std::function<bool(int32_t)> keep_going = [](int32_t) { return true; };

  CompletionRequest request(std::vector<int32_t> prompt, int64_t max_tokens, SamplingParams sampling) {
    CompletionRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling = sampling;
    r.on_token = [this](int32_t t) {
      std::lock_guard<std::mutex> lk(mu);
      tokens.push_back(t);
      return keep_going(t);
    };
    r.on_done = [this](const CompletionResult& res) { done.set_value(res); };
    return r;
  }
  Outcome wait() {
    auto f = done.get_future();
    Outcome o;
    if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {  // a failure, not a hang
      ADD_FAILURE() << "the request did not end within 60 s";
      o.result.reason = FinishReason::error;
      o.result.error = "no end within 60 s";
      return o;
    }
    o.result = f.get();
    std::lock_guard<std::mutex> lk(mu);
    o.tokens = tokens;
    return o;
  }
};

std::vector<int32_t> generate_alone(Model& m, const std::vector<int32_t>& prompt, int64_t n, SamplingParams s) {
  GenerateOptions g;
  g.n_predict = n;
  g.sampling = s;
  g.n_ctx = 128;
  std::vector<int32_t> out;
  Generator(m).generate(prompt, g, [&](int32_t t) {
    out.push_back(t);
    return true;
  });
  return out;
}

// Prompts of different lengths cut from the fixture's tokens.
std::vector<std::vector<int32_t>> prompts_of(const std::string& fixture, int count) {
  FixtureReference ref = read_reference(fixture);
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    const size_t len = 2 + (static_cast<size_t>(i) * 5) % (ids.size() - 2);
    out.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i % 3), ids.begin() + static_cast<std::ptrdiff_t>(i % 3 + len));
  }
  return out;
}

}  // namespace

TEST(BatchEngine, ConcurrentRequestsEqualEachAlone) {
  auto be = make_cpu_backend();
  for (const std::string fixture : {"qwen3_moe", "olmoe", "qwen3_next"}) {
    LoadedModel m = load_model(fixture_dir(fixture), *be);
    const auto prompts = prompts_of(fixture, 7);
    const SamplingParams greedy{0.0f, 1.0f, 0, 0};
    const SamplingParams seeded{0.9f, 0.95f, 20, 1234};
    // Each request alone, before any engine runs the model (the model is not shared between threads).
    std::vector<std::vector<int32_t>> alone;
    for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(generate_alone(*m.model, prompts[i], 9, i % 2 ? seeded : greedy));
    for (int parallel : {1, 3, 7}) {
      for (int64_t ubatch : {int64_t{3}, int64_t{256}}) {
        SCOPED_TRACE(str(fixture, ", ", parallel, " parallel, ubatch ", ubatch));
        BatchEngineOptions o;
        o.n_parallel = parallel;
        o.n_ctx = 128;
        o.ubatch = ubatch;
        std::vector<std::unique_ptr<Collector>> cs;  // before the engine, which stops first
        BatchEngine engine(*m.model, o);
        for (size_t i = 0; i < prompts.size(); ++i) {
          cs.push_back(std::make_unique<Collector>());
          engine.submit(cs.back()->request(prompts[i], 9, i % 2 ? seeded : greedy));
        }
        for (size_t i = 0; i < prompts.size(); ++i) {
          const Outcome o = cs[i]->wait();
          EXPECT_EQ(o.result.reason, FinishReason::length);
          EXPECT_EQ(o.tokens, alone[i]) << "request " << i;
          EXPECT_EQ(o.result.completion_tokens, 9);
          EXPECT_EQ(o.result.prompt_tokens, static_cast<int64_t>(prompts[i].size()));
        }
        const BatchEngineCounters c = engine.counters();
        EXPECT_EQ(c.requests_done, prompts.size());
        EXPECT_EQ(c.generated_tokens, 9 * prompts.size());
        EXPECT_EQ(c.live_sequences, 0);
        EXPECT_EQ(c.slots_in_use, 0);
        if (parallel > 1) {
          EXPECT_GT(c.decode_rows, c.decode_steps) << "decode steps carried several sequences";
        }
      }
    }
  }
}

TEST(BatchEngine, EndsOfRequests) {
  auto be = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir("qwen3_moe"), *be);
  const auto prompts = prompts_of("qwen3_moe", 4);
  const SamplingParams greedy{0.0f, 1.0f, 0, 0};
  BatchEngineOptions o;
  o.n_parallel = 2;
  o.n_ctx = 64;
  o.max_queue = 3;
  const std::vector<int32_t> alone = generate_alone(*m.model, prompts[1], 6, greedy);  // before the engine runs
  Collector zero, eos, stop;  // before the engine, which stops first
  BatchEngine engine(*m.model, o);

  // max_tokens 0: no token, reason length.
  engine.submit(zero.request(prompts[0], 0, greedy));
  Outcome z = zero.wait();
  EXPECT_EQ(z.result.reason, FinishReason::length);
  EXPECT_TRUE(z.tokens.empty());

  // The eos token ends a request without being delivered.
  CompletionRequest er = eos.request(prompts[1], 6, greedy);
  er.eos_id = alone[3];
  engine.submit(std::move(er));
  Outcome e = eos.wait();
  EXPECT_EQ(e.result.reason, FinishReason::stop);
  EXPECT_EQ(e.tokens, std::vector<int32_t>(alone.begin(), alone.begin() + 3));

  // on_token returning false (a stop string) ends it after that token.
  stop.keep_going = [n = 0](int32_t) mutable { return ++n < 2; };
  engine.submit(stop.request(prompts[2], 6, greedy));
  Outcome s = stop.wait();
  EXPECT_EQ(s.result.reason, FinishReason::stop);
  EXPECT_EQ(s.tokens.size(), 2u);

  // Bad requests are refused at once.
  EXPECT_THROW(engine.submit(zero.request({}, 4, greedy)), Error);
  EXPECT_THROW(engine.submit(zero.request(prompts[0], 64, greedy)), Error);   // beyond the context
  EXPECT_THROW(engine.submit(zero.request({1, 1 << 30}, 4, greedy)), Error);  // outside the vocabulary
  EXPECT_THROW(engine.submit(zero.request(prompts[0], 4, SamplingParams{-1.0f, 1.0f, 0, 0})), Error);
  EXPECT_EQ(engine.counters().live_sequences, 0);
}

TEST(BatchEngine, CancelQueueAndShutdownFreeEverySequence) {
  auto be = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir("qwen3_moe"), *be);
  const auto prompts = prompts_of("qwen3_moe", 6);
  const SamplingParams greedy{0.0f, 1.0f, 0, 0};
  BatchEngineOptions o;
  o.n_parallel = 2;
  o.n_ctx = 128;
  o.max_queue = 2;

  // Two long requests hold both sequences (each waits in its token callback until the gate
  // opens); two more wait in the queue; a fifth is refused: the queue is full. The order is
  // forced, not raced: the first request's tokens wait until the second is submitted and then
  // pass until the second delivers its first token (so the worker, blocked in the first's
  // callback, cannot leave the second queued), and the queue is filled only once the second
  // holds the worker. Everything the callbacks touch is declared before the engine, which
  // stops (and joins its worker) before they go.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false, second_submitted = false, second_running = false;
  std::vector<std::unique_ptr<Collector>> cs;
  for (int i = 0; i < 4; ++i) cs.push_back(std::make_unique<Collector>());
  cs[0]->keep_going = [&](int32_t) {
    std::unique_lock<std::mutex> lk(gate_mu);
    gate_cv.wait_for(lk, std::chrono::seconds(30), [&] { return open || (second_submitted && !second_running); });
    return true;
  };
  cs[1]->keep_going = [&](int32_t) {
    std::unique_lock<std::mutex> lk(gate_mu);
    second_running = true;
    gate_cv.notify_all();
    gate_cv.wait_for(lk, std::chrono::seconds(30), [&] { return open; });
    return true;
  };
  auto open_gate = [&] {
    {
      std::lock_guard<std::mutex> lk(gate_mu);
      open = true;
    }
    gate_cv.notify_all();
  };
  Collector refused;
  auto engine = std::make_unique<BatchEngine>(*m.model, o);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 2; ++i)
    ids.push_back(engine->submit(cs[static_cast<size_t>(i)]->request(prompts[static_cast<size_t>(i)], 100, greedy)));
  {
    std::unique_lock<std::mutex> lk(gate_mu);
    second_submitted = true;
    gate_cv.notify_all();
    if (!gate_cv.wait_for(lk, std::chrono::seconds(30), [&] { return second_running; })) {
      lk.unlock();
      open_gate();
      FAIL() << "the second request never delivered a token";
    }
  }
  EXPECT_EQ(engine->counters().live_sequences, 2);
  for (int i = 2; i < 4; ++i)
    ids.push_back(engine->submit(cs[static_cast<size_t>(i)]->request(prompts[static_cast<size_t>(i)], 100, greedy)));
  EXPECT_EQ(engine->counters().queued, 2);
  try {
    engine->submit(refused.request(prompts[4], 4, greedy));
    ADD_FAILURE() << "a full queue took a request";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unavailable);
  }
  // Cancel one running and one queued request.
  engine->cancel(ids[0]);
  engine->cancel(ids[3]);
  open_gate();
  EXPECT_EQ(cs[0]->wait().result.reason, FinishReason::cancelled);
  EXPECT_EQ(cs[3]->wait().result.reason, FinishReason::cancelled);
  EXPECT_EQ(cs[2]->wait().result.reason, FinishReason::length);  // queued, then admitted in a freed sequence
  // Shutdown ends the one still running (cancelled) and refuses new requests.
  engine->stop();
  const CompletionResult last = cs[1]->wait().result;
  EXPECT_TRUE(last.reason == FinishReason::cancelled || last.reason == FinishReason::length);
  try {
    engine->submit(refused.request(prompts[5], 4, greedy));
    ADD_FAILURE() << "a stopped engine took a request";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unavailable);
  }
  const BatchEngineCounters c = engine->counters();
  EXPECT_EQ(c.live_sequences, 0);
  EXPECT_EQ(c.slots_in_use, 0);
  EXPECT_EQ(c.queued, 0);
  EXPECT_EQ(c.requests_done, 4u);
  EXPECT_GE(c.requests_cancelled, 2u);
  EXPECT_EQ(c.requests_refused, 2u);
}

// Constrained requests beside free ones in the same decode steps: the constrained rows' replies
// are sentences of their grammar (a JSON schema over the fixture's vocabulary) that end by
// themselves, and the free rows, sampled on the host in those steps, still draw exactly what
// they draw alone.
TEST(BatchEngine, ConstrainedRowsBesideFreeOnes) {
  auto be = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir("qwen3_moe"), *be);
  const auto prompts = prompts_of("qwen3_moe", 5);
  const SamplingParams greedy{0.0f, 1.0f, 0, 0};
  const SamplingParams seeded{0.9f, 0.95f, 20, 77};
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(generate_alone(*m.model, prompts[i], 12, i % 4 ? seeded : greedy));
  const auto grammar = json_schema_grammar(nlohmann::json::parse(
      R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"], "additionalProperties": false})"));
  auto matcher = std::make_shared<GrammarMatcher>(grammar, std::make_shared<TokenVocabulary>(*m.tokenizer));
  BatchEngineOptions o;
  o.n_parallel = 5;
  o.n_ctx = 128;
  std::vector<std::unique_ptr<Collector>> cs;
  BatchEngine engine(*m.model, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    cs.push_back(std::make_unique<Collector>());
    CompletionRequest r = cs.back()->request(prompts[i], i % 2 ? 60 : 12, i % 4 ? seeded : greedy);
    if (i % 2) {
      r.constraint = std::make_shared<GrammarConstraint>(matcher, m.eos_id());
      r.eos_id = m.eos_id();
    }
    engine.submit(std::move(r));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome out = cs[i]->wait();
    if (i % 2 == 0) {
      EXPECT_EQ(out.tokens, alone[i]) << "free request " << i;
      continue;
    }
    EXPECT_EQ(out.result.reason, FinishReason::stop) << "constrained request " << i;
    const std::string text = m.tokenizer->decode(out.tokens);
    EXPECT_TRUE(grammar->matches(text)) << text;
    const nlohmann::json v = nlohmann::json::parse(text);
    EXPECT_TRUE(v["a"].get<int>() >= 0 && v["a"].get<int>() <= 99) << text;
  }
}
