// Generator: prompt in, tokens out, for one sequence. Prefill runs the prompt in chunks
// through the model's forward pass; decode then runs one token per step, sampling each next
// token from the last logits row. Before anything runs, the context is checked against the
// model's limit (max_position_embeddings); logits that are not finite (NaN weights, an
// overflow) stop the run with an error naming the step, never a sample drawn from them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "experts/stats.h"
#include "models/model.h"

namespace sluice {

struct GenerateOptions {
  int64_t n_predict = 32;           // tokens to generate at most
  SamplingParams sampling;
  std::optional<int32_t> eos_id;    // stop when sampled (not emitted); none: never stop early
  int64_t n_ctx = 0;                // 0: prompt + n_predict
  int64_t prefill_chunk = 256;      // prompt tokens per forward pass
  // > 0: ids at or above it are never sampled (logit set to -inf before the sampler sees it):
  // the padded rows of an output layer larger than the tokenizer (Qwen3: 151936 rows, 151669
  // tokens). 0: every id of the model's vocabulary may be sampled.
  int64_t n_vocab_sampled = 0;
  // When set (by a signal handler), generation stops at the next token boundary: between
  // prefill chunks or before the next decode step; GenerateStats::interrupted says so.
  const std::atomic<bool>* cancel = nullptr;
  // Called after each prefill chunk with the prompt tokens done and the prompt's length.
  std::function<void(int64_t done, int64_t total)> on_prefill;
  // --kl-check: kl_check_steps > 0 decode steps (spread as kl_check_selects says) also run
  // the exact step through kl_exact (an exact provider: a second streamer without --cut or
  // --miss-kind) against the same state, and KL(exact || lossy) goes into GenerateStats::kl.
  // Needs Model::decode_step_rerunnable().
  int64_t kl_check_steps = 0;
  std::shared_ptr<ExpertProvider> kl_exact;
  // Whether a decode step may be enqueued before the host has read the token of the step
  // before it (Model::forward_sample's next_draw53: the GPU does not wait for the host between
  // steps). false runs each step alone, after the one before returned: the same tokens, for
  // tests that need every step to start from a settled expert cache.
  bool steps_ahead = true;
};

struct GenerateStats {
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // from the first decode step to the last sampled token, less
                              // the exact passes of --kl-check (kl.seconds)
  bool interrupted = false;   // stopped early by GenerateOptions::cancel
  KlCheckStats kl;            // --kl-check (on when GenerateOptions::kl_check_steps > 0)
  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? n_prompt / prefill_seconds : 0; }
  double decode_tokens_per_second() const;
};

class Generator {
 public:
  explicit Generator(Model& model) : model_(model) {}
  // on_token(id) is called for every generated token; returning false stops generation.
  GenerateStats generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                         const std::function<bool(int32_t)>& on_token);

 private:
  // One decode step checked by --kl-check: the exact step, then the lossy one at the same
  // position; returns the token drawn from the lossy logits (as forward_sample would).
  int32_t checked_step(int32_t token, SequenceState& state, Sampler& sampler, int64_t n_sampled,
                       const GenerateOptions& opt, GenerateStats& st, int64_t step);

  Model& model_;
  std::vector<float> kl_exact_logits_, kl_lossy_logits_;  // [n_vocab] f32
};

}  // namespace sluice
