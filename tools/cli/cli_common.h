// Pieces shared by the subcommands: token-list parsing, model loading with the common
// options, and the error wrapper that turns any failure into one line on stderr.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "models/load.h"

namespace sluice::cli {

struct ModelOptions {
  std::string model;             // --model DIR (HF checkpoint or pack)
  int threads = 0;                // --threads N (0: all cores)
  std::string backend = "auto";   // --backend cpu|cuda|cuda:N|auto
  std::string expert_kind;        // --expert-kind KIND (packs only; empty: the pack's default)
};

void add_model_options(CLI::App& cmd, ModelOptions& opt);

// "3,17,42" -> {3, 17, 42}; anything else is an invalid-argument error.
std::vector<int32_t> parse_token_list(const std::string& text);

// The prompt as token ids: --tokens, else --prompt encoded by the model's tokenizer.
std::vector<int32_t> prompt_tokens(const LoadedModel& m, const std::string& prompt, const std::string& tokens);

// Sets up the thread pool and loads the model on the CPU backend.
struct Session {
  std::unique_ptr<Backend> backend;
  LoadedModel model;
};
Session open_session(const ModelOptions& opt);

// Progress on stderr: a bar redrawn in place on a terminal (at most 10 times a second),
// plain lines otherwise (at most one every 10 s or 10% of the work).
class Progress {
 public:
  explicit Progress(std::string label);
  // counts: "12/96 records" style text (may be empty); bytes in GB with the rate and ETA.
  void update(const std::string& counts, uint64_t bytes_done, uint64_t bytes_total, double seconds);
  void finish();  // ends the bar's line

 private:
  std::string label_;
  bool tty_;
  double last_ = -1;
  int last_decile_ = -1;
  bool drawn_ = false;
};

}  // namespace sluice::cli
