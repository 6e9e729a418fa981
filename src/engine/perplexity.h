// Perplexity of a model on a token sequence, by the procedure tools/train_demo.py documents:
// consecutive windows of n_ctx tokens (the last may be shorter, at least 2), each run from an
// empty context; every token but the first of a window is scored; perplexity = exp(mean NLL).
// PerplexityScorer takes the tokens as they come (a text read and encoded a piece at a time),
// so memory stays bounded whatever the text's length: one window of ids, the sequence state
// of n_ctx tokens, and the logits of one chunk of kPerplexityChunk tokens.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "models/model.h"

namespace sluice {

struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;      // nats per scored token
  int64_t n_scored = 0;     // tokens scored
  int64_t n_windows = 0;
  double seconds = 0;
  bool interrupted = false;  // stopped early by PerplexityScorer::cancel
};

// Tokens per forward pass of a window by default: its logits are [chunk, n_vocab] f32 (155 MB
// for a 151936-token vocabulary at 256), so a long window never holds all of its rows at once.
constexpr int64_t kPerplexityChunk = 256;

class PerplexityScorer {
 public:
  // n_ctx >= 2 and within the model's context limit (Model::check_context), else an error.
  // chunk: tokens per forward pass (--ubatch), >= 1.
  PerplexityScorer(Model& model, int64_t n_ctx, int64_t chunk = kPerplexityChunk);

  // Appends ids and scores every window they complete.
  void push(std::span<const int32_t> ids);
  // Scores the last, shorter window (when it holds at least 2 tokens) and returns the totals;
  // after an interrupt only the whole windows scored so far count.
  PerplexityResult finish();

  // Called after each window with the number of windows done.
  std::function<void(int64_t windows_done)> on_window;
  // When set (by a signal handler), scoring stops between chunks, push() returns at once and
  // finish() leaves the unfinished window out.
  const std::atomic<bool>* cancel = nullptr;
  bool interrupted() const { return interrupted_; }

 private:
  void score_window(std::span<const int32_t> ids);

  Model& model_;
  const int64_t n_ctx_;
  const int64_t chunk_;
  std::unique_ptr<SequenceState> state_;
  std::vector<int32_t> pending_;  // ids of the window being filled, fewer than n_ctx
  std::vector<float> logits_;     // [chunk, n_vocab]
  double nll_ = 0;
  PerplexityResult r_;
  bool interrupted_ = false;
  std::chrono::steady_clock::time_point t0_;
};

// The whole sequence at once; progress(windows_done, windows_total) after each window, if given.
PerplexityResult perplexity(Model& model, std::span<const int32_t> ids, int64_t n_ctx,
                            const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace sluice
