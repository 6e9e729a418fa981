// sluice logits: one teacher-forced forward pass; writes float32 logits [n_tokens, vocab] as .npy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <string>

#include "cli_common.h"
#include "format/npy.h"

namespace sluice::cli {

void register_logits(CLI::App& app) {
  struct Options {
    ModelOptions model;
    PromptOptions prompt;
    std::string out;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("logits", "write the logits of one forward pass as .npy");
  add_model_options(*cmd, opt->model);
  add_prompt_options(*cmd, opt->prompt);
  cmd->add_option("--out", opt->out, "output file (.npy, float32 [n_tokens, vocab])")->required();
  cmd->callback([opt] {
    check_no_replay(opt->model, "logits");
    require_prompt(opt->prompt, "logits");
    expect_output_file(opt->out, "--out", "a file name for the .npy logits");
    Session s = open_session(opt->model);
    std::vector<int32_t> ids = prompt_tokens(s.model, opt->prompt);
    const int64_t n = static_cast<int64_t>(ids.size()), V = s.model.model->info().n_vocab;
    s.model.model->check_context(n, str("the prompt (", n, " tokens)"));
    auto state = s.model.model->new_state(n);
    std::vector<float> logits(n * V);
    const auto t0 = std::chrono::steady_clock::now();
    // In chunks of --ubatch tokens: activations stay bounded whatever the prompt's length.
    for (int64_t i = 0; i < n; i += opt->model.ubatch) {
      const int64_t m = std::min(opt->model.ubatch, n - i);
      s.model.model->forward(std::span<const int32_t>(ids).subspan(static_cast<size_t>(i), static_cast<size_t>(m)),
                             *state, std::span<float>(logits).subspan(static_cast<size_t>(i * V), static_cast<size_t>(m * V)),
                             true);
    }
    RunTokens tokens;
    tokens.prefill_tokens = n;
    tokens.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<int64_t> shape{n, V};
    write_npy(opt->out, logits.data(), shape);
    if (std::optional<RunStats> rs = finish_streaming(opt->model, s, tokens))
      std::fprintf(stderr, "sluice: streaming: %s\n", rs->summary().c_str());
  });
}

}  // namespace sluice::cli
