// BatchEngine: continuous batching for a server. Up to n_parallel sequences share each decode
// step (Model::forward_batch: one expert union for the batch); new prompts are prefilled in
// chunks of `ubatch` tokens between decode steps, one chunk per iteration, so running streams
// keep flowing while a long prompt is read; requests beyond n_parallel wait in a bounded
// queue. Each sequence owns one of n_parallel preallocated states (KV cache and recurrent
// state, "KV slots"), reused by the next request. With a prompt cache (prompt_cache_bytes,
// engine/prompt_cache.h) a prompt starts after the longest prefix of it that a sequence or
// the cache holds, and prompts that share a prefix prefill it once.
//
// One engine thread runs every model call; callers submit from any thread and get their
// tokens through callbacks on the engine thread (which must not block for long). A request
// ends by its end-of-sequence token, max_tokens, its on_token returning false (a stop string
// found, a client gone), cancel(), or an error: non-finite logits, or a model call that threw
// (a failed read, a device that stopped answering), which ends the requests of that call with
// its message while the others go on.
//
// Greedy output of a request does not depend on what else runs: every row of a batched step
// equals the sequence alone on the CPU, bit for bit (Model::forward_batch), and each request
// samples with its own seeded generator, one draw per token as `sluice run` does.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/prompt_cache.h"
#include "engine/sampler.h"
#include "engine/token_mask.h"
#include "models/model.h"

namespace sluice {

enum class FinishReason { stop, length, cancelled, error };
std::string_view finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct CompletionResult {
  FinishReason reason = FinishReason::stop;
  std::string error;              // reason == error: one line
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;      // prompt tokens resumed from the prompt cache, not prefilled
  double queue_seconds = 0;       // submitted -> admitted to a sequence
  double first_token_seconds = 0; // submitted -> first token (time to first token)
  double total_seconds = 0;       // submitted -> done
};

struct CompletionRequest {
  std::vector<int32_t> prompt;     // not empty; prompt + max_tokens within the engine's context
  int64_t max_tokens = 16;         // >= 0
  SamplingParams sampling;
  std::optional<int32_t> eos_id;   // ends the request (not delivered); none: never stops early
  // Called on the engine thread with each generated token; false ends the request (reason
  // stop: the caller found a stop string; or cancelled, when it says so through cancel()).
  std::function<bool(int32_t token)> on_token;
  // Called once, on the engine thread, when the request ended for any reason.
  std::function<void(const CompletionResult&)> on_done;
  // Constrained sampling (structured output, forced tool calls): each token is drawn among
  // those the constraint allows, and the request ends (stop) when it says nothing may follow.
  // A decode step with a constrained row reads the batch's logits back and samples every row
  // on the host (the same draws the device would make).
  std::shared_ptr<TokenConstraint> constraint;
};

struct BatchEngineOptions {
  int n_parallel = 4;          // sequences per decode step, 1..64
  int64_t n_ctx = 2048;        // tokens per sequence (prompt + generated)
  int64_t ubatch = 512;        // prompt tokens per prefill chunk
  size_t max_queue = 256;      // requests waiting for a sequence; more are refused
  int64_t n_vocab_sampled = 0; // > 0: ids at or above it are never sampled (padded output rows)
  uint64_t prompt_cache_bytes = 0;  // the prompt cache's budget (engine/prompt_cache.h); 0: off
  uint64_t prompt_cache_host_bytes = 0;  // its host tier's budget; 0: none
};

struct BatchEngineCounters {
  uint64_t requests_submitted = 0, requests_done = 0, requests_refused = 0;
  uint64_t requests_cancelled = 0, requests_failed = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;
  uint64_t decode_steps = 0, decode_rows = 0, prefill_chunks = 0;
  int64_t live_sequences = 0;  // requests holding a sequence now
  int64_t queued = 0;          // requests waiting for one
  int64_t slots_in_use = 0;    // states handed out (= live_sequences when idle between steps)
  int64_t n_parallel = 0;
  double busy_seconds = 0;     // the engine thread inside model calls
  double first_token_seconds_sum = 0;  // over requests that produced a token
  uint64_t first_token_count = 0;
  PromptCacheCounters prompt_cache;
};

class BatchEngine {
 public:
  // Allocates n_parallel states of n_ctx tokens (checked against the model's context limit
  // and the backend's memory first) and starts the engine thread.
  BatchEngine(Model& model, const BatchEngineOptions& options);
  ~BatchEngine();  // stop(), then joins
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Queues a request and returns its id. Throws invalid_argument for a request that can never
  // run (empty prompt, prompt + max_tokens beyond n_ctx, bad sampling values) and unavailable
  // when the queue is full or the engine stopped; nothing is called back then.
  uint64_t submit(CompletionRequest request);
  // Ends a queued or running request at the next step (reason cancelled). Unknown or finished
  // ids are ignored.
  void cancel(uint64_t id);
  // Refuses new requests, ends every queued and running one (cancelled), and waits until the
  // engine thread has finished the step in progress. Idempotent.
  void stop();

  // Called on the engine thread after every iteration that ran the model (never during a
  // model call): the moment to read state only that thread may touch, such as the
  // streamer's statistics. Set it before submitting requests.
  void set_step_observer(std::function<void()> observer);

  BatchEngineCounters counters() const;
  const BatchEngineOptions& options() const { return opt_; }

 private:
  struct Job;
  void loop();
  bool admit();                 // queued requests into free states; true when any
  void prefill_one();           // one prompt chunk of one sequence in prefill
  // Prompt caching between running prompts: job jumps ahead to what another running sequence
  // holds of its prompt; whether it had better wait for an older one that is prefilling the
  // tokens it needs next.
  void catch_up(Job& job);
  bool waits_for_another(Job& job);
  int64_t shared_prefix(Job& a, const Job& b);
  void decode_step();           // one token for every sequence in decode
  // Delivers `token` to a running job; false when the job ended by it (eos, length, stop).
  bool deliver(Job& job, int32_t token);
  // Samples the job's next token from its logits row (an error ends it when the row holds
  // NaN or inf) and delivers it.
  void sample_and_deliver(Job& job, std::span<const float> row);
  // The job's next token from its row (its constraint's mask applied, the token accepted by
  // it); -1 when the mask allows nothing (the job has ended with an error).
  int32_t draw(Job& job, std::span<const float> row);
  void count_decode_step(size_t rows);
  void reap();                  // ended jobs leave running_ (finish() gave their states back)
  void finish(Job& job, FinishReason reason, std::string error = {});

  Model& model_;
  BatchEngineOptions opt_;
  PromptCache cache_;  // the sequences' states (engine thread)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> queue_;   // under mu_
  std::vector<uint64_t> cancel_ids_;         // under mu_
  bool stopping_ = false;                    // under mu_
  BatchEngineCounters counters_;             // under mu_
  uint64_t next_id_ = 1;                     // under mu_

  std::vector<std::unique_ptr<Job>> running_;  // written by the engine thread under mu_
  std::function<void()> step_observer_;        // under mu_ to set; called on the engine thread
  size_t prefill_cursor_ = 0;                  // engine thread: round robin over prefills
  std::thread thread_;
};

}  // namespace sluice
