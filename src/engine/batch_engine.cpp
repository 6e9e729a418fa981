// BatchEngine: the engine thread's loop (admit, one prefill chunk, one batched decode step),
// delivery of tokens and the ends of requests.
#include "engine/batch_engine.h"

#include <algorithm>
#include <system_error>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace sluice {

using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The options, checked before the engine allocates its sequences' states.
const BatchEngineOptions& checked(Model& model, const BatchEngineOptions& o) {
  SLUICE_CHECK(o.n_parallel >= 1 && o.n_parallel <= 64, Status::invalid_argument, "--parallel ", o.n_parallel,
               ": expected 1 to 64 sequences");
  SLUICE_CHECK(o.n_ctx >= 2, Status::invalid_argument, "--ctx ", o.n_ctx, ": a sequence needs at least 2 tokens");
  SLUICE_CHECK(o.ubatch >= 1, Status::invalid_argument, "--ubatch ", o.ubatch, ": expected at least 1 token");
  model.check_context(o.n_ctx, str("--ctx ", o.n_ctx));
  return o;
}

PromptCacheOptions cache_options(const BatchEngineOptions& o) {
  PromptCacheOptions c;
  c.budget_bytes = o.prompt_cache_bytes;
  c.host_budget_bytes = o.prompt_cache_host_bytes;
  c.grid = o.ubatch;  // a hybrid's snapshots at the prefill chunks' ends
  return c;
}

}  // namespace

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

struct BatchEngine::Job {
  uint64_t id = 0;
  CompletionRequest req;
  Sampler sampler;
  int state = -1;            // its sequence in cache_, once admitted
  int64_t prefilled = 0;     // prompt tokens run (or resumed)
  int64_t cached = 0;        // of them, resumed from the prompt cache
  std::unordered_map<uint64_t, int64_t> shared;  // prompt tokens shared with other jobs, by id
  int64_t generated = 0;     // tokens delivered
  int32_t next = -1;         // the token the next decode step runs
  bool decoding = false;     // the prompt is done
  bool ended = false;
  Clock::time_point submitted = Clock::now(), admitted{};
  double first_token_seconds = 0;
  Job(uint64_t i, CompletionRequest r) : id(i), req(std::move(r)), sampler(req.sampling) {}
};

BatchEngine::BatchEngine(Model& model, const BatchEngineOptions& options)
    : model_(model), opt_(checked(model, options)), cache_(model, opt_.n_parallel, opt_.n_ctx, cache_options(opt_)) {
  counters_.n_parallel = opt_.n_parallel;
  counters_.prompt_cache = cache_.counters();
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (const std::system_error& e) {
    fail(Status::unavailable, "cannot start the engine thread (the system's thread or memory limit): ", e.what());
  }
}

BatchEngine::~BatchEngine() { stop(); }

uint64_t BatchEngine::submit(CompletionRequest request) {
  const int64_t n_prompt = static_cast<int64_t>(request.prompt.size()), V = model_.info().n_vocab;
  SLUICE_CHECK(n_prompt > 0, Status::invalid_argument, "the prompt is empty");
  SLUICE_CHECK(request.max_tokens >= 0, Status::invalid_argument, "max_tokens must be >= 0 (got ", request.max_tokens,
               ")");
  SLUICE_CHECK(n_prompt + request.max_tokens <= opt_.n_ctx, Status::invalid_argument, "the prompt (", n_prompt,
               " tokens) and max_tokens (", request.max_tokens, ") exceed the context of ", opt_.n_ctx, " tokens");
  for (int32_t t : request.prompt)
    SLUICE_CHECK(t >= 0 && t < V, Status::invalid_argument, "token id ", t, " is outside the vocabulary [0, ", V, ")");
  auto job = std::make_unique<Job>(0, std::move(request));  // Sampler's constructor checks the sampling values
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) {
    ++counters_.requests_refused;
    fail(Status::unavailable, "the server is shutting down");
  }
  if (queue_.size() >= opt_.max_queue) {
    ++counters_.requests_refused;
    fail(Status::unavailable, "too many requests waiting (", queue_.size(), "); try again later");
  }
  job->id = next_id_++;
  const uint64_t id = job->id;
  queue_.push_back(std::move(job));
  ++counters_.requests_submitted;
  counters_.queued = static_cast<int64_t>(queue_.size());
  cv_.notify_all();
  return id;
}

void BatchEngine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancel_ids_.push_back(id);
  cv_.notify_all();
}

void BatchEngine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void BatchEngine::set_step_observer(std::function<void()> observer) {
  std::lock_guard<std::mutex> lk(mu_);
  step_observer_ = std::move(observer);
}

BatchEngineCounters BatchEngine::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  return counters_;
}

void BatchEngine::finish(Job& job, FinishReason reason, std::string error) {
  if (job.ended) return;
  job.ended = true;
  CompletionResult r;
  r.reason = reason;
  r.error = std::move(error);
  r.prompt_tokens = static_cast<int64_t>(job.req.prompt.size());
  r.completion_tokens = job.generated;
  r.cached_tokens = job.cached;
  r.queue_seconds = job.state >= 0 ? std::chrono::duration<double>(job.admitted - job.submitted).count() : seconds_since(job.submitted);
  r.first_token_seconds = job.first_token_seconds;
  r.total_seconds = seconds_since(job.submitted);
  // Its sequence is free before anyone hears that the request ended; after an error what it
  // holds is not used again.
  if (job.state >= 0) cache_.release(job.state, reason != FinishReason::error);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (job.state >= 0) {
      --counters_.live_sequences;
      counters_.slots_in_use = opt_.n_parallel - cache_.free_count();
    }
    ++counters_.requests_done;
    if (reason == FinishReason::cancelled) ++counters_.requests_cancelled;
    if (reason == FinishReason::error) ++counters_.requests_failed;
  }
  if (job.req.on_done) {
    try {
      job.req.on_done(r);
    } catch (const std::exception& e) {
      LOG_ERROR("batch engine: a request's completion callback failed: ", e.what());
    }
  }
}

bool BatchEngine::deliver(Job& job, int32_t token) {
  SLUICE_ASSERT(!job.ended);  // nothing reaches a request's callbacks after its on_done
  if (job.req.eos_id && token == *job.req.eos_id) {
    finish(job, FinishReason::stop);
    return false;
  }
  ++job.generated;
  if (job.generated == 1) {
    job.first_token_seconds = seconds_since(job.submitted);
    std::lock_guard<std::mutex> lk(mu_);
    counters_.first_token_seconds_sum += job.first_token_seconds;
    ++counters_.first_token_count;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++counters_.generated_tokens;
  }
  bool go_on = true;
  try {
    go_on = !job.req.on_token || job.req.on_token(token);
  } catch (const std::exception& e) {
    finish(job, FinishReason::error, str("the request's token callback failed: ", e.what()));
    return false;
  }
  if (!go_on || (job.req.constraint && job.req.constraint->must_end())) {
    finish(job, FinishReason::stop);
    return false;
  }
  if (job.generated >= job.req.max_tokens) {
    finish(job, FinishReason::length);
    return false;
  }
  job.next = token;
  return true;
}

void BatchEngine::reap() {
  std::lock_guard<std::mutex> lk(mu_);
  std::erase_if(running_, [](const std::unique_ptr<Job>& j) { return j->ended; });
}

bool BatchEngine::admit() {
  std::vector<std::unique_ptr<Job>> dropped;   // queued requests that were cancelled
  std::vector<std::unique_ptr<Job>> admitted;  // queued requests that get a sequence now
  std::vector<uint64_t> ids;                   // requests to cancel
  {
    std::lock_guard<std::mutex> lk(mu_);
    ids.swap(cancel_ids_);
    if (stopping_) {
      while (!queue_.empty()) {
        dropped.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      for (const auto& j : running_) ids.push_back(j->id);
    }
    for (uint64_t id : ids) {
      auto it = std::find_if(queue_.begin(), queue_.end(), [&](const auto& q) { return q->id == id; });
      if (it == queue_.end()) continue;
      dropped.push_back(std::move(*it));
      queue_.erase(it);
    }
    const size_t n_free = static_cast<size_t>(cache_.free_count());
    while (!stopping_ && !queue_.empty() && admitted.size() < n_free) {
      admitted.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    counters_.queued = static_cast<int64_t>(queue_.size());
  }
  for (auto& j : dropped) finish(*j, FinishReason::cancelled);
  // Each takes a sequence and starts after the longest prefix of its prompt held anywhere.
  for (auto& j : admitted) {
    try {
      j->state = cache_.acquire(j->req.prompt);
    } catch (const std::exception& e) {
      finish(*j, FinishReason::error, e.what());
      continue;
    }
    j->admitted = Clock::now();
    j->prefilled = j->cached = cache_.state(j->state).n_past;
    std::lock_guard<std::mutex> lk(mu_);
    counters_.prompt_tokens += j->req.prompt.size();
    ++counters_.live_sequences;
    running_.push_back(std::move(j));
  }
  for (auto& j : running_)
    if (std::find(ids.begin(), ids.end(), j->id) != ids.end()) finish(*j, FinishReason::cancelled);
  {
    std::lock_guard<std::mutex> lk(mu_);
    counters_.slots_in_use = opt_.n_parallel - cache_.free_count();
    counters_.prompt_cache = cache_.counters();
  }
  reap();
  return !running_.empty();
}

void BatchEngine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      const bool work = !queue_.empty() || !cancel_ids_.empty() || !running_.empty() || stopping_;
      if (!work) cv_.wait(lk, [&] { return !queue_.empty() || !cancel_ids_.empty() || stopping_; });
    }
    const bool any = admit();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_ && running_.empty() && queue_.empty()) return;
    }
    if (!any) continue;
    const auto t0 = Clock::now();
    prefill_one();
    decode_step();
    reap();
    std::function<void()> observer;
    {
      std::lock_guard<std::mutex> lk(mu_);
      counters_.busy_seconds += seconds_since(t0);
      counters_.prompt_cache = cache_.counters();
      observer = step_observer_;
    }
    if (observer) {
      try {
        observer();
      } catch (const std::exception& e) {
        LOG_WARN("batch engine: the step observer failed: ", e.what());
      }
    }
  }
}

void BatchEngine::prefill_one() {
  // Prompts that share a prefix with another running one: each jumps to what the other holds
  // of it, and waits while an older one prefills the tokens it needs next.
  if (cache_.enabled())
    for (auto& j : running_)
      if (!j->ended && !j->decoding) catch_up(*j);
  std::vector<Job*> prefills;
  for (auto& j : running_)
    if (!j->ended && !j->decoding && !(cache_.enabled() && waits_for_another(*j))) prefills.push_back(j.get());
  if (prefills.empty()) return;
  Job& job = *prefills[prefill_cursor_++ % prefills.size()];
  SequenceState& state = cache_.state(job.state);
  const int64_t n_prompt = static_cast<int64_t>(job.req.prompt.size());
  const int64_t n = std::min(opt_.ubatch, n_prompt - job.prefilled);
  const int64_t V = model_.info().n_vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  const std::span<const int32_t> chunk =
      std::span<const int32_t>(job.req.prompt).subspan(static_cast<size_t>(job.prefilled), static_cast<size_t>(n));
  try {
    model_.forward(chunk, state, logits, false);
    cache_.ran_prompt(job.state, chunk);
  } catch (const std::exception& e) {
    finish(job, FinishReason::error, e.what());
    return;
  }
  job.prefilled += n;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++counters_.prefill_chunks;
  }
  if (job.prefilled < n_prompt) return;
  job.decoding = true;
  if (job.req.max_tokens == 0) {
    finish(job, FinishReason::length);
    return;
  }
  // The first token comes from the prompt's last logits.
  sample_and_deliver(job, logits);
}

void BatchEngine::sample_and_deliver(Job& job, std::span<const float> row) {
  const int64_t V = model_.info().n_vocab;
  const size_t n_sampled =
      static_cast<size_t>(opt_.n_vocab_sampled > 0 ? std::min(opt_.n_vocab_sampled, V) : V);
  const std::span<const float> sampled = row.first(n_sampled);
  const int64_t bad = first_non_finite(sampled);
  if (bad >= 0) {
    finish(job, FinishReason::error,
           str("the model's logits are not finite at generation step ", job.generated + 1, " (token ", bad, " has ",
               sampled[static_cast<size_t>(bad)], "): NaN or infinite weights or activations"));
    return;
  }
  const int32_t t = draw(job, sampled);
  if (t >= 0) deliver(job, t);
}

int32_t BatchEngine::draw(Job& job, std::span<const float> row) {
  if (!job.req.constraint) return job.sampler.sample(row);
  const int32_t t = job.sampler.sample_masked(row, job.req.constraint->allowed());
  if (t < 0) {
    finish(job, FinishReason::error, "the output's grammar allows no token of the vocabulary here");
    return -1;
  }
  job.req.constraint->accept(t);
  return t;
}

void BatchEngine::count_decode_step(size_t rows) {
  std::lock_guard<std::mutex> lk(mu_);
  ++counters_.decode_steps;
  counters_.decode_rows += rows;
}

void BatchEngine::decode_step() {
  std::vector<Job*> batch;
  for (auto& j : running_)
    if (!j->ended && j->decoding) batch.push_back(j.get());
  if (batch.empty()) return;
  const int64_t V = model_.info().n_vocab;
  const int64_t n_valid = opt_.n_vocab_sampled > 0 ? std::min(opt_.n_vocab_sampled, V) : V;
  // Each job's rule and its sampler's next draw: the step draws on the device where it can
  // (Model::forward_batch_sample), the same token sample_and_deliver would draw from its row.
  std::vector<int32_t> tokens, next(batch.size(), -1);
  std::vector<SequenceState*> states;
  for (Job* j : batch) {
    tokens.push_back(j->next);
    states.push_back(&cache_.state(j->state));
  }
  const bool constrained = std::any_of(batch.begin(), batch.end(), [](Job* j) { return j->req.constraint != nullptr; });
  if (constrained) {
    // A row's mask is applied on the host: the batch's logits come back and every row is
    // sampled there (the rule and the draws are the device's, so unconstrained rows draw the
    // tokens they would have drawn there).
    std::vector<float> logits(batch.size() * static_cast<size_t>(V));
    try {
      model_.forward_batch(tokens, states, logits);
    } catch (const std::exception& e) {
      for (Job* j : batch) finish(*j, FinishReason::error, e.what());
      return;
    }
    for (size_t b = 0; b < batch.size(); ++b) cache_.ran_decode(batch[b]->state, tokens[b]);
    count_decode_step(batch.size());
    for (size_t b = 0; b < batch.size(); ++b)
      sample_and_deliver(*batch[b], std::span<const float>(logits).subspan(b * static_cast<size_t>(V), static_cast<size_t>(V)));
    return;
  }
  std::vector<SampleRule> rules;
  std::vector<int64_t> draws;
  for (Job* j : batch) {
    rules.push_back(j->sampler.rule());
    draws.push_back(j->sampler.next_draw53());
  }
  try {
    model_.forward_batch_sample(tokens, states, rules, n_valid, draws, next);
  } catch (const std::exception& e) {
    for (Job* j : batch) finish(*j, FinishReason::error, e.what());
    return;
  }
  for (size_t b = 0; b < batch.size(); ++b) cache_.ran_decode(batch[b]->state, tokens[b]);
  count_decode_step(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    Job& job = *batch[b];
    if (next[b] < 0) {
      finish(job, FinishReason::error,
             str("the model's logits are not finite at generation step ", job.generated + 1,
                 ": NaN or infinite weights or activations"));
      continue;
    }
    deliver(job, next[b]);
  }
}

int64_t BatchEngine::shared_prefix(Job& a, const Job& b) {
  auto it = a.shared.find(b.id);
  if (it != a.shared.end()) return it->second;
  const auto& p = a.req.prompt;
  const auto& q = b.req.prompt;
  const auto [ip, iq] = std::mismatch(p.begin(), p.end(), q.begin(), q.end());
  const int64_t n = static_cast<int64_t>(ip - p.begin());
  a.shared.emplace(b.id, n);
  return n;
}

void BatchEngine::catch_up(Job& job) {
  for (auto& other : running_) {
    if (other.get() == &job || other->ended) continue;
    if (cache_.reachable_from(job.state, job.req.prompt, other->state, shared_prefix(job, *other)) == 0) continue;
    const int64_t before = job.prefilled;
    try {
      job.prefilled = cache_.catch_up(job.state, job.req.prompt, other->state);
    } catch (const std::exception& e) {
      finish(job, FinishReason::error, e.what());
      return;
    }
    job.cached += job.prefilled - before;
  }
}

bool BatchEngine::waits_for_another(Job& job) {
  // The oldest of the prompts that share tokens never waits, so one of them always runs.
  for (auto& other : running_) {
    if (other.get() == &job || other->ended || other->decoding || other->id > job.id) continue;
    const int64_t point = cache_.resume_point_within(job.req.prompt, shared_prefix(job, *other));
    if (point > job.prefilled && other->prefilled < point) return true;
  }
  return false;
}

}  // namespace sluice
