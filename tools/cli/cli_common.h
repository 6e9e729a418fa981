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
  std::string model;     // --model DIR
  int threads = 0;       // --threads N (0: all cores)
  std::string backend = "auto";  // --backend cpu|cuda|cuda:N|auto
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

}  // namespace sluice::cli
