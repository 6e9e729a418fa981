// sluice perplexity: held-out perplexity of a text file (procedure in engine/perplexity.h).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli_common.h"
#include "cli_context.h"
#include "cli_output.h"
#include "engine/perplexity.h"
#include "engine/routing_trace.h"
#include "format/text_pieces.h"

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
                  "write every routing decision as JSON lines (the routing-trace format, docs/trace-format.md; one problem per window)");
  add_integer(*cmd, "--ctx", opt->n_ctx, IntRange::from(2, 1 << 20), "window size in tokens (default 256)");
  cmd->callback([opt] {
    check_no_replay(opt->model, "perplexity");
    expect_input_file(opt->file, "--file", "a UTF-8 text file");
    if (!opt->trace.empty()) expect_output_file(opt->trace, "--trace-routing", "a file for the routing trace");
    TextPieceReader text(opt->file);  // a missing file fails before the model loads
    Session s = open_session(opt->model);
    check_window_context(s, opt->n_ctx);
    SLUICE_CHECK(s.model.tokenizer.has_value(), Status::invalid_argument, "perplexity needs a tokenizer.json in ",
                 s.model.dir.string());
    PerplexityScorer scorer(*s.model.model, opt->n_ctx, opt->model.ubatch);  // checks --ctx against the model's limit
    const bool tty = isatty(fileno(stderr));
    std::unique_ptr<RoutingTraceWriter> trace;
    if (!opt->trace.empty()) {
      trace = std::make_unique<RoutingTraceWriter>(opt->trace);
      // With lookahead on, each record also carries the next layer's predicted experts.
      s.model.model->set_routing_observer(trace->observer(), opt->model.lookahead == "on");
    }
    InterruptFlag interrupt;  // Ctrl-C: stop between chunks, report the whole windows scored
    scorer.cancel = interrupt.flag();
    scorer.on_window = [&](int64_t done) {
      if (trace) trace->set_problem(done);
      if (!tty) return;
      const std::string of = text.size() ? str(" of ", *text.size() / 1e6, " MB") : "";
      std::fprintf(stderr, "\r%lld windows, %.1f MB read%s\x1b[K", static_cast<long long>(done),
                   text.bytes_read() / 1e6, of.c_str());
    };
    // The file a piece at a time: memory stays bounded whatever its size (even /dev/zero).
    std::string piece;
    while (!interrupt.flag()->load() && text.next(piece)) {
      std::vector<int32_t> ids;
      try {
        ids = s.model.tokenizer->encode(piece, false);
      } catch (const Error& e) {
        fail(e.status(), opt->file, " (the piece from byte ", text.piece_offset(), "): ", e.what());
      }
      scorer.push(ids);
    }
    const PerplexityResult r = scorer.finish();
    if (tty) std::fprintf(stderr, "\n");
    s.model.model->set_routing_observer(nullptr);
    if (trace) trace->close();
    if (r.n_scored > 0) {
      std::printf("perplexity %.4f (mean NLL %.5f nats over %lld tokens, %lld windows of %lld, %.1f tok/s)\n",
                  r.perplexity, r.mean_nll, static_cast<long long>(r.n_scored), static_cast<long long>(r.n_windows),
                  static_cast<long long>(opt->n_ctx), (r.n_scored + r.n_windows) / r.seconds);
    }
    stdout_flush();
    RunTokens tokens;
    tokens.prefill_tokens = r.n_scored + r.n_windows;
    tokens.prefill_seconds = r.seconds;
    if (std::optional<RunStats> rs = finish_streaming(opt->model, s, tokens))
      std::fprintf(stderr, "sluice: streaming: %s\n", rs->summary().c_str());
    if (r.interrupted) exit_interrupted(str("perplexity of the ", r.n_windows, " whole windows read before the signal"));
  });
}

}  // namespace sluice::cli
