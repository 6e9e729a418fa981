// sluice perplexity: held-out perplexity of a text file (procedure in engine/perplexity.h).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "cli_common.h"
#include "cli_context.h"
#include "engine/perplexity.h"
#include "engine/routing_trace.h"

namespace sluice::cli {

void register_perplexity(CLI::App& app) {
  struct Options {
    ModelOptions model;
    std::string file, trace;
    int64_t n_ctx = 256;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("perplexity", "perplexity of a text file");
  add_model_options(*cmd, opt->model);
  cmd->add_option("--file", opt->file, "UTF-8 text file")->required();
  cmd->add_option("--trace-routing", opt->trace,
                  "write every routing decision as JSON lines (shared/traces format; one problem per window)");
  add_integer(*cmd, "--ctx", opt->n_ctx, IntRange::from(2, 1 << 20), "window size in tokens (default 256)");
  cmd->callback([opt] {
    expect_input_file(opt->file, "--file", "a UTF-8 text file");
    if (!opt->trace.empty()) expect_output_file(opt->trace, "--trace-routing", "a file for the routing trace");
    std::ifstream f(opt->file, std::ios::binary);
    SLUICE_CHECK(f.good(), Status::not_found, "cannot open --file ", opt->file);
    std::stringstream ss;
    ss << f.rdbuf();
    Session s = open_session(opt->model);
    check_window_context(s, opt->n_ctx);
    SLUICE_CHECK(s.model.tokenizer.has_value(), Status::invalid_argument, "perplexity needs a tokenizer.json in ",
                 s.model.dir.string());
    std::vector<int32_t> ids = s.model.tokenizer->encode(ss.str(), false);
    const bool tty = isatty(fileno(stderr));
    std::unique_ptr<RoutingTraceWriter> trace;
    if (!opt->trace.empty()) {
      trace = std::make_unique<RoutingTraceWriter>(opt->trace);
      s.model.model->set_routing_observer(trace->observer());
    }
    PerplexityResult r = perplexity(*s.model.model, ids, opt->n_ctx, [&](int64_t done, int64_t total) {
      if (trace) trace->set_problem(done);
      if (tty) std::fprintf(stderr, "\r%lld/%lld windows", static_cast<long long>(done), static_cast<long long>(total));
    });
    if (tty) std::fprintf(stderr, "\n");
    std::printf("perplexity %.4f (mean NLL %.5f nats over %lld tokens, %lld windows of %lld, %.1f tok/s)\n",
                r.perplexity, r.mean_nll, static_cast<long long>(r.n_scored), static_cast<long long>(r.n_windows),
                static_cast<long long>(opt->n_ctx), (r.n_scored + r.n_windows) / r.seconds);
    std::fflush(stdout);
    RunTokens tokens;
    tokens.prefill_tokens = r.n_scored + r.n_windows;
    tokens.prefill_seconds = r.seconds;
    if (std::optional<RunStats> rs = finish_streaming(opt->model, s, tokens))
      std::fprintf(stderr, "sluice: streaming: %s\n", rs->summary().c_str());
  });
}

}  // namespace sluice::cli
