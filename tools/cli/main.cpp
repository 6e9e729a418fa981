// sluice: command-line front end. Each subcommand lives in its own cmd_*.cpp; this file
// dispatches and turns every failure into one line on stderr and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli_args.h"
#include "core/error.h"
#include "core/log.h"
#include "core/switches.h"

namespace sluice::cli {
void register_run(CLI::App& app);
void register_logits(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_simulate(CLI::App& app);
void register_convert(CLI::App& app);
void register_verify(CLI::App& app);
void register_synth(CLI::App& app);
void register_serve(CLI::App& app);
void register_bench(CLI::App& app);
void register_tokenize(CLI::App& app);
}  // namespace sluice::cli

int main(int argc, char** argv) {
  CLI::App app{"sluice: Mixture-of-Experts inference that streams experts from SSD"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags (-v) may also follow the subcommand
  app.add_flag_function(
      "-v,--verbose",
      [](int64_t count) { sluice::log_set_level(count >= 2 ? sluice::LogLevel::debug : sluice::LogLevel::info); },
      "more log output (-v info, -vv debug)");
  app.set_version_flag("--version", "sluice 0.1.0");
  sluice::cli::register_run(app);
  sluice::cli::register_logits(app);
  sluice::cli::register_perplexity(app);
  sluice::cli::register_simulate(app);
  sluice::cli::register_convert(app);
  sluice::cli::register_verify(app);
  sluice::cli::register_synth(app);
  sluice::cli::register_serve(app);
  sluice::cli::register_bench(app);
  sluice::cli::register_tokenize(app);
  // llama-bench spells one option "-gp"; CLI11 takes single-letter short names only, so the
  // word is given its long form before parsing (`sluice bench -gp 512,128`).
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) args.push_back(std::strcmp(argv[i], "-gp") == 0 ? "--gp" : argv[i]);
  try {
    sluice::switches::load();  // an invalid SLUICE_* value is the first error (docs/configuration.md)
    app.parse(args);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {  // a run that ends early on purpose (Ctrl-C: 130), already reported
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {  // a usage error: one line, like every other error
    const std::vector<std::string> args(argv + 1, argv + argc);
    std::fprintf(stderr, "sluice: error: %s\n", sluice::cli::parse_error_text(app, e, args).c_str());
    return 1;
  } catch (const sluice::Error& e) {
    std::fprintf(stderr, "sluice: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "sluice: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluice: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
